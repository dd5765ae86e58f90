"""A canary probe: the one interface the trial measures its canaries through. Each probe is one module of
``probes/`` that defines ``PROBE = CanaryProbe(...)`` under the name its canary has in the canaries table
(mlcampaign.plan.canaries, a layer above: this one reaches it by name only); ``probes()`` finds them there, so a
new canary is one declaration and one module.

``measure_canaries`` runs the probes of one phase of the trial and keeps what they measured; a probe that
cannot measure (``CanaryUnavailable``: it does not apply here, e.g. a dataset without files) or fails is
absent from the result with its reason in the trial's log, and never fails the trial.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import pkgutil
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:
    import torch

    from mlcampaign.measure.roofline import MatmulPeak

# When in a trial a probe runs (``CanaryProbe.phase``): with the roofline, before the framework's set-up takes
# the device; once the trial's process group exists, right before the timed training (MLPerf run_start); after
# the timed training (what touches the dataset: MLPerf's clock starts before the dataset is touched).
BEFORE_SETUP = "before set-up"
BEFORE_TIMED = "before the timed training"
AFTER_TIMED = "after the timed training"


class CanaryUnavailable(Exception):
    """A canary cannot be measured here (it does not apply, or what it reads is not there); the message says why."""


@dataclasses.dataclass(frozen=True)
class CanaryReading:
    """What a probe measured: the median of ``repeats`` timed repeats in its canary's unit, their coefficient of
    variation (sd / mean) and how it was measured (what was timed, its size, the warm-up excluded)."""

    value: float
    repeats: int
    repeat_cv: float
    method: str


class TrialGroup(Protocol):
    """The trial's own process group as the all-reduce probe uses it (each framework's runtime provides one):
    ``prepare`` allocates a buffer of ``buffer_bytes`` on this rank's device, ``allreduce`` all-reduces it once
    and returns with the device synchronised, ``everyone`` all-reduces one flag and says whether every rank
    passed ``ok`` (a barrier: no rank leaves it before all have entered)."""

    world_size: int
    description: str

    def prepare(self, buffer_bytes: int) -> None: ...

    def allreduce(self) -> None: ...

    def everyone(self, ok: bool) -> bool: ...


@dataclasses.dataclass(frozen=True)
class TrialMachine:
    """What the probes measure, as the trial process gives it: its device, the trial's processes (all, and
    those on this node, which share its caches and memory), and what the phase has: the roofline's matmul peak
    (before set-up), the trial's process group (before the timed training, more than one process) and its staged
    dataset files in the order a sample takes them (after the timed training)."""

    device: torch.device
    processes: int
    local_processes: int
    matmul_peak: MatmulPeak | None = None
    group: TrialGroup | None = None
    dataset_files: Sequence[Path] = ()


@dataclasses.dataclass(frozen=True)
class CanaryProbe:
    """A probe, as its module of ``probes/`` declares it."""

    name: str  # its canary's name in mlcampaign.plan.canaries
    phase: str  # BEFORE_SETUP, BEFORE_TIMED or AFTER_TIMED
    # Every process measures at once (the trial's layout loads the machine as training does; a collective needs
    # every rank), or rank 0 alone, whose figure the record keeps in either case.
    every_rank: bool
    measure: Callable[[TrialMachine], CanaryReading]


PROBES_PACKAGE = f"{__package__}.probes"


@functools.cache
def probes() -> dict[str, CanaryProbe]:
    """Every probe, by its canary's name."""
    package = importlib.import_module(PROBES_PACKAGE)
    found = [
        importlib.import_module(f"{PROBES_PACKAGE}.{entry.name}").PROBE
        for entry in pkgutil.iter_modules(package.__path__)
    ]
    return {probe.name: probe for probe in found}


def median_and_cv(values: Sequence[float]) -> tuple[float, float]:
    """The median of timed repeats and their coefficient of variation (sample sd / mean; 0 for one repeat)."""
    cv = statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0
    return statistics.median(values), cv


def every_rank_note(machine: TrialMachine) -> str:
    """What rank 0's figure is where every process of the trial measured at once ("" for one process)."""
    return (
        f"; rank 0's, every one of the {machine.processes} processes measuring at once" if machine.processes > 1 else ""
    )


def measure_canaries(
    names: Sequence[str], phase: str, machine: TrialMachine, is_main: bool, log: TextIO | None = None
) -> dict[str, CanaryReading]:
    """The readings of the canaries ``names`` whose probes run in ``phase`` on this process (``is_main``: rank
    0). A canary that cannot be measured, or whose probe fails or gives no positive finite value, is left out,
    its reason written to ``log`` (default: stderr, the trial's log)."""
    log = log or sys.stderr
    readings = {}
    for name in names:
        probe = probes()[name]
        if probe.phase != phase or not (probe.every_rank or is_main):
            continue
        try:
            reading = probe.measure(machine)
        except CanaryUnavailable as reason:
            print(f"canary {name}: not measured: {reason}", file=log)
            continue
        except Exception as error:  # a canary never fails the trial
            print(f"canary {name}: not measured: its probe failed: {type(error).__name__}: {error}", file=log)
            continue
        if not (math.isfinite(reading.value) and reading.value > 0 and math.isfinite(reading.repeat_cv)):
            print(f"canary {name}: not measured: {reading.value} is no measurement ({reading.method})", file=log)
            continue
        readings[name] = reading
    return readings
