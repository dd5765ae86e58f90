"""Where, with what and how a trial ran: the provenance block of its record."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from mlcampaign.plan.runs import utc_now

PROVENANCE_PACKAGES = ("torch", "torchvision", "numpy", "snakemake", "mlperf-logging", "tensorflow", "horovod")
# Environment variables worth keeping: scheduler context, threading and device selection.
ENV_PREFIXES = ("SLURM_", "OMP_", "MKL_", "CUDA_", "HIP_", "ROCR_", "NCCL_", "KUBERNETES_", "TORCH", "MASTER_")
# MLCAMPAIGN_JOB_ID: the Kubernetes Job's name, set by the EIDF executor.
SCHEDULER_JOB_ID_VARS = ("SLURM_JOB_ID", "MLCAMPAIGN_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID")
# The workflow's checkout (the Snakefile's folder), which planning (mlcampaign.workflow.planning) exports to
# every job and trial.
WORKFLOW_DIR_VARIABLE = "MLCAMPAIGN_WORKFLOW_DIR"


def _source_tree() -> Path | None:
    """The source checkout the package is imported from (its pyproject.toml beside it), or None for an
    installed copy."""
    tree = Path(__file__).resolve().parents[2]
    return tree if (tree / "pyproject.toml").is_file() and (tree / "mlcampaign").is_dir() else None


SOURCE_TREE = _source_tree()


def workflow_checkout() -> Path | None:
    """The checkout of the workflow a trial ran from, whose git commit its record names: the Snakefile's
    folder as the workflow exports it, else the source checkout of this package (a trial started without
    the workflow: tests, benches)."""
    exported = os.environ.get(WORKFLOW_DIR_VARIABLE)
    return Path(exported) if exported else SOURCE_TREE


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_model() -> str | None:
    """The first GPU's name, as the trial's torch sees it (None without torch in this process: the trial
    job's supervisor writes failure records without importing it)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return None


def git_state(repo: Path | None) -> tuple[str | None, bool | None]:
    """The commit and dirty flag of the git checkout at ``repo`` (None, None: none, or not a checkout)."""
    if repo is None:
        return None, None

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, dirty


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def provenance(started_utc: str) -> dict:
    """Where, with what and how this trial ran."""
    commit, dirty = git_state(workflow_checkout())
    job_id = next((os.environ[var] for var in SCHEDULER_JOB_ID_VARS if var in os.environ), None)
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "gpu_model": _gpu_model(),
        "python": platform.python_version(),
        "packages": {name: _package_version(name) for name in PROVENANCE_PACKAGES},
        "workflow_commit": commit,
        "workflow_dirty": dirty,
        "command_line": list(sys.argv),
        "started_utc": started_utc,
        "finished_utc": utc_now(),
        "scheduler_job_id": job_id,
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
