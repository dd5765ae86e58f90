"""The dense-matmul peak canary: the roofline every trial process measures before training
(mlcampaign.measure.roofline), reused as it is: no second measurement."""

from __future__ import annotations

from mlcampaign.measure.canaries.probe import (
    BEFORE_SETUP,
    CanaryProbe,
    CanaryReading,
    CanaryUnavailable,
    TrialMachine,
    every_rank_note,
)


def measure_matmul(machine: TrialMachine) -> CanaryReading:
    peak = machine.matmul_peak
    if peak is None:
        raise CanaryUnavailable("the trial measured no roofline")
    method = f"the roofline before training (mlcampaign.measure.roofline): {peak.describe()}{every_rank_note(machine)}"
    return CanaryReading(peak.flops_per_s, peak.repeats, peak.repeat_cv, method)


PROBE = CanaryProbe("matmul_flops_per_s", BEFORE_SETUP, every_rank=False, measure=measure_matmul)
