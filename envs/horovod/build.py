"""Build Horovod from its pinned PyPI sdist with this project's patches, cache the wheel, install it.

    python envs/horovod/build.py [--python PY] [--gpu none|cuda|rocm] [--mpi] [--frameworks torch,tensorflow]
                                 [--cache-dir DIR] [--jobs N] [--print-env]

The wheel is cached under <cache-dir>/<key>/, the key being a digest of the recipe (this script, the patches, the
pinned sdist hash), the target Python, its torch and TensorFlow versions, the compiler and the variant. A run whose
key is already installed does nothing; one whose wheel is cached installs it; otherwise it downloads, verifies,
patches and builds. The installed version carries the key as its local part (0.28.1+mlcampaign.<digest>), so
`importlib.metadata.version("horovod")` names the exact build.

MLCAMPAIGN_HOROVOD selects what happens: build (default), system (the site provides Horovod, e.g. `module load
horovod`: only report what the target Python imports), none (nothing). See envs/horovod/README.md.
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATCHES = HERE / "patches"
SDIST_PIN = HERE / "sdist.sha256"
FRAMEWORKS = ("torch", "tensorflow")
# Site paths Horovod's CMake reads: passed through to the build (and into the key, as are CFLAGS, CXXFLAGS and
# LDFLAGS); every other HOROVOD_* variable of the caller's environment is dropped, so the recipe decides the build.
PASSTHROUGH = (
    "HOROVOD_CUDA_HOME",
    "HOROVOD_ROCM_HOME",
    "HOROVOD_NCCL_HOME",
    "HOROVOD_NCCL_INCLUDE",
    "HOROVOD_NCCL_LIB",
    "HOROVOD_NCCL_LINK",
    "HOROVOD_NVTX_INCLUDE",
    "HOROVOD_BUILD_ARCH_FLAGS",
    "HOROVOD_CMAKE",
)
QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "3"}
METADATA_NAMES = {"torch": "pytorch", "tensorflow": "tensorflow"}  # framework names in horovod/metadata.json

# Run by the target Python: its ABI, the versions of the frameworks it would build against, and the installed
# Horovod (null if none): its version, the framework versions it was built against (its metadata.json, written by its
# CMake) and what each framework extension was built with, or why it does not import.
PROBE = """
import importlib, importlib.metadata, importlib.util, json, pathlib, sys, sysconfig
names = sys.argv[1].split(",")
info = {"python": "%s-%d.%d" % (sys.implementation.name, *sys.version_info[:2]),
        "soabi": sysconfig.get_config_var("SOABI"), "frameworks": {}, "horovod": None}
for name in names:
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        info["frameworks"][name] = {"error": "%s: %s" % (type(error).__name__, error)}
        continue
    entry = {"version": module.__version__}
    if name == "torch":
        entry.update(cuda=module.version.cuda, hip=module.version.hip)
    info["frameworks"][name] = entry
try:
    horovod = {"version": importlib.metadata.version("horovod"), "frameworks": {}}
except importlib.metadata.PackageNotFoundError:
    print(json.dumps(info))
    sys.exit()
package = pathlib.Path(importlib.util.find_spec("horovod").origin).parent
metadata = package / "metadata.json"
horovod.update(location=str(package), built_against=json.loads(metadata.read_text()) if metadata.exists() else {})
for name in names:
    try:
        module = importlib.import_module("horovod." + name)
        horovod["frameworks"][name] = {"gloo": bool(module.gloo_built()), "mpi": bool(module.mpi_built()),
                                       "nccl": bool(module.nccl_built()), "cuda": bool(module.cuda_built()),
                                       "rocm": bool(module.rocm_built())}
    except Exception as error:
        horovod["frameworks"][name] = {"error": "%s: %s" % (type(error).__name__, error)}
info["horovod"] = horovod
print(json.dumps(info))
"""


class BuildError(RuntimeError):
    """A failure with a message for the person running the script."""


def log(message: str) -> None:
    print(f"horovod: {message}", flush=True)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pinned_sdist() -> tuple[str, str, str]:
    """(version, file name, sha256) from sdist.sha256, a `sha256sum` line."""
    match = re.fullmatch(r"([0-9a-f]{64}) [ *](horovod-(\d+\.\d+\.\d+)\.tar\.gz)\s*", SDIST_PIN.read_text())
    if not match:
        raise BuildError(f"{SDIST_PIN}: expected one line '<sha256>  horovod-<version>.tar.gz'")
    return match.group(3), match.group(2), match.group(1)


def patch_files() -> list[Path]:
    patches = sorted(PATCHES.glob("*.patch"))
    if not patches:
        raise BuildError(f"{PATCHES}: no *.patch files")
    return patches


def recipe_digest() -> str:
    """Digest of everything in this directory that decides the build: the script, the pin, the patches."""
    digest = hashlib.sha256()
    for path in [Path(__file__).resolve(), SDIST_PIN, *patch_files()]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def run_python(python: str, code: str, *args: str):
    """Run ``code`` in the target Python; the JSON value its last output line holds."""
    result = subprocess.run(
        [python, "-c", code, *args], capture_output=True, text=True, env={**os.environ, **QUIET_TF}, check=False
    )
    if result.returncode != 0:
        raise BuildError(f"{python} failed to run a probe (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def compiler_identity(env: dict[str, str]) -> str:
    compiler = env.get("CXX", "c++")
    try:
        output = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise BuildError(f"C++ compiler '{compiler}' (CXX or c++ on PATH) does not run: {error}") from error
    return output.splitlines()[0].strip()


def build_environment(gpu: str, mpi: bool, frameworks: list[str], jobs: int) -> dict[str, str]:
    """The HOROVOD_* variables (and MAKEFLAGS) of the build: Gloo always, MPI and a GPU library when asked."""
    env = {
        "HOROVOD_WITH_GLOO": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
        "MAKEFLAGS": f"-j{jobs}",
    }
    for name, variable in (("torch", "PYTORCH"), ("tensorflow", "TENSORFLOW")):
        env[f"HOROVOD_WITH_{variable}" if name in frameworks else f"HOROVOD_WITHOUT_{variable}"] = "1"
    if mpi:
        env["HOROVOD_WITH_MPI"] = "1"  # CPU collectives then default to MPI, Horovod's own default with MPI
    else:
        env["HOROVOD_WITHOUT_MPI"] = "1"
        env["HOROVOD_CPU_OPERATIONS"] = "GLOO"
    if gpu == "none":
        env["HOROVOD_CPU_ONLY"] = "1"  # patches/0002: a CUDA torch wheel must not turn this into a CUDA build
        env["HOROVOD_WITHOUT_NVTX"] = "1"  # NVTX is found in an installed CUDA toolkit otherwise
    else:
        env["HOROVOD_GPU"] = {"cuda": "CUDA", "rocm": "ROCM"}[gpu]
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"  # with HOROVOD_GPU=ROCM, Horovod's CMake links RCCL for it
    env.update({name: os.environ[name] for name in PASSTHROUGH if name in os.environ})
    # CMake's RelWithDebInfo (fixed by Horovod's setup.py) puts debug info of every framework header into the
    # libraries; linking with --strip-debug keeps the symbols and drops that bulk from the wheel.
    env["LDFLAGS"] = " ".join(filter(None, [os.environ.get("LDFLAGS"), "-Wl,--strip-debug"]))
    for name in ("CFLAGS", "CXXFLAGS"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def process_environment(caller: dict[str, str], env: dict[str, str], local_version: str) -> dict[str, str]:
    """The build process's environment: the caller's without its HOROVOD_* variables, then the recipe's."""
    kept = {name: value for name, value in caller.items() if not name.startswith("HOROVOD_")}
    return {**kept, **env, "HOROVOD_LOCAL_VERSION": local_version, **QUIET_TF}


def check_frameworks(probe: dict, frameworks: list[str], gpu: str, python: str) -> None:
    for name in frameworks:
        if "error" in probe["frameworks"][name]:
            raise BuildError(f"{python} cannot import {name} ({probe['frameworks'][name]['error']}); install it first")
    torch = probe["frameworks"].get("torch")
    if gpu == "cuda" and torch and not torch["cuda"]:
        raise BuildError(f"--gpu cuda: torch {torch['version']} in {python} is not a CUDA build")
    if gpu == "rocm" and torch and not torch["hip"]:
        raise BuildError(f"--gpu rocm: torch {torch['version']} in {python} is not a ROCm build")


def expected_features(gpu: str, mpi: bool) -> dict[str, bool]:
    return {"gloo": True, "mpi": mpi, "nccl": gpu != "none", "cuda": gpu == "cuda", "rocm": gpu == "rocm"}


def installed_mismatch(installed: dict | None, version: str, frameworks: list[str], features: dict) -> str | None:
    """Why the installed Horovod is not the wanted build, or None when it is."""
    if installed is None:
        return "not installed"
    if installed["version"] != version:
        return f"installed version is {installed['version']}"
    for name in frameworks:
        built = installed["frameworks"][name]
        if "error" in built:
            return f"horovod.{name} does not import: {built['error']}"
        if built != features:
            return f"horovod.{name} was built with {built}, wanted {features}"
    return None


def built_against_mismatch(probe: dict, frameworks: list[str]) -> str | None:
    """Which framework the installed Horovod was built against another version of (Horovod itself only warns)."""
    for name in frameworks:
        built_against = probe["horovod"]["built_against"].get(METADATA_NAMES[name])
        found = probe["frameworks"][name].get("version")
        if built_against != found:
            return f"{name} {built_against}, but the environment has {found}"
    return None


@contextlib.contextmanager
def locked(directory: Path):
    """One build per key at a time: a second process waits for the first and then finds its wheel."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process building in {directory}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def check_build_tools(env: dict[str, str]) -> None:
    """The tools a build runs, named before anything is downloaded."""
    cmake = env.get("HOROVOD_CMAKE", "cmake")
    missing = [tool for tool in ("patch", cmake) if shutil.which(tool) is None]
    if missing:
        raise BuildError(f"building Horovod needs {' and '.join(missing)} on PATH (or HOROVOD_CMAKE for CMake)")


def fetch_sdist(python: str, cache_root: Path, name: str, version: str, sha256: str) -> Path:
    sdist = cache_root / "sdist" / name
    if sdist.exists() and sha256_of(sdist) == sha256:
        log(f"sdist {name} cached at {sdist}")
        return sdist
    sdist.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=sdist.parent) as download:
        started = time.monotonic()
        command = [python, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--no-build-isolation"]
        command += ["--disable-pip-version-check", "--quiet", "-d", download, f"horovod=={version}"]
        if subprocess.run(command, check=False).returncode != 0:
            raise BuildError(f"pip could not download horovod=={version} (command: {' '.join(command)})")
        downloaded = Path(download) / name
        if not downloaded.exists():
            raise BuildError(f"pip download left no {name} in {download}: {sorted(os.listdir(download))}")
        actual = sha256_of(downloaded)
        if actual != sha256:
            raise BuildError(f"{name} from PyPI has sha256 {actual}, but {SDIST_PIN} pins {sha256}")
        downloaded.replace(sdist)
    log(f"downloaded {name} ({sdist.stat().st_size / 1e6:.1f} MB) in {time.monotonic() - started:.1f} s, sha256 ok")
    return sdist


def build_wheel(python: str, sdist: Path, key_dir: Path, local_version: str, env: dict[str, str]) -> Path:
    """Extract, patch and build in a scratch directory under key_dir; returns the wheel in key_dir."""
    log_path = key_dir / "build.log"
    with tempfile.TemporaryDirectory(dir=key_dir, prefix="build-") as scratch:
        with tarfile.open(sdist) as archive:
            # The sdist's hash is pinned; the "data" filter (Python >= 3.11.4) also refuses links and paths outside.
            archive.extractall(scratch, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        (source,) = Path(scratch).iterdir()
        for patch in patch_files():
            result = subprocess.run(
                ["patch", "-p1", "--batch", "--forward", "-i", str(patch)],
                cwd=source,
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise BuildError(f"{patch.name} does not apply to {sdist.name}:\n{result.stdout}{result.stderr}")
            log(f"applied {patch.name}")
        wheel_dir = Path(scratch) / "wheel"
        command = [python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", "-v"]
        command += ["--disable-pip-version-check", "-w", str(wheel_dir), str(source)]
        log(f"building ({env['MAKEFLAGS']}); log in {log_path}")
        started = time.monotonic()
        with log_path.open("w") as build_log:
            result = subprocess.run(
                command,
                env=process_environment(os.environ, env, local_version),
                stdout=build_log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        elapsed = time.monotonic() - started
        if result.returncode != 0:
            raise BuildError(
                f"build failed after {elapsed:.0f} s (exit {result.returncode}); from {log_path}:\n"
                + failure_summary(log_path)
            )
        (built,) = wheel_dir.glob("horovod-*.whl")
        wheel = key_dir / built.name
        built.replace(wheel)
    log(f"built {wheel.name} in {elapsed:.0f} s ({wheel.stat().st_size / 1e6:.1f} MB)")
    return wheel


def failure_summary(log_path: Path) -> str:
    """The compiler, linker and CMake errors of a failed build's log (pip's own cleanup output fills its end)."""
    lines = log_path.read_text(errors="replace").splitlines()
    errors = [line for line in lines if re.search(r"error:|CMake Error|\*\*\* \[|multiple definition|undefined", line)]
    shown = errors[:20] or lines[-20:]
    return "\n".join(line if len(line) < 400 else line[:400] + " ..." for line in shown)


def cached_wheel(key_dir: Path) -> Path | None:
    """The key's wheel if its recorded sha256 still matches (a truncated or edited wheel is rebuilt)."""
    record = key_dir / "build.json"
    if not record.exists():
        return None
    entry = json.loads(record.read_text())
    wheel = key_dir / entry["wheel"]
    if wheel.exists() and sha256_of(wheel) == entry["wheel_sha256"]:
        return wheel
    log(f"cached wheel in {key_dir} is missing or does not match its sha256 in build.json: rebuilding")
    return None


def install(python: str, wheel: Path) -> float:
    started = time.monotonic()
    command = [python, "-m", "pip", "install", "--no-deps", "--force-reinstall", "--no-index", "--quiet"]
    command += ["--disable-pip-version-check", str(wheel)]
    if subprocess.run(command, check=False).returncode != 0:
        raise BuildError(f"pip could not install {wheel} into {python}")
    return time.monotonic() - started


def missing_requirements(python: str, wheel: Path) -> list[str]:
    """Requirements of the wheel that the target Python lacks (it is installed with --no-deps: pins are the venv's)."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        requires = [
            line.split(":", 1)[1].strip()
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line
        ]
    code = (
        "import importlib.metadata, json, sys\n"
        "from packaging.requirements import Requirement\n"
        "missing = []\n"
        "for text in sys.argv[1:]:\n"
        "    req = Requirement(text)\n"
        "    if req.marker is not None and not req.marker.evaluate():\n"
        "        continue\n"
        "    try:\n"
        "        importlib.metadata.version(req.name)\n"
        "    except importlib.metadata.PackageNotFoundError:\n"
        "        missing.append(text)\n"
        "print(json.dumps(missing))\n"
    )
    return run_python(python, code, *requires)


def report_system(python: str, frameworks: list[str]) -> None:
    probe = run_python(python, PROBE, ",".join(frameworks))
    installed = probe["horovod"]
    if installed is None:
        raise BuildError(f"MLCAMPAIGN_HOROVOD=system, but {python} has no horovod (load the site's Horovod module)")
    log(f"MLCAMPAIGN_HOROVOD=system: using horovod {installed['version']} in {installed['location']}, not building")
    for name, built in installed["frameworks"].items():
        log(f"  horovod.{name}: {built}")
    broken = [name for name, built in installed["frameworks"].items() if "error" in built]
    if broken:
        raise BuildError(f"the site's Horovod lacks {', '.join('horovod.' + n for n in broken)} (see above)")
    mismatch = built_against_mismatch(probe, frameworks)
    if mismatch:
        raise BuildError(f"the site's Horovod was built against {mismatch}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--python",
        default=shutil.which("python") or shutil.which("python3"),
        help="interpreter of the environment to build for and install into (default: python on PATH)",
    )
    parser.add_argument(
        "--gpu",
        choices=("none", "cuda", "rocm"),
        default=os.environ.get("MLCAMPAIGN_HOROVOD_GPU", "none"),
        help="GPU collectives: cuda (NCCL) or rocm (RCCL); default $MLCAMPAIGN_HOROVOD_GPU or none",
    )
    parser.add_argument(
        "--mpi",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("MLCAMPAIGN_HOROVOD_MPI") == "1",
        help="also build the MPI controller (needs mpicxx; srun/mpirun launches); default $MLCAMPAIGN_HOROVOD_MPI=1",
    )
    parser.add_argument(
        "--frameworks",
        default=",".join(FRAMEWORKS),
        help=f"comma-separated subset of {','.join(FRAMEWORKS)} (default: both)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlcampaign" / "horovod",
        help="wheel cache (default: ${XDG_CACHE_HOME:-$HOME/.cache}/mlcampaign/horovod)",
    )
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="make -j (default: all cores)")
    parser.add_argument(
        "--print-env", action="store_true", help="print the build environment and cache key, build nothing"
    )
    args = parser.parse_args(argv)
    if args.python is None:
        parser.error("no python on PATH; pass --python")
    args.frameworks = args.frameworks.split(",")
    unknown = sorted(set(args.frameworks) - set(FRAMEWORKS))
    if unknown or not args.frameworks:
        parser.error(f"--frameworks: unknown {unknown}; choose from {','.join(FRAMEWORKS)}")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, not {args.jobs}")
    return args


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    mode = os.environ.get("MLCAMPAIGN_HOROVOD", "build")
    if mode == "none":
        log("MLCAMPAIGN_HOROVOD=none: not building or checking Horovod")
        return
    if mode == "system":
        report_system(args.python, args.frameworks)
        return
    if mode != "build":
        raise BuildError(f"MLCAMPAIGN_HOROVOD={mode!r}: expected build, system or none")

    started = time.monotonic()
    version, sdist_name, sdist_sha256 = pinned_sdist()
    probe = run_python(args.python, PROBE, ",".join(args.frameworks))
    env = build_environment(args.gpu, args.mpi, args.frameworks, args.jobs)
    key_inputs = {
        "recipe": recipe_digest(),
        "sdist_sha256": sdist_sha256,
        "python": probe["python"],
        "soabi": probe["soabi"],
        "frameworks": {name: probe["frameworks"][name] for name in args.frameworks},
        "compiler": compiler_identity(os.environ),
        # MAKEFLAGS changes how fast, not what: left out so a different core count reuses the wheel.
        "environment": {k: v for k, v in env.items() if k != "MAKEFLAGS"},
    }
    digest = hashlib.sha256(json.dumps(key_inputs, sort_keys=True).encode()).hexdigest()[:16]
    key = f"{version}-{digest}"
    local_version = f"mlcampaign.{digest}"
    if args.print_env:
        for name, value in sorted(env.items()):
            print(f"{name}={value}")
        print(f"MLCAMPAIGN_HOROVOD_KEY={key}")
        print(json.dumps(key_inputs, indent=2, sort_keys=True))
        return

    check_frameworks(probe, args.frameworks, args.gpu, args.python)
    wanted = f"{version}+{local_version}"
    features = expected_features(args.gpu, args.mpi)
    mismatch = installed_mismatch(probe["horovod"], wanted, args.frameworks, features)
    if mismatch is None:
        log(f"horovod {wanted} already installed in {args.python}; nothing to do ({time.monotonic() - started:.1f} s)")
        return
    log(f"key {key}; {args.python}: {mismatch}")

    key_dir = args.cache_dir / key
    with locked(key_dir):
        wheel = cached_wheel(key_dir)
        if wheel is not None:
            log(f"using cached {wheel}")
        else:
            check_build_tools(env)
            sdist = fetch_sdist(args.python, args.cache_dir, sdist_name, version, sdist_sha256)
            build_started = time.monotonic()
            wheel = build_wheel(args.python, sdist, key_dir, local_version, env)
            record = {
                "key": key,
                "inputs": key_inputs,
                "wheel": wheel.name,
                "wheel_sha256": sha256_of(wheel),
                "wheel_bytes": wheel.stat().st_size,
                "build_seconds": round(time.monotonic() - build_started, 1),
                "makeflags": env["MAKEFLAGS"],
            }
            (key_dir / "build.json.tmp").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            (key_dir / "build.json.tmp").replace(key_dir / "build.json")
    missing = missing_requirements(args.python, wheel)
    if missing:
        raise BuildError(f"{args.python} lacks Horovod's requirements {missing}: pin them in requirements.txt")
    install_seconds = install(args.python, wheel)
    installed = run_python(args.python, PROBE, ",".join(args.frameworks))["horovod"]
    mismatch = installed_mismatch(installed, wanted, args.frameworks, features)
    if mismatch is not None:
        raise BuildError(f"installed {wheel.name}, but {mismatch}")
    total = time.monotonic() - started
    log(f"installed {wheel.name} into {args.python} in {install_seconds:.1f} s (total {total:.0f} s)")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BuildError as error:
        sys.exit(f"horovod: error: {error}")
