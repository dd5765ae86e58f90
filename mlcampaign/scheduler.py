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


def slurm_step_states(job_id: str) -> list[str]:
    """States of the job's steps from Slurm accounting (newest last); empty where sacct fails."""
    try:
        result = subprocess.run(
            ["sacct", "-j", job_id, "-n", "-P", "--format=JobID,State"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    # "CANCELLED by 0" -> "CANCELLED"
    return [line.split("|")[1].split()[0] for line in result.stdout.splitlines() if "|" in line]


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
