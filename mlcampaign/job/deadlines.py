"""A trial's deadline: it stops itself shortly before its job's time limit, so that a trial that runs out of
time still writes a record with the reason ``timeout`` instead of being killed mid-write."""

from __future__ import annotations

import dataclasses
import time

# Seconds kept between the trial's own stop and the job's time limit: the trial writes its record
# (under a second), its processes and the supervisor exit, and Snakemake ends the job (a few seconds
# measured on Slurm and Kubernetes); a tenth of short limits, at least MIN and at most MAX.
MIN_DEADLINE_MARGIN_S = 15.0
MAX_DEADLINE_MARGIN_S = 60.0


def deadline_margin_s(limit_minutes: float | None) -> float:
    """The margin before a job's time limit of ``limit_minutes`` at which its trial stops."""
    if limit_minutes is None:
        return 0.0
    return min(MAX_DEADLINE_MARGIN_S, max(MIN_DEADLINE_MARGIN_S, 6.0 * limit_minutes))


@dataclasses.dataclass(frozen=True)
class Deadline:
    """The moment (``time.time()``) a trial must stop; None: no limit."""

    at: float | None

    @classmethod
    def from_limit(cls, limit_minutes: float | None, started: float, margin_s: float) -> Deadline:
        """A deadline ``limit_minutes`` after ``started`` (the job's start), ``margin_s`` early."""
        if limit_minutes is None:
            return cls(None)
        return cls(started + limit_minutes * 60.0 - margin_s)

    def passed(self) -> bool:
        return self.at is not None and time.time() >= self.at


NO_DEADLINE = Deadline(None)
