"""The measured matmul roof: a sane, fast measurement (the record's roofline block: tests/unit/records)."""

import time

import pytest
import torch

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


def test_cpu_matmul_peak_is_sane_and_fast():
    start = time.perf_counter()
    peak = measure_matmul_peak("cpu", torch.float32, size=256, repeats=3, warmup=1, round_s=0.05)
    elapsed = time.perf_counter() - start
    # Any CPU core of the last 20 years does more than 0.1 GFLOP/s; 2 x 256^3 FLOPs per matmul at
    # a few TFLOP/s per thread is beyond any core's FMA units.
    assert 1e8 < peak.flops_per_s < 5e12 * torch.get_num_threads()
    assert elapsed < 5.0
    assert (peak.size, peak.dtype, peak.device, peak.repeats, peak.warmup) == (256, "float32", "cpu", 3, 1)
    assert peak.matmuls_per_repeat >= 1
    assert "median of 3 timed rounds" in peak.describe() and "after 1 warm-up" in peak.describe()


def test_default_size_saturates_within_about_a_second():
    start = time.perf_counter()
    peak = measure_matmul_peak("cpu", torch.float32)
    assert peak.size == 1024
    assert time.perf_counter() - start < 5.0  # (warm-up + repeats) x 0.1 s, plus slack for a loaded machine


def test_measurement_rejects_no_repeats():
    with pytest.raises(ValueError, match="repeats"):
        measure_matmul_peak("cpu", repeats=0)
