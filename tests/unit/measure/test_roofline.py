"""The measured matmul roof: a sane, fast measurement (the record's roofline block: tests/unit/records)."""

import pytest
import torch

from mlcampaign.measure import roofline
from mlcampaign.measure.roofline import MatmulPeak, measure_matmul_peak

PEAK = MatmulPeak(
    flops_per_s=1e11,
    size=1024,
    dtype="float32",
    device="cpu",
    threads=2,
    repeats=5,
    warmup=2,
    matmuls_per_repeat=8,
    repeat_cv=0.01,
)


def test_cpu_matmul_peak_is_sane():
    peak = measure_matmul_peak("cpu", torch.float32, size=256, repeats=3, warmup=1, round_s=0.05)
    # Any CPU core of the last 20 years does more than 0.1 GFLOP/s; 2 x 256^3 FLOPs per matmul at
    # a few TFLOP/s per thread is beyond any core's FMA units.
    assert 1e8 < peak.flops_per_s < 5e12 * torch.get_num_threads()
    assert (peak.size, peak.dtype, peak.device, peak.repeats, peak.warmup) == (256, "float32", "cpu", 3, 1)
    assert peak.matmuls_per_repeat >= 1 and peak.repeat_cv >= 0
    assert "median of 3 timed rounds" in peak.describe() and "after 1 warm-up" in peak.describe()
    # The default size; how long its rounds take is this machine's (the decisions are tested below, on a
    # kernel whose time is given).
    assert roofline.MIN_SIZE <= measure_matmul_peak("cpu", torch.float32).size <= roofline.SATURATING_SIZE["cpu"]


@pytest.mark.parametrize(
    ("seconds_at_1024", "size", "expected_size"),
    [
        (0.02, None, 1024),  # a round of two matmuls at the saturating size
        (2.0, None, 256),  # emulated bfloat16 (about 1 GFLOP/s): measured where one matmul fills a round
        (0.3, None, 1024),  # slow, within SLOW_MATMUL_ROUNDS rounds: the saturating size
        (200.0, None, roofline.MIN_SIZE),  # never below MIN_SIZE
        (2.0, 1024, 1024),  # a size asked for is the size measured
    ],
)
def test_rounds_are_sized_to_round_s_and_a_kernel_too_slow_is_measured_smaller(
    monkeypatch, seconds_at_1024, size, expected_size
):
    # The kernel's time as a function of the matrices' size alone, so the decisions are the product's, not
    # this machine's: work grows as size³.
    spent = []

    def timed(a, b, out, count):
        spent.append(count * seconds_at_1024 * (a.shape[0] / 1024) ** 3)
        return spent[-1]

    monkeypatch.setattr(roofline, "_time_matmuls", timed)
    peak = measure_matmul_peak("cpu", torch.bfloat16, size=size)
    assert peak.size == expected_size
    assert peak.flops_per_s == pytest.approx(2.0 * 1024**3 / seconds_at_1024)
    # A round is as many matmuls as fill round_s (0.04 s), one at least.
    one = seconds_at_1024 * (expected_size / 1024) ** 3
    assert peak.matmuls_per_repeat == max(1, round(0.04 / one))
    # What it costs: two calls at the first size, two more at the size measured where smaller, the rounds.
    first = seconds_at_1024 * ((size or 1024) / 1024) ** 3
    rounds = (peak.warmup + peak.repeats) * peak.matmuls_per_repeat * one
    assert sum(spent) == pytest.approx(2 * first + (2 * one if one != first else 0) + rounds)


def test_measurement_rejects_no_repeats():
    with pytest.raises(ValueError, match="repeats"):
        measure_matmul_peak("cpu", repeats=0)
