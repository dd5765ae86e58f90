"""What Slurm's accounting says happened to a trial's job: the fate of a failed launch, and of a job killed as
a whole. When the launcher itself fails (a rank killed by the kernel's or Slurm's OOM handling, a cancelled
step, a failed node), Slurm accounting says what happened to the job step; that state becomes
the failure reason of the record written by the rule's fallback.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from mlcampaign.plan.campaign import TRIAL_KEYS

# Slurm job/step states (sacct) that end a trial, and the record's failure reason for each.
SLURM_STATE_REASONS = {
    "OUT_OF_MEMORY": "out_of_memory",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "NODE_FAIL": "scheduler",
    "CANCELLED": "scheduler",
    "PREEMPTED": "scheduler",
    "BOOT_FAIL": "scheduler",
}


def _sacct(*args: str, timeout: float) -> list[tuple[str, str]]:
    """(job id, state) rows of Slurm accounting for ``args`` ("CANCELLED by 0" read as "CANCELLED");
    empty where sacct fails."""
    try:
        result = subprocess.run(
            ["sacct", "-n", "-P", "--format=JobID,State", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    rows = (line.split("|")[:2] for line in result.stdout.splitlines() if "|" in line)
    return [(job_id, state.split()[0]) for job_id, state in rows]


def slurm_step_states(job_id: str) -> list[str]:
    """States of the job's steps from Slurm accounting (newest last); empty where sacct fails."""
    return [state for _, state in _sacct("-j", job_id, timeout=30)]


def launch_failure_reason(status: int, environ: dict | None = None) -> tuple[str, str]:
    """The failure reason (record schema enum) and an explanation for a launch that exited with ``status``."""
    environ = os.environ if environ is None else environ
    job_id = environ.get("SLURM_JOB_ID")
    if job_id:
        states = [state for state in slurm_step_states(job_id) if state in SLURM_STATE_REASONS]
        if states:
            return SLURM_STATE_REASONS[states[-1]], f"Slurm job {job_id}: a step ended {states[-1]}"
    return "error", "a process failed or was stopped; its traceback is in the trial log"


# Where the trial job's supervisor notes, at job start, which scheduler job runs the trial:
# {"scheduler": "slurm", "job_id": "<SLURM_JOB_ID>", "started_utc": ...}.
JOB_FILE = "job.json"
# A Slurm job id as sacct -j takes it: a job, or a task of an array job.
SLURM_JOB_ID = re.compile(r"\d+(_\d+)?")
# States of a job record that has not run (yet): Slurm requeues a job as a new record of the same
# id, which waits PENDING until it starts again.
SLURM_NOT_STARTED = {"PENDING", "REQUEUED"}


def slurm_job_states(job_ids: list[str]) -> dict[str, str]:
    """State of each job allocation's last attempt that left the queue; empty where sacct fails.

    A requeued job (node failure, preemption, ``scontrol requeue``) has one accounting record per
    attempt under the same id, and ``sacct -j`` without ``--duplicates`` shows only the newest, so
    a failed attempt followed by a copy still waiting to start again would read as merely pending.
    sacct lists the records of an id in submission order (oldest first); the last one that is no
    longer waiting decides. A job id reused after a controller reset brings older, unrelated
    records with it, which the newest attempt outranks the same way.
    """
    states = {}
    for job_id, state in _sacct("-X", "--duplicates", "-j", ",".join(job_ids), timeout=60):
        if state not in SLURM_NOT_STARTED:
            states[job_id] = state
    return states


def killed_trials(trial_dirs: Mapping[tuple, str | os.PathLike]) -> list[dict]:
    """Outcomes of trials without a record whose Slurm job was killed as a whole.

    ``trial_dirs`` maps the key (system, benchmark, cell, trial, replicate) of each of the
    campaign's planned trials that has no record to its trial directory. A job cancelled, timed
    out, out of memory or on a failed node at job level takes the trial's shell, and with it the
    rule's fallback, so no record is written; the job file its supervisor wrote at job start
    (``JOB_FILE``; absent: the job never started, or ran under another scheduler) names the job,
    and accounting says how its last attempt ended. One row per such trial: its key,
    ``failure_reason`` (record schema enum) and ``failure_message``. A job file that cannot be
    read as one raises ValueError naming the file.
    """
    job_of = {}
    for key, directory in trial_dirs.items():
        job = _slurm_job(Path(directory) / JOB_FILE)
        if job is not None:
            job_of[key] = job
    states = slurm_job_states(sorted(set(job_of.values()))) if job_of else {}
    return [
        dict(zip(TRIAL_KEYS, key, strict=True))
        | {
            "failure_reason": SLURM_STATE_REASONS[states[job_id]],
            "failure_message": f"Slurm job {job_id} ended {states[job_id]} before the trial wrote a record",
        }
        for key, job_id in job_of.items()
        if states.get(job_id) in SLURM_STATE_REASONS
    ]


def _slurm_job(path: Path) -> str | None:
    """The Slurm job id in a trial's job file; None where there is no file or it names another scheduler."""
    try:
        job = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable job file of a trial ({error})") from None
    if not isinstance(job, dict):
        raise ValueError(f"{path}: a trial's job file must be a JSON object, not {type(job).__name__}")
    if job.get("scheduler") != "slurm":
        return None
    job_id = job.get("job_id")
    if not isinstance(job_id, str) or not SLURM_JOB_ID.fullmatch(job_id):
        raise ValueError(f'{path}: job_id must be a Slurm job id such as "1234" or "1234_5", not {job_id!r}')
    return job_id
