"""Trial records: schema, provenance, atomic writing, and flattening into tables.

Schema: ``config/schemas/record.schema.yaml`` (version in ``SCHEMA_VERSION``).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import jsonschema
import pandas as pd

from mlcampaign.config import REPO_ROOT, load_schema

SCHEMA_VERSION = "1.0"
PROVENANCE_PACKAGES = ("torch", "torchvision", "numpy", "snakemake", "mlperf-logging", "tensorflow", "horovod")
# Environment variables worth keeping: scheduler context, threading and device selection.
ENV_PREFIXES = ("SLURM_", "OMP_", "MKL_", "CUDA_", "HIP_", "ROCR_", "NCCL_", "KUBERNETES_", "TORCH", "MASTER_")
SCHEDULER_JOB_ID_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "HOSTNAME_KUBE_JOB")


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_model() -> str | None:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return None


def _git_state(repo: Path) -> tuple[str | None, bool | None]:
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
    commit, dirty = _git_state(REPO_ROOT)
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


def validate_record(record: dict) -> None:
    jsonschema.Draft202012Validator(load_schema("record")).validate(record)


def write_json_atomic(data: dict, path: Path) -> None:
    """Write JSON so that ``path`` either does not exist or holds the complete document."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_record(path: Path) -> dict:
    with open(path) as handle:
        record = json.load(handle)
    validate_record(record)
    return record


def flatten(records: list[dict]) -> pd.DataFrame:
    """One row per record, nested keys joined with '.', lists kept as JSON text."""
    table = pd.json_normalize(records, sep=".")
    for column in table.columns:
        if table[column].map(lambda value: isinstance(value, list)).any():
            table[column] = table[column].map(json.dumps)
    return table
