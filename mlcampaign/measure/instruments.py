"""The instruments a trial runs beside its training, in one place: energy and power, and evidence that the
timed steps were disturbed (the software stack and the roofline are read by the trial itself).

``TrialInstruments`` follows the trial (mlcampaign.trial.protocol): ``start`` at its beginning, ``begin`` / ``end``
around the timed training (MLPerf run_start to run_stop), ``blocks`` at its end for the record.

- Energy (mlcampaign.measure.energy): the first process of each node samples the node's sources (NVML for
  the GPUs this process sees, amdsmi, RAPL) in a background thread, over the timed training and over
  the whole trial. Where no source is readable the record says "not measured: <why>", never 0.
- Contention (mlcampaign.measure.contention): load, steal time and involuntary context switches over the
  timed training, and the matmul peak before against after; a trial whose evidence says its timing
  was disturbed is flagged ``contended``.
The software stack (mlcampaign.measure.software_stack) is read by the trial at its end, when its libraries
are loaded.
"""

from __future__ import annotations

import dataclasses
import os

from mlcampaign.measure.contention import ContentionWindow
from mlcampaign.measure.energy.monitor import EnergyMonitor, samples_per_joule

# Seconds between power readings: short enough for a trial of a minute, cheap for the step (a read
# takes well under a millisecond).
POWER_PERIOD_S = 0.5
TIMED, TRIAL = "timed_training", "trial"


def _visible_gpus() -> list[int] | None:
    """The GPUs of this node the process may use (CUDA_VISIBLE_DEVICES), as NVML indices; None: all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return None
    indices = [part for part in visible.split(",") if part.strip().isdigit()]
    return [int(index) for index in indices] if len(indices) == len(visible.split(",")) else None


class TrialInstruments:
    """The energy, contention and software-stack measurements of one trial process."""

    def __init__(self, node_leader: bool):
        self.monitor = EnergyMonitor.for_this_machine(POWER_PERIOD_S, _visible_gpus()) if node_leader else None
        self.windows: dict[str, dict] = {}
        self.contention_window: ContentionWindow | None = None

    def start(self) -> None:
        if self.monitor is not None:
            self.monitor.start()
            self.monitor.begin(TRIAL)

    def begin(self, name: str) -> None:
        if self.monitor is not None:
            self.monitor.begin(name)
        if name == TIMED:
            self.contention_window = ContentionWindow().start()

    def end(self, name: str) -> None:
        if self.monitor is not None:
            self.windows[name] = self.monitor.end(name)

    def stop(self) -> None:
        """End the trial window and the sampling thread (also after a failure)."""
        if self.monitor is not None:
            if TRIAL not in self.windows:
                self.windows[TRIAL] = self.monitor.end(TRIAL)
            self.monitor.stop()

    def energy_block(self, samples_trained: int | None) -> dict:
        """The record's ``energy`` block: joules and watts over the timed training and the whole trial
        of this node (the node of rank 0), or why they were not measured."""
        timed, trial = self.windows.get(TIMED), self.windows.get(TRIAL)
        if self.monitor is None or timed is None:
            why = (
                "not measured: the trial ended before its timed training"
                if self.monitor
                else ("not measured: this process is not its node's first")
            )
            timed = timed or {"energy_j": None, "mean_power_w": None, "peak_power_w": None, "not_measured": why}
        return {
            "energy_to_train_j": timed["energy_j"],
            "mean_power_w": timed["mean_power_w"],
            "peak_power_w": timed["peak_power_w"],
            "trial_energy_j": trial["energy_j"] if trial else None,
            "samples_per_joule": samples_per_joule(samples_trained or 0, timed["energy_j"]),
            "not_measured": timed["not_measured"],
            "windows": {name: window for name, window in self.windows.items()},
        }

    def contention_block(self, peak_before: float | None, peak_after: float | None) -> dict | None:
        """The record's ``contention`` block (None if the timed training never started)."""
        if self.contention_window is None:
            return None
        return dataclasses.asdict(self.contention_window.stop(peak_before, peak_after))
