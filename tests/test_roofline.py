"""The measured matmul roof: a sane, fast measurement; the achieved fraction; the record's roofline block."""

import time

import jsonschema
import numpy as np
import pytest
import torch
from test_analysis_tables import scaling_campaign, tables_for
from test_record import DATASET_ID, spec
from test_train import trial_setup  # noqa: F401 (a fixture)

from mlcampaign.flops import FlopCount
from mlcampaign.metrics import empty_trial_metrics
from mlcampaign.record import utc_now, validate_record
from mlcampaign.record_builder import build_record, roofline_block
from mlcampaign.roofline import MatmulPeak, measure_matmul_peak

PEAK = MatmulPeak(
    flops_per_s=1e11, size=1024, dtype="float32", device="cpu", threads=2, repeats=5, warmup=2, matmuls_per_repeat=8
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


def test_fraction_is_achieved_over_the_peak_of_all_processes():
    block = roofline_block(PEAK, processes=4, achieved_flops_per_s=2e10)
    assert block["peak_flops_per_s"] == pytest.approx(4e11)
    assert block["achieved_fraction"] == pytest.approx(0.05)
    assert "x 4 processes" in block["measured_with"]
    single = roofline_block(PEAK, processes=1, achieved_flops_per_s=5e10)
    assert single["achieved_fraction"] == pytest.approx(0.5)
    assert "processes" not in single["measured_with"]
    assert roofline_block(PEAK, 1, None)["achieved_fraction"] is None
    assert roofline_block(None, 1, 5e10) == {"peak_flops_per_s": None, "measured_with": None, "achieved_fraction": None}


def test_record_holds_the_roofline_and_validates():
    metrics = empty_trial_metrics() | {
        "throughput_samples_per_s": 100.0,
        "samples_trained": 1000,
        "samples_evaluated": 50,
    }
    flops = FlopCount(train_per_sample=3e8, forward_per_sample=1e8)
    record = build_record(spec(), DATASET_ID, {}, metrics, flops, None, utc_now(), roofline_peak=PEAK)
    validate_record(record)
    assert record["flops"]["achieved_flops_per_s"] == pytest.approx(3e10)
    assert record["roofline"]["peak_flops_per_s"] == pytest.approx(1e11)
    assert record["roofline"]["achieved_fraction"] == pytest.approx(0.3)
    # A failure before the measurement: nulls, still valid.
    failed = build_record(
        spec(), DATASET_ID, {}, empty_trial_metrics(), None, {"reason": "error", "message": "x"}, utc_now()
    )
    validate_record(failed)
    assert failed["roofline"]["peak_flops_per_s"] is None
    # The schema holds the block to its fields.
    for broken in ({"peak_flops_per_s": 1e11, "measured_with": "m"}, record["roofline"] | {"extra": 1}):
        with pytest.raises(jsonschema.ValidationError):
            validate_record(record | {"roofline": broken})


def test_trial_records_its_measured_roofline(trial_setup):  # noqa: F811 (the fixture imported above)
    _, run, _ = trial_setup
    record = run()
    assert record["status"] == "ok", record["failure"]
    roofline = record["roofline"]
    assert roofline["peak_flops_per_s"] > 1e8
    assert f"{torch.get_num_threads()} intra-op threads" in roofline["measured_with"]
    assert roofline["achieved_fraction"] == pytest.approx(
        record["flops"]["achieved_flops_per_s"] / roofline["peak_flops_per_s"]
    )
    assert 0 < roofline["achieved_fraction"] < 1.5  # below the roof, with room for measurement noise


def test_scaling_table_reports_the_roofline_fraction():
    plan, records = scaling_campaign("strong", {"1x2": [150, 150]})
    for record in records:
        record["roofline"] = roofline_block(PEAK, 2, 4e10)
    row = tables_for(plan, records)["scaling_strong"].iloc[0]
    assert row["roofline_fraction"] == pytest.approx(0.2)
    plan, records = scaling_campaign("strong", {"1x2": [150, 150]})  # records without a roofline block
    assert np.isnan(tables_for(plan, records)["scaling_strong"].iloc[0]["roofline_fraction"])
