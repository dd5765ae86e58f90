"""A power source: the one interface the energy monitor (mlcampaign.measure.energy.monitor) reads. Each kind
of source is one module of ``sources/`` that defines ``SOURCE = PowerSourceKind(...)``; ``default_sources``
finds them there, so a new power source is one module.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from collections.abc import Callable
from typing import Protocol


class SourceUnavailable(Exception):
    """A power source cannot be opened on this machine; the message says why."""


@dataclasses.dataclass
class SourceReading:
    """One reading of a source. Keys are device labels ("gpu0", "package-0")."""

    energy_j: dict[str, float] = dataclasses.field(default_factory=dict)  # cumulative counter, J (may wrap)
    power_w: dict[str, float] = dataclasses.field(default_factory=dict)  # instantaneous, W
    utilization_pct: dict[str, float] = dataclasses.field(default_factory=dict)  # device busy, %
    memory_used_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # device memory in use, bytes


class PowerSource(Protocol):
    """What the monitor needs of a source: a name, a description, ``read()`` and ``close()``.

    ``counter_range_j`` maps a device to the value (J) at which its energy counter wraps to 0; a device
    without an entry has a counter that is not expected to wrap (a backwards step is then an error).
    """

    name: str
    description: str
    counter_range_j: dict[str, float]

    def read(self) -> SourceReading: ...

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class PowerSourceKind:
    """A kind of power source, as its module of ``sources/`` declares it."""

    label: str  # names it in the reason it could not be opened ("NVML: NVML sees no NVIDIA GPU")
    # Opens the source for the GPUs this process measures (their indices; None: all it sees), or raises
    # SourceUnavailable saying why it cannot.
    open: Callable[[list[int] | None], PowerSource]
    order: int  # where it stands among the kinds (their order of opening and of the reasons): GPUs first


SOURCES_PACKAGE = f"{__package__}.sources"


@functools.cache
def source_kinds() -> list[PowerSourceKind]:
    """Every kind of power source, in their order."""
    package = importlib.import_module(SOURCES_PACKAGE)
    kinds = [
        importlib.import_module(f"{SOURCES_PACKAGE}.{entry.name}").SOURCE
        for entry in pkgutil.iter_modules(package.__path__)
    ]
    return sorted(kinds, key=lambda kind: kind.order)


def default_sources(gpu_indices: list[int] | None = None) -> tuple[list[PowerSource], list[str]]:
    """The sources this machine offers, and for each one it does not, why."""
    sources: list[PowerSource] = []
    reasons = []
    for kind in source_kinds():
        try:
            sources.append(kind.open(gpu_indices))
        except SourceUnavailable as error:
            reasons.append(f"{kind.label}: {error}")
    return sources, reasons
