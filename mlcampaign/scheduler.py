"""What the scheduler did to a trial: job time limits and the fate of a failed launch.

A trial stops itself shortly before its job's time limit (``Deadline``), so a trial that runs out
of time still writes a record with the reason ``timeout`` instead of being killed mid-write. When
the launcher itself fails (a rank killed by the kernel's or Slurm's OOM handling, a cancelled
step, a failed node), Slurm accounting says what happened to the job step; that state becomes
the failure reason of the record written by the rule's fallback.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

from mlcampaign.config import TRIAL_KEYS

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
# Seconds kept between the trial's own stop and the job's time limit, to write the record.
DEADLINE_MARGIN_S = 60.0


@dataclasses.dataclass(frozen=True)
class Deadline:
    """The moment (``time.time()``) a trial must stop; None: no limit."""

    at: float | None

    @classmethod
    def from_limit(cls, limit_minutes: float | None, started: float | None = None) -> Deadline:
        """A deadline ``limit_minutes`` after ``started`` (default now), less a margin to write the record."""
        if limit_minutes is None:
            return cls(None)
        start = time.time() if started is None else started
        limit_s = limit_minutes * 60.0
        return cls(start + max(limit_s - DEADLINE_MARGIN_S, 0.9 * limit_s))

    def passed(self) -> bool:
        return self.at is not None and time.time() >= self.at


NO_DEADLINE = Deadline(None)


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
    if status in (137, -9):
        return "out_of_memory", "a process was killed with SIGKILL (status 137), as the kernel's OOM killer does"
    return "error", "a process failed or was stopped; its traceback is in the trial log"


# Where Snakemake's Slurm executor keeps each trial job's log: <dir>/rule_trial/<wildcards>/<job id>.log.
SLURM_TRIAL_LOGS = Path(".snakemake/slurm_logs/rule_trial")


def slurm_job_states(job_ids: list[str]) -> dict[str, str]:
    """Final state of each job allocation (``sacct -X``); empty where sacct fails."""
    return dict(_sacct("-X", "-j", ",".join(job_ids), timeout=60))


def killed_trials(missing: list[tuple], log_dir: Path = SLURM_TRIAL_LOGS) -> list[dict]:
    """Outcomes of trials without a record whose Slurm job was killed as a whole.

    ``missing`` holds trial keys (system, benchmark, cell, trial, replicate). A job cancelled,
    timed out, out of memory or on a failed node at job level takes the trial's shell, and with
    it the rule's fallback, so no record is written; the Slurm executor's log directory still
    names the trial's jobs, and accounting says how the last one ended. One row per such trial:
    its key, ``failure_reason`` (record schema enum) and ``failure_message``.
    """
    last_job = {}
    for key in missing:
        # The executor names the directory by the wildcard values joined with "_".
        logs = (Path(log_dir) / "_".join(map(str, key))).glob("*.log")
        job_ids = [int(log.stem) for log in logs if log.stem.isdigit()]
        if job_ids:
            last_job[key] = str(max(job_ids))
    states = slurm_job_states(sorted(set(last_job.values()))) if last_job else {}
    return [
        dict(zip(TRIAL_KEYS, key, strict=True))
        | {
            "failure_reason": SLURM_STATE_REASONS[states[job_id]],
            "failure_message": f"Slurm job {job_id} ended {states[job_id]} before the trial wrote a record",
        }
        for key, job_id in last_job.items()
        if states.get(job_id) in SLURM_STATE_REASONS
    ]
