"""The software stack a trial ran on: what a system upgrade changes between two runs of the same campaign.

One call, ``software_stack()``, returns a JSON-serialisable dict whose every leaf is a value or the text
``"not available: <why>"``:

- ``kernel``, ``os``, ``python``: ``platform.release()``, ``/etc/os-release`` PRETTY_NAME, the interpreter.
- ``gpu_driver``: the kernel driver's own version file (``/proc/driver/nvidia/version``,
  ``/sys/module/amdgpu/version``); no GPU library is loaded to read it.
- ``torch``: the versions torch was built with (``torch.version.cuda`` / ``.hip``,
  ``torch.backends.cudnn.version()`` — MIOpen on ROCm builds —, ``torch.cuda.nccl.version()``), read only
  when torch is already in ``sys.modules``: this module never imports torch (1 s and a CUDA-capable
  library load), so a caller that has not trained gets a reason, not a side effect.
- ``libraries``: the GPU, communication and MPI libraries *this process has loaded*, found in
  ``/proc/self/maps``, each with the version the library itself reports (``cudaRuntimeGetVersion``,
  ``cudnnGetVersion``, ``ncclGetVersion``, ``MPI_Get_library_version`` — callable before ``MPI_Init`` since
  MPI-3 —, ``fi_version``, ...). The library is reopened with ``RTLD_NOLOAD``, which only hands back a
  library already in the process, so reading never loads one (nor initialises MPI, which importing
  ``mpi4py.MPI`` would). No MPI loaded means "not available: no MPI library loaded in this process",
  never a guess from the environment.
- ``slurm``: ``sinfo --version`` (else ``srun --version``), a 3 s timeout.
- ``environment_modules``: ``LOADEDMODULES`` and ``_LMFILES_`` (Lmod and Environment Modules both set
  them), the tool from ``LMOD_VERSION`` / ``MODULESHOME``.
- ``container``: Apptainer/Singularity (``APPTAINER_CONTAINER`` / ``SINGULARITY_CONTAINER`` and
  ``APPTAINER_NAME``; the image's sha256 only with ``hash_container_image=True``, since a SIF of gigabytes
  takes seconds: once per run, not per trial); an image named by the executor in
  ``MLCAMPAIGN_CONTAINER_IMAGE`` (Kubernetes: the pod's image, set by the executor plugin; its digest
  when the reference is pinned ``name@sha256:...``); podman's ``/run/.containerenv``; Docker's
  ``/.dockerenv`` (which names no image).
- ``python_packages_sha256`` / ``python_packages_count``: the hash of ``python_packages()``, the sorted
  ``name==version`` list of every installed distribution (``importlib.metadata``): the list is stored
  once per run, its hash per trial, so a changed environment shows as a changed hash.

Cost: about 0.15 s (the package list dominates), no subprocess without a timeout.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

CONTAINER_IMAGE_VARIABLE = "MLCAMPAIGN_CONTAINER_IMAGE"
SLURM_TIMEOUT_S = 3.0
PROC_SELF_MAPS = Path("/proc/self/maps")


def not_available(why: str) -> str:
    return f"not available: {why}"


# ---------------------------------------------------------------- libraries loaded in this process


def mapped_libraries(maps_text: str | None = None) -> list[str]:
    """Paths of the shared libraries mapped into this process, in first-mapped order."""
    if maps_text is None:
        maps_text = PROC_SELF_MAPS.read_text()
    paths = {}
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and ".so" in fields[5]:
            paths.setdefault(fields[5].strip().removesuffix(" (deleted)"), None)
    return list(paths)


def _int_out(handle: ctypes.CDLL, symbol: str) -> int:
    """``int symbol(int *out)`` returning 0 on success (the CUDA, NCCL and HIP version calls)."""
    function = getattr(handle, symbol)
    function.restype, function.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]
    value = ctypes.c_int()
    status = function(ctypes.byref(value))
    if status != 0:
        raise OSError(f"{symbol} returned status {status}")
    return value.value


def _cuda_version(symbol: str) -> Callable[[ctypes.CDLL], str]:
    def read(handle: ctypes.CDLL) -> str:
        # CUDA encodes versions as 1000 * major + 10 * minor.
        value = _int_out(handle, symbol)
        return f"{value // 1000}.{value % 1000 // 10} ({symbol} {value})"

    return read


def _cudnn_version(handle: ctypes.CDLL) -> str:
    handle.cudnnGetVersion.restype, handle.cudnnGetVersion.argtypes = ctypes.c_size_t, []
    value = handle.cudnnGetVersion()
    # cuDNN 9 encodes 10000 * major + 100 * minor + patch, cuDNN 8 and older 1000 * major + 100 * minor + patch.
    major, rest = divmod(value, 10000) if value >= 90000 else divmod(value, 1000)
    return f"{major}.{rest // 100}.{rest % 100} (cudnnGetVersion {value})"


def _nccl_version(handle: ctypes.CDLL) -> str:
    value = _int_out(handle, "ncclGetVersion")
    # NCCL (and RCCL) from 2.9 encode 10000 * major + 100 * minor + patch, before it 1000 * major + 100 * minor + patch.
    major, rest = divmod(value, 10000) if value >= 20900 else divmod(value, 1000)
    return f"{major}.{rest // 100}.{rest % 100} (ncclGetVersion {value})"


def _hip_version(handle: ctypes.CDLL) -> str:
    value = _int_out(handle, "hipRuntimeGetVersion")
    # HIP_VERSION = 10000000 * major + 100000 * minor + patch.
    return f"{value // 10_000_000}.{value // 100_000 % 100}.{value % 100_000} (hipRuntimeGetVersion {value})"


def _miopen_version(handle: ctypes.CDLL) -> str:
    parts = [ctypes.c_size_t() for _ in range(3)]
    handle.miopenGetVersion.restype = ctypes.c_int
    handle.miopenGetVersion.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 3
    status = handle.miopenGetVersion(*(ctypes.byref(part) for part in parts))
    if status != 0:
        raise OSError(f"miopenGetVersion returned status {status}")
    return ".".join(str(part.value) for part in parts) + " (miopenGetVersion)"


def _mpi_library_version(handle: ctypes.CDLL) -> str:
    # MPICH's MPI_MAX_LIBRARY_VERSION_STRING is 8192, Open MPI's 256: the larger buffer fits both.
    buffer, length = ctypes.create_string_buffer(8192), ctypes.c_int()
    function = handle.MPI_Get_library_version
    function.restype, function.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
    status = function(buffer, ctypes.byref(length))
    if status != 0:
        raise OSError(f"MPI_Get_library_version returned {status}")
    return " ".join(buffer.value[: length.value].decode(errors="replace").split()) + " (MPI_Get_library_version)"


def _libfabric_version(handle: ctypes.CDLL) -> str:
    handle.fi_version.restype, handle.fi_version.argtypes = ctypes.c_uint32, []
    value = handle.fi_version()  # FI_VERSION(major, minor) = major << 16 | minor
    return f"{value >> 16}.{value & 0xFFFF} (fi_version)"


def _ucx_version(handle: ctypes.CDLL) -> str:
    handle.ucp_get_version_string.restype, handle.ucp_get_version_string.argtypes = ctypes.c_char_p, []
    return handle.ucp_get_version_string().decode() + " (ucp_get_version_string)"


# Component -> (basename pattern, version reader). MPI: Open MPI / Intel MPI ``libmpi.so``, MPICH
# ``libmpich.so``, Cray MPICH ``libmpi_cray.so`` / ``libmpi_gnu_123.so``; the language bindings
# (libmpi_cxx, libmpi_mpifh, libmpifort) are not the library.
LIBRARIES: dict[str, tuple[re.Pattern, Callable[[ctypes.CDLL], str]]] = {
    "cuda_driver": (re.compile(r"^libcuda\.so"), _cuda_version("cuDriverGetVersion")),
    "cuda_runtime": (re.compile(r"^libcudart\.so"), _cuda_version("cudaRuntimeGetVersion")),
    "cudnn": (re.compile(r"^libcudnn\.so"), _cudnn_version),
    "nccl": (re.compile(r"^libnccl\.so"), _nccl_version),
    "hip_runtime": (re.compile(r"^libamdhip64\.so"), _hip_version),
    "miopen": (re.compile(r"^libMIOpen\.so"), _miopen_version),
    "rccl": (re.compile(r"^librccl\.so"), _nccl_version),
    "mpi": (
        re.compile(r"^lib(mpich|mpi)(_(cray|gnu|intel|nvidia|amd|aocc|crayclang)(_\d+)?)?\.so"),
        _mpi_library_version,
    ),
    "libfabric": (re.compile(r"^libfabric\.so"), _libfabric_version),
    "ucx": (re.compile(r"^libucp\.so"), _ucx_version),
}

_WHAT = {
    "cuda_driver": "CUDA driver library (libcuda)",
    "cuda_runtime": "CUDA runtime (libcudart)",
    "cudnn": "cuDNN",
    "nccl": "NCCL",
    "hip_runtime": "HIP runtime (libamdhip64)",
    "miopen": "MIOpen",
    "rccl": "RCCL",
    "mpi": "MPI library",
    "libfabric": "libfabric",
    "ucx": "UCX (libucp)",
}


def _reopen_loaded(path: str) -> ctypes.CDLL:
    """A handle to ``path`` only if it is already loaded: RTLD_NOLOAD never loads a library."""
    return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)


def loaded_libraries(maps_text: str | None = None) -> dict[str, dict[str, str]]:
    """``{component: {"library": path(s), "version": what the library reports}}`` for ``LIBRARIES``."""
    mapped = mapped_libraries(maps_text)
    result = {}
    for component, (pattern, read_version) in LIBRARIES.items():
        paths = [path for path in mapped if pattern.match(os.path.basename(path))]
        if not paths:
            reason = not_available(f"no {_WHAT[component]} loaded in this process")
            result[component] = {"library": reason, "version": reason}
            continue
        try:
            version = read_version(_reopen_loaded(paths[0]))
        except (OSError, AttributeError) as error:
            version = not_available(f"{paths[0]} is mapped but its version call failed: {error}")
        result[component] = {"library": ", ".join(paths), "version": version}
    return result


# ---------------------------------------------------------------- torch, drivers, scheduler, modules, containers


def torch_build() -> dict[str, str]:
    """What torch was built with, if this process has imported torch (it is never imported here)."""
    fields = ("version", "cuda", "hip", "cudnn_or_miopen", "nccl_or_rccl")
    torch = sys.modules.get("torch")
    if torch is None:
        reason = not_available("torch is not imported in this process (read it in a process that trained)")
        return dict.fromkeys(fields, reason)
    version = torch.__version__
    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    try:
        cudnn = torch.backends.cudnn.version()
    except (AttributeError, RuntimeError) as error:
        cudnn = not_available(f"torch.backends.cudnn.version() failed: {error}")
    if cudnn is None:
        cudnn = not_available(f"torch {version} has no cuDNN/MIOpen (torch.backends.cudnn.version() is None)")
    elif isinstance(cudnn, int):
        cudnn = f"{'MIOpen' if hip else 'cuDNN'} {cudnn} (torch.backends.cudnn.version())"
    try:
        nccl = torch.cuda.nccl.version()
        nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        nccl = f"{'RCCL' if hip else 'NCCL'} {nccl} (torch.cuda.nccl.version())"
    except (AttributeError, RuntimeError) as error:
        nccl = not_available(f"torch {version} has no NCCL/RCCL: {error}")
    return {
        "version": version,
        "cuda": cuda or not_available(f"torch {version} was built without CUDA"),
        "hip": hip or not_available(f"torch {version} was built without ROCm/HIP"),
        "cudnn_or_miopen": cudnn,
        "nccl_or_rccl": nccl,
    }


def gpu_driver(proc: Path = Path("/proc"), sys_module: Path = Path("/sys/module")) -> str:
    """The loaded GPU kernel driver's version, from its own version file."""
    drivers = []
    try:
        line = (proc / "driver" / "nvidia" / "version").read_text().splitlines()[0]
        match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d[\w.-]*)", line)
        drivers.append(f"NVIDIA {match.group(1)}" if match else f"NVIDIA ({line.strip()})")
    except (OSError, IndexError):
        pass
    if (sys_module / "amdgpu").is_dir():
        try:
            drivers.append(f"AMD amdgpu {(sys_module / 'amdgpu' / 'version').read_text().strip()}")
        except OSError:
            drivers.append(f"AMD amdgpu (in-tree, no version file: kernel {platform.release()})")
    return "; ".join(drivers) or not_available(
        f"no NVIDIA or AMD GPU kernel driver loaded ({proc}/driver/nvidia/version and {sys_module}/amdgpu absent)"
    )


def slurm_version(environ: Mapping[str, str]) -> str:
    """``sinfo --version`` (else ``srun --version``); no controller is contacted."""
    for command in ("sinfo", "srun"):
        executable = shutil.which(command, path=environ.get("PATH"))
        if executable is None:
            continue
        try:
            result = subprocess.run(
                [executable, "--version"], capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, check=True
            )
        except subprocess.TimeoutExpired:
            return not_available(f"{command} --version did not answer within {SLURM_TIMEOUT_S:g} s")
        except (OSError, subprocess.CalledProcessError) as error:
            return not_available(f"{command} --version failed: {error}")
        return f"{result.stdout.strip()} ({command} --version)"
    slurm_variables = sorted(name for name in environ if name.startswith("SLURM_"))
    if slurm_variables:
        return not_available(f"no sinfo or srun on PATH, although {slurm_variables[0]} and others are set")
    return not_available("no Slurm here (no sinfo or srun on PATH, no SLURM_* variables)")


def environment_modules(environ: Mapping[str, str]) -> dict[str, str | list[str]]:
    """The module tool and the loaded modules (names and files), as the shell's environment has them."""
    if "LMOD_VERSION" in environ:
        tool = f"Lmod {environ['LMOD_VERSION']}"
    elif "MODULESHOME" in environ:
        tool = f"Environment Modules ({environ['MODULESHOME']})"
    else:
        tool = not_available("no module system in the environment (LMOD_VERSION and MODULESHOME unset)")

    def listed(variable: str) -> str | list[str]:
        if variable not in environ:
            return not_available(f"{variable} unset")
        return [entry for entry in environ[variable].split(":") if entry]

    return {"tool": tool, "loaded": listed("LOADEDMODULES"), "files": listed("_LMFILES_")}


def file_sha256(path: Path, chunk_bytes: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(chunk_bytes):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _apptainer_image(environ: Mapping[str, str], hash_container_image: bool) -> dict[str, str]:
    runtime = "apptainer" if "APPTAINER_CONTAINER" in environ else "singularity"
    image_path = environ.get("APPTAINER_CONTAINER") or environ["SINGULARITY_CONTAINER"]
    name = environ.get("APPTAINER_NAME") or environ.get("SINGULARITY_NAME")
    image = f"{image_path} (name {name})" if name else image_path
    path = Path(image_path)
    if not path.is_file() or not os.access(path, os.R_OK):
        digest = not_available(f"{image_path} is not a readable file from inside the container")
    elif hash_container_image:
        digest = file_sha256(path)
    else:
        digest = not_available(
            f"not hashed here ({path.stat().st_size} bytes: seconds of reading); "
            "software_stack(hash_container_image=True) hashes it once per run"
        )
    return {"runtime": runtime, "image": image, "digest": digest}


def container(environ: Mapping[str, str], root: Path = Path("/"), hash_container_image: bool = False) -> dict[str, str]:
    """The container this process runs in: runtime, image and digest (or why each is unknown)."""
    if "APPTAINER_CONTAINER" in environ or "SINGULARITY_CONTAINER" in environ:
        return _apptainer_image(environ, hash_container_image)
    if environ.get(CONTAINER_IMAGE_VARIABLE):
        image = environ[CONTAINER_IMAGE_VARIABLE]
        _, pinned, digest = image.partition("@sha256:")
        runtime = "kubernetes" if "KUBERNETES_SERVICE_HOST" in environ else "named by the executor"
        return {
            "runtime": f"{runtime} ({CONTAINER_IMAGE_VARIABLE})",
            "image": image,
            "digest": f"sha256:{digest}"
            if pinned
            else not_available(f"{CONTAINER_IMAGE_VARIABLE} names a tag, not name@sha256:<digest> (a tag can move)"),
        }
    unnamed = not_available(
        f"the runtime does not show the image inside the container; the executor can set {CONTAINER_IMAGE_VARIABLE}"
    )
    try:
        containerenv = (root / "run" / ".containerenv").read_text()
    except OSError:
        containerenv = None
    if containerenv is not None:
        values = dict(re.findall(r'^(\w+)="(.*)"$', containerenv, re.MULTILINE))
        return {
            "runtime": "podman (/run/.containerenv)",
            "image": values.get("image") or unnamed,
            "digest": f"image id {values['imageid']}" if values.get("imageid") else unnamed,
        }
    if (root / ".dockerenv").exists():
        return {"runtime": "docker (/.dockerenv exists)", "image": unnamed, "digest": unnamed}
    if "KUBERNETES_SERVICE_HOST" in environ:
        return {"runtime": "kubernetes (KUBERNETES_SERVICE_HOST set)", "image": unnamed, "digest": unnamed}
    reason = not_available(
        f"no container seen (no APPTAINER_CONTAINER, SINGULARITY_CONTAINER, {CONTAINER_IMAGE_VARIABLE}, "
        "/run/.containerenv or /.dockerenv)"
    )
    return {"runtime": reason, "image": reason, "digest": reason}


# ---------------------------------------------------------------- python packages and the whole stack


def python_packages() -> list[str]:
    """Every installed distribution as ``name==version``, sorted case-insensitively, duplicates once."""
    entries = {f"{dist.metadata['Name']}=={dist.version}" for dist in metadata.distributions() if dist.metadata["Name"]}
    return sorted(entries, key=str.lower)


def packages_sha256(packages: list[str]) -> str:
    return hashlib.sha256("\n".join(packages).encode()).hexdigest()


def _os_release() -> str:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME") or not_available("os-release has no PRETTY_NAME")
    except OSError as error:
        return not_available(f"no /etc/os-release: {error.strerror}")


def software_stack(
    environ: Mapping[str, str] | None = None,
    maps_text: str | None = None,
    packages: list[str] | None = None,
    hash_container_image: bool = False,
    proc: Path = Path("/proc"),
    sys_module: Path = Path("/sys/module"),
    root: Path = Path("/"),
) -> dict:
    """This process's software stack (every argument defaults to the real process; tests pass fixtures)."""
    environ = os.environ if environ is None else environ
    packages = python_packages() if packages is None else packages
    return {
        "kernel": platform.release(),
        "os": _os_release(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "gpu_driver": gpu_driver(proc, sys_module),
        "torch": torch_build(),
        "libraries": loaded_libraries(maps_text),
        "slurm": slurm_version(environ),
        "environment_modules": environment_modules(environ),
        "container": container(environ, root, hash_container_image),
        "python_packages_count": len(packages),
        "python_packages_sha256": packages_sha256(packages),
    }
