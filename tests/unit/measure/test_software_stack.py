"""The software stack: fake maps, environments, drivers, containers and a fake sinfo; real libraries; this machine."""

import ctypes.util
import hashlib
import json
import subprocess
import sys
import textwrap
import types

import pytest

from mlcampaign.measure import software_stack as stack

from conftest import REPO

CRAY_MAPS = textwrap.dedent(
    """\
    55e9a024f000-55e9a0251000 r--p 00000000 fe:00 260386                     /usr/bin/python3.11
    7f0000000000-7f0000001000 r-xp 00000000 fe:00 1001   /opt/cray/pe/mpich/8.1.27/ofi/gnu/lib/libmpi_gnu_123.so.12
    7f0000001000-7f0000002000 r--p 00001000 fe:00 1001   /opt/cray/pe/mpich/8.1.27/ofi/gnu/lib/libmpi_gnu_123.so.12
    7f0000003000-7f0000004000 r-xp 00000000 fe:00 1002   /opt/cray/libfabric/1.15.2.0/lib64/libfabric.so.1
    7f0000005000-7f0000006000 r-xp 00000000 fe:00 1003   /usr/lib64/libmpi_cxx.so.40 (deleted)
    7f0000007000-7f0000008000 rw-p 00000000 00:00 0      [heap]
    """
)


def leaves(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from leaves(item)
    else:
        yield value


def test_mapped_libraries_are_listed_once_in_order():
    assert stack.mapped_libraries(CRAY_MAPS) == [
        "/opt/cray/pe/mpich/8.1.27/ofi/gnu/lib/libmpi_gnu_123.so.12",
        "/opt/cray/libfabric/1.15.2.0/lib64/libfabric.so.1",
        "/usr/lib64/libmpi_cxx.so.40",
    ]


def test_the_mpi_library_comes_from_the_maps_and_a_bindings_library_is_not_it():
    libraries = stack.loaded_libraries(CRAY_MAPS)
    mpi = libraries["mpi"]
    assert mpi["library"] == "/opt/cray/pe/mpich/8.1.27/ofi/gnu/lib/libmpi_gnu_123.so.12"
    # The path is not loaded in this process: RTLD_NOLOAD refuses it rather than loading it.
    assert mpi["version"].startswith("not available: ") and "is mapped but its version call failed" in mpi["version"]
    assert libraries["libfabric"]["library"] == "/opt/cray/libfabric/1.15.2.0/lib64/libfabric.so.1"
    assert libraries["cudnn"] == {
        "library": "not available: no cuDNN loaded in this process",
        "version": "not available: no cuDNN loaded in this process",
    }


def test_no_mpi_loaded_says_so():
    maps = "7f0000000000-7f0000001000 r-xp 00000000 fe:00 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    assert stack.loaded_libraries(maps)["mpi"]["version"] == "not available: no MPI library loaded in this process"


def test_a_real_mpi_library_reports_its_own_version():
    name = ctypes.util.find_library("mpich") or ctypes.util.find_library("mpi")
    if name is None:
        pytest.skip("no MPI library on this machine (e.g. apt-get install libmpich12)")
    # In a child, so the MPI library is not left loaded in the test process.
    code = (
        "import ctypes, json; "
        f"ctypes.CDLL({name!r}, mode=ctypes.RTLD_GLOBAL); "
        "from mlcampaign.measure.software_stack import loaded_libraries; "
        "print(json.dumps(loaded_libraries()['mpi']))"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    mpi = json.loads(child.stdout)
    assert name.split(".so")[0] in mpi["library"]
    assert mpi["version"].endswith("(MPI_Get_library_version)") and "MPI" in mpi["version"]


def test_torch_libraries_report_what_torch_was_built_with():
    torch = pytest.importorskip("torch")
    if torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} is a CPU build: no CUDA libraries to load")
    built = stack.torch_build()
    libraries = stack.loaded_libraries()
    assert built["version"] == torch.__version__ and built["cuda"] == torch.version.cuda
    assert libraries["cuda_runtime"]["version"].startswith(torch.version.cuda + " ")
    if torch.backends.cudnn.version():
        assert f"(cudnnGetVersion {torch.backends.cudnn.version()})" in libraries["cudnn"]["version"]
        assert built["cudnn_or_miopen"] == f"cuDNN {torch.backends.cudnn.version()} (torch.backends.cudnn.version())"
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    assert libraries["nccl"]["version"].startswith(nccl + " ") and built["nccl_or_rccl"].startswith(f"NCCL {nccl} ")


def test_torch_is_read_only_where_it_is_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    built = stack.torch_build()
    assert set(built) == {"version", "cuda", "hip", "cudnn_or_miopen", "nccl_or_rccl"}
    assert all(value.startswith("not available: torch is not imported") for value in built.values())
    assert "torch" not in sys.modules


def test_software_stack_does_not_import_torch():
    code = (
        "import sys; from mlcampaign.measure.software_stack import software_stack as s; s(); "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert result.stdout.strip() == "False"


def test_a_rocm_torch_build_names_miopen_and_rccl(monkeypatch):
    fake = types.SimpleNamespace(
        __version__="2.5.1+rocm6.2",
        version=types.SimpleNamespace(cuda=None, hip="6.2.41133"),
        backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(version=lambda: 3002000)),
        cuda=types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 20, 5))),
    )
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert stack.torch_build() == {
        "version": "2.5.1+rocm6.2",
        "cuda": "not available: torch 2.5.1+rocm6.2 was built without CUDA",
        "hip": "6.2.41133",
        "cudnn_or_miopen": "MIOpen 3002000 (torch.backends.cudnn.version())",
        "nccl_or_rccl": "RCCL 2.20.5 (torch.cuda.nccl.version())",
    }


def test_a_cpu_torch_build_says_what_it_lacks(monkeypatch):
    def no_nccl():
        raise AttributeError("module 'torch._C' has no attribute '_nccl_version'")

    fake = types.SimpleNamespace(
        __version__="2.14.1+cpu",
        version=types.SimpleNamespace(cuda=None, hip=None),
        backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(version=lambda: None)),
        cuda=types.SimpleNamespace(nccl=types.SimpleNamespace(version=no_nccl)),
    )
    monkeypatch.setitem(sys.modules, "torch", fake)
    built = stack.torch_build()
    assert built["cuda"] == "not available: torch 2.14.1+cpu was built without CUDA"
    assert built["cudnn_or_miopen"].startswith("not available: torch 2.14.1+cpu has no cuDNN/MIOpen")
    assert built["nccl_or_rccl"].startswith("not available: torch 2.14.1+cpu has no NCCL/RCCL")


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023",
            "NVIDIA 535.104.05",
        ),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build", "NVIDIA 550.54.15"),
    ],
)
def test_the_nvidia_driver_version_comes_from_its_proc_file(tmp_path, line, expected):
    (tmp_path / "driver" / "nvidia").mkdir(parents=True)
    (tmp_path / "driver" / "nvidia" / "version").write_text(line + "\nGCC version:  gcc version 12.2.0\n")
    assert stack.gpu_driver(tmp_path, tmp_path / "sys_module") == expected


def test_the_amdgpu_driver_version_and_no_driver(tmp_path):
    assert stack.gpu_driver(tmp_path, tmp_path).startswith("not available: no NVIDIA or AMD GPU kernel driver loaded")
    (tmp_path / "amdgpu").mkdir()
    assert stack.gpu_driver(tmp_path, tmp_path).startswith("AMD amdgpu (in-tree, no version file")
    (tmp_path / "amdgpu" / "version").write_text("6.8.5\n")
    assert stack.gpu_driver(tmp_path, tmp_path) == "AMD amdgpu 6.8.5"


def fake_executable(directory, name, script):
    path = directory / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


def test_slurm_version_from_a_fake_sinfo(tmp_path):
    fake_executable(tmp_path, "sinfo", 'echo "slurm 22.05.8"')
    assert stack.slurm_version({"PATH": str(tmp_path)}) == "slurm 22.05.8 (sinfo --version)"


def test_srun_answers_where_there_is_no_sinfo(tmp_path):
    fake_executable(tmp_path, "srun", 'echo "slurm 23.11.4"')
    assert stack.slurm_version({"PATH": str(tmp_path)}) == "slurm 23.11.4 (srun --version)"


def test_a_hanging_sinfo_times_out(tmp_path, monkeypatch):
    fake_executable(tmp_path, "sinfo", "sleep 30")
    monkeypatch.setattr(stack, "SLURM_TIMEOUT_S", 0.3)
    assert stack.slurm_version({"PATH": str(tmp_path)}) == "not available: sinfo --version did not answer within 0.3 s"


def test_no_slurm_tools_with_and_without_slurm_variables(tmp_path):
    assert "no Slurm here" in stack.slurm_version({"PATH": str(tmp_path)})
    reason = stack.slurm_version({"PATH": str(tmp_path), "SLURM_JOB_ID": "42"})
    assert reason.startswith("not available: no sinfo or srun on PATH") and "SLURM_JOB_ID" in reason


def test_lmod_modules():
    environ = {
        "LMOD_VERSION": "8.7.32",
        "LOADEDMODULES": "PrgEnv-gnu/8.3.3:cray-mpich/8.1.27:",
        "_LMFILES_": "/opt/modulefiles/PrgEnv-gnu/8.3.3:/opt/modulefiles/cray-mpich/8.1.27",
    }
    assert stack.environment_modules(environ) == {
        "tool": "Lmod 8.7.32",
        "loaded": ["PrgEnv-gnu/8.3.3", "cray-mpich/8.1.27"],
        "files": ["/opt/modulefiles/PrgEnv-gnu/8.3.3", "/opt/modulefiles/cray-mpich/8.1.27"],
    }


def test_no_module_system():
    modules = stack.environment_modules({})
    assert all(value.startswith("not available: ") for value in modules.values())
    assert stack.environment_modules({"MODULESHOME": "/usr/share/modules", "LOADEDMODULES": ""}) == {
        "tool": "Environment Modules (/usr/share/modules)",
        "loaded": [],
        "files": "not available: _LMFILES_ unset",
    }


def test_an_apptainer_image_is_hashed_only_when_asked(tmp_path):
    image = tmp_path / "pytorch.sif"
    image.write_bytes(b"SIF image bytes" * 1000)
    environ = {"APPTAINER_CONTAINER": str(image), "APPTAINER_NAME": "pytorch.sif"}
    unhashed = stack.container(environ, tmp_path)
    assert unhashed["runtime"] == "apptainer" and unhashed["image"] == f"{image} (name pytorch.sif)"
    assert unhashed["digest"].startswith("not available: not hashed here (15000 bytes")
    hashed = stack.container(environ, tmp_path, hash_container_image=True)
    assert hashed["digest"] == "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()


def test_an_image_file_invisible_inside_the_container(tmp_path):
    environ = {"SINGULARITY_CONTAINER": "/home/user/images/tf.sif"}
    found = stack.container(environ, tmp_path, hash_container_image=True)
    assert found["runtime"] == "singularity"
    assert found["digest"] == "not available: /home/user/images/tf.sif is not a readable file from inside the container"


def test_an_image_named_by_the_kubernetes_executor(tmp_path):
    pinned = "ghcr.io/epcc/mlcampaign@sha256:" + "ab" * 32
    environ = {stack.CONTAINER_IMAGE_VARIABLE: pinned, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert stack.container(environ, tmp_path) == {
        "runtime": "kubernetes (MLCAMPAIGN_CONTAINER_IMAGE)",
        "image": pinned,
        "digest": "sha256:" + "ab" * 32,
    }
    tagged = stack.container({stack.CONTAINER_IMAGE_VARIABLE: "ghcr.io/epcc/mlcampaign:2026.1"}, tmp_path)
    assert tagged["digest"].startswith("not available: MLCAMPAIGN_CONTAINER_IMAGE names a tag")


def test_podman_docker_and_no_container(tmp_path):
    assert stack.container({}, tmp_path)["runtime"].startswith("not available: no container seen")
    (tmp_path / ".dockerenv").touch()
    docker = stack.container({}, tmp_path)
    assert docker["runtime"] == "docker (/.dockerenv exists)" and docker["image"].startswith("not available: ")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").write_text('engine="podman-4.9.3"\nimage="quay.io/x/y:1"\nimageid="0123abc"\n')
    assert stack.container({}, tmp_path) == {
        "runtime": "podman (/run/.containerenv)",
        "image": "quay.io/x/y:1",
        "digest": "image id 0123abc",
    }


def test_the_package_list_and_its_hash():
    packages = stack.python_packages()
    assert f"pytest=={pytest.__version__}" in packages
    assert packages == sorted(packages, key=str.lower) and len(set(packages)) == len(packages)
    assert all("==" in package for package in packages)
    digest = stack.packages_sha256(packages)
    assert digest == hashlib.sha256("\n".join(packages).encode()).hexdigest()
    assert stack.packages_sha256([*packages, "extra==1.0"]) != digest


def test_this_machine():
    found = stack.software_stack()
    json.dumps(found)
    assert set(found) == {
        "kernel",
        "os",
        "python",
        "gpu_driver",
        "torch",
        "libraries",
        "slurm",
        "environment_modules",
        "container",
        "python_packages_count",
        "python_packages_sha256",
    }
    for value in leaves(found):
        assert isinstance(value, str | int | list) and value != "" and value is not None
    assert found["python_packages_count"] == len(stack.python_packages())
    assert set(found["libraries"]) == set(stack.LIBRARIES)
