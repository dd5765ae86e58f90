"""Energy and power of a trial over named windows (``EnergyMonitor``), from the power sources this machine
offers (mlcampaign.measure.energy.source).

A daemon thread reads every source each ``period_s`` (0.1 to 1 s; it sleeps in between and the training step
never touches it); window boundaries (``begin``/``end``) take a sample themselves, so a window starts and
ends on a reading. Per device and sampling interval, energy is the counter difference (one wrap-around
added back where the counter's range is known; the period must be shorter than the time to wrap, about
20 min for a 262 kJ RAPL range at 200 W) or the trapezoid of two power readings. A window reports
``duration_s`` (s), ``energy_j`` (J), ``mean_power_w`` = energy / duration (W), ``peak_power_w`` (W: the
highest instantaneous reading of a source's devices together where it has one, else the highest mean over a
sampling interval; for the window's total, the highest mean of all sources together over an interval;
intervals shorter than half the period, slivers at window boundaries, do not count for peaks), ``samples``,
per-device utilisation (mean and max, %) and memory high-water mark (bytes), and each source's description.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable

from mlcampaign.measure.energy.source import PowerSource, SourceReading, default_sources

DEFAULT_PERIOD_S = 0.5
NOT_MEASURED = "not measured: "


class CounterError(Exception):
    """A source's readings cannot be accounted (a counter went backwards, a device vanished)."""


def interval_energy_j(
    previous: SourceReading, current: SourceReading, seconds: float, counter_range_j: dict[str, float]
) -> dict[str, float]:
    """Energy (J) per device between two readings ``seconds`` apart: counter difference (with one
    wrap-around where the range is known) or the trapezoid of the two power readings."""
    energy = {}
    for device in current.energy_j.keys() | previous.energy_j.keys() | current.power_w.keys() | previous.power_w.keys():
        if device in current.energy_j or device in previous.energy_j:
            if device not in current.energy_j or device not in previous.energy_j:
                raise CounterError(f"{device}: energy counter missing from a reading")
            delta = current.energy_j[device] - previous.energy_j[device]
            if delta < 0:
                if device not in counter_range_j:
                    raise CounterError(
                        f"{device}: energy counter went back from {previous.energy_j[device]:g} J to "
                        f"{current.energy_j[device]:g} J and has no known wrap range"
                    )
                delta += counter_range_j[device]
            energy[device] = delta
        else:
            if device not in current.power_w or device not in previous.power_w:
                raise CounterError(f"{device}: power reading missing from a sample")
            energy[device] = 0.5 * (previous.power_w[device] + current.power_w[device]) * seconds
    return energy


@dataclasses.dataclass
class _SourceAccount:
    """One source's accumulators over one window."""

    energy_j: dict[str, float] = dataclasses.field(default_factory=dict)
    interval_peak_w: dict[str, float] = dataclasses.field(default_factory=dict)
    instant_peak_w: dict[str, float] = dataclasses.field(default_factory=dict)
    utilization_sum: dict[str, float] = dataclasses.field(default_factory=dict)
    utilization_max: dict[str, float] = dataclasses.field(default_factory=dict)
    utilization_samples: dict[str, int] = dataclasses.field(default_factory=dict)
    memory_peak_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    source_instant_peak_w: float | None = None
    source_interval_peak_w: float | None = None
    samples: int = 0
    not_measured: str | None = None

    def add_reading(self, reading: SourceReading) -> None:
        self.samples += 1
        if reading.power_w and reading.power_w.keys() >= reading.energy_j.keys():
            watts = sum(reading.power_w.values())
            self.source_instant_peak_w = max(watts, self.source_instant_peak_w or watts)
        for device, watts in reading.power_w.items():
            self.instant_peak_w[device] = max(watts, self.instant_peak_w.get(device, watts))
        for device, percent in reading.utilization_pct.items():
            self.utilization_sum[device] = self.utilization_sum.get(device, 0.0) + percent
            self.utilization_samples[device] = self.utilization_samples.get(device, 0) + 1
            self.utilization_max[device] = max(percent, self.utilization_max.get(device, percent))
        for device, used in reading.memory_used_bytes.items():
            self.memory_peak_bytes[device] = max(used, self.memory_peak_bytes.get(device, used))

    def add_interval(self, energy_j: dict[str, float], seconds: float, counts_for_peak: bool) -> None:
        for device, joules in energy_j.items():
            self.energy_j[device] = self.energy_j.get(device, 0.0) + joules
            if counts_for_peak:
                watts = joules / seconds
                self.interval_peak_w[device] = max(watts, self.interval_peak_w.get(device, watts))
        if counts_for_peak:
            watts = sum(energy_j.values()) / seconds
            self.source_interval_peak_w = max(watts, self.source_interval_peak_w or watts)


@dataclasses.dataclass
class _Window:
    name: str
    start_s: float
    accounts: dict[int, _SourceAccount]
    total_peak_w: float | None = None


class EnergyMonitor:
    """Samples ``sources`` every ``period_s`` in a daemon thread and accounts energy over named windows.

    ``unavailable``: why other sources could not be opened (said in every window that measured nothing).
    ``clock``: seconds, monotonic (tests inject one). Use ``begin(name)`` / ``end(name)`` around what to
    measure; ``end`` returns the window's JSON-ready result. Windows may overlap and nest.
    """

    def __init__(
        self,
        sources: list[PowerSource],
        unavailable: Iterable[str] = (),
        period_s: float = DEFAULT_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, not {period_s!r}")
        self._sources = list(sources)
        self._unavailable = list(unavailable)
        self._period_s = period_s
        self._clock = clock
        self._last: dict[int, tuple[float, SourceReading]] = {}
        self._failed: dict[int, tuple[float, str]] = {}
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_this_machine(cls, period_s: float = DEFAULT_PERIOD_S, gpu_indices: list[int] | None = None):
        """A monitor of every source this machine offers (``gpu_indices``: the GPUs this process measures)."""
        sources, unavailable = default_sources(gpu_indices)
        return cls(sources, unavailable, period_s)

    # -- sampling thread

    def start(self) -> EnergyMonitor:
        if self._thread is not None:
            raise RuntimeError("the energy monitor is already running")
        self.sample()
        if self._sources:
            self._thread = threading.Thread(target=self._run, name="mlcampaign-energy", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self.sample()

    def stop(self) -> None:
        """Stop sampling and close the sources (open windows are dropped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._period_s + 5.0)
        for source in self._sources:
            # Closing a failed measurement library must not fail the trial.
            with contextlib.suppress(Exception):
                source.close()

    def __enter__(self) -> EnergyMonitor:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def sample(self) -> None:
        """Read every healthy source once and account the interval since its previous reading."""
        with self._lock:
            self._sample_locked()

    def _sample_locked(self) -> float:
        """Sample at ``clock()`` and return that time."""
        now = self._clock()
        interval_total_j, interval_s, complete = 0.0, None, True
        for index, source in enumerate(self._sources):
            if index in self._failed:
                complete = False
                continue
            try:
                reading = source.read()
                previous = self._last.get(index)
                energy = None
                if previous is not None:
                    energy = interval_energy_j(previous[1], reading, now - previous[0], source.counter_range_j)
            except Exception as error:  # any failure of a measurement library ends that source, not the trial
                self._fail(index, now, f"{type(error).__name__}: {error}")
                complete = False
                continue
            self._last[index] = (now, reading)
            if energy is not None:
                interval_s = now - previous[0]
                interval_total_j += sum(energy.values())
            else:
                complete = False
            for window in self._windows.values():
                account = window.accounts[index]
                if energy is not None:
                    account.add_interval(energy, interval_s, self._counts_for_peak(interval_s))
                account.add_reading(reading)
        if complete and interval_s and self._counts_for_peak(interval_s):
            for window in self._windows.values():
                watts = interval_total_j / interval_s
                window.total_peak_w = watts if window.total_peak_w is None else max(window.total_peak_w, watts)
        return now

    def _counts_for_peak(self, interval_s: float) -> bool:
        """Whether an interval is long enough for its mean power to count towards a peak: a window boundary
        just after a periodic sample makes a sliver in which one counter update looks like a spike."""
        return interval_s >= 0.5 * self._period_s

    def _fail(self, index: int, now: float, reason: str) -> None:
        self._failed[index] = (now, reason)
        name = self._sources[index].name
        for window in self._windows.values():
            into = now - window.start_s
            window.accounts[index].not_measured = f"{NOT_MEASURED}{name} failed {into:.3g} s into the window: {reason}"

    # -- windows

    def begin(self, name: str) -> None:
        """Open window ``name`` on a fresh sample."""
        with self._lock:
            if name in self._windows:
                raise ValueError(f"energy window {name!r} is already open")
            now = self._sample_locked()
            accounts = {}
            for index, source in enumerate(self._sources):
                account = _SourceAccount()
                if index in self._failed:
                    account.not_measured = (
                        f"{NOT_MEASURED}{source.name} failed before this window: {self._failed[index][1]}"
                    )
                elif self._last.get(index, (None,))[0] == now:
                    account.add_reading(self._last[index][1])
                accounts[index] = account
            self._windows[name] = _Window(name, now, accounts)

    def end(self, name: str) -> dict:
        """Close window ``name`` on a fresh sample and return its result (JSON-serialisable)."""
        with self._lock:
            if name not in self._windows:
                raise ValueError(f"energy window {name!r} is not open (open: {sorted(self._windows)})")
            end_s = self._sample_locked()
            window = self._windows.pop(name)
        return self._result(window, end_s - window.start_s)

    def _result(self, window: _Window, duration_s: float) -> dict:
        result = {
            "window": window.name,
            "duration_s": duration_s,
            "sampling_period_s": self._period_s,
            "energy_j": None,
            "mean_power_w": None,
            "peak_power_w": None,
            "peak_power_basis": None,
            "not_measured": None,
            "sources": [],
        }
        if not self._sources:
            why = "; ".join(self._unavailable) or "no power source was given"
            result["not_measured"] = f"{NOT_MEASURED}no power source readable ({why})"
            return result
        for index, source in enumerate(self._sources):
            result["sources"].append(self._source_result(source, window.accounts[index], duration_s))
        missing = [entry["not_measured"] for entry in result["sources"] if entry["not_measured"]]
        if missing:
            result["not_measured"] = NOT_MEASURED + "; ".join(reason.removeprefix(NOT_MEASURED) for reason in missing)
            return result
        energy = sum(entry["energy_j"] for entry in result["sources"])
        result.update(energy_j=energy, mean_power_w=energy / duration_s, peak_power_w=window.total_peak_w)
        result["peak_power_basis"] = (
            f"highest mean power of all sources together over one sampling interval (~{self._period_s:g} s)"
        )
        return result

    def _source_result(self, source: PowerSource, account: _SourceAccount, duration_s: float) -> dict:
        entry = {
            "source": source.name,
            "description": source.description,
            "samples": account.samples,
            "energy_j": None,
            "mean_power_w": None,
            "peak_power_w": None,
            "peak_power_basis": None,
            "not_measured": account.not_measured,
            "devices": {},
        }
        energy = sum(account.energy_j.values())
        if entry["not_measured"] is None and duration_s <= 0:
            entry["not_measured"] = f"{NOT_MEASURED}the window lasted {duration_s:g} s"
        elif entry["not_measured"] is None and energy <= 0:
            entry["not_measured"] = (
                f"{NOT_MEASURED}{source.name} reported no energy over {duration_s:.3g} s "
                "(a counter that updates less often than the window is long?)"
            )
        for device in sorted(
            account.energy_j.keys() | account.instant_peak_w.keys() | account.memory_peak_bytes.keys()
        ):
            joules = account.energy_j.get(device) if entry["not_measured"] is None else None
            samples = account.utilization_samples.get(device)
            entry["devices"][device] = {
                "energy_j": joules,
                "mean_power_w": joules / duration_s if joules is not None else None,
                "peak_power_w": account.instant_peak_w.get(device, account.interval_peak_w.get(device))
                if entry["not_measured"] is None
                else None,
                "utilization_pct_mean": account.utilization_sum[device] / samples if samples else None,
                "utilization_pct_max": account.utilization_max.get(device),
                "memory_used_peak_bytes": account.memory_peak_bytes.get(device),
            }
        if entry["not_measured"] is None:
            if account.source_instant_peak_w is not None:
                peak = account.source_instant_peak_w
                basis = f"highest instantaneous power of all its devices together, sampled every ~{self._period_s:g} s"
            else:
                peak = account.source_interval_peak_w
                basis = f"highest mean power (counter difference) over one ~{self._period_s:g} s sampling interval"
            entry.update(energy_j=energy, mean_power_w=energy / duration_s, peak_power_w=peak, peak_power_basis=basis)
        return entry


def samples_per_joule(samples: float, energy_j: float | None) -> float | None:
    """Training samples processed per joule (samples / J)."""
    if energy_j is None or energy_j <= 0:
        return None
    return samples / energy_j
