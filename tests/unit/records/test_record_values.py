"""Numbers a record cannot hold (not finite, negative times and counts, beyond any machine) and outcomes it
cannot state (status against failure) are refused wherever a record is checked: validate_record, the
results store's ingest (its compiled schema included) and `mlcampaign ingest`, each naming the key."""

from __future__ import annotations

import copy
import io
import json

import jsonschema
import numpy as np
import pytest
import synthetic_records as synthetic

from mlcampaign.cli import EXIT_USAGE, main
from mlcampaign.history.store import RecordError, RecordFile, open_store
from mlcampaign.plan.metrics import UNIT_BOUNDS
from mlcampaign.records.files import validate_record, write_json_atomic, write_record

RUN_ID = "values-run"
# The run that the records of these tests belong to.
MANIFEST = {
    "run_id": RUN_ID,
    "campaign": "values",
    "site": "local",
    "started_utc": "2026-11-30T08:00:00+00:00",
    "plan": [],
}


def energy_window(joules: float) -> dict:
    device = {
        "energy_j": joules,
        "mean_power_w": 50.0,
        "peak_power_w": 60.0,
        "utilization_pct_mean": 80.0,
        "utilization_pct_max": 100.0,
        "memory_used_peak_bytes": 1 << 30,
    }
    power = {"energy_j": joules, "mean_power_w": 50.0, "peak_power_w": 60.0, "peak_power_basis": "samples"}
    source = {"source": "nvml", "description": "GPU 0", "samples": 4, **power, "not_measured": None}
    return {
        "window": "timed_training",
        "duration_s": 2.0,
        "sampling_period_s": 0.5,
        **power,
        "not_measured": None,
        "sources": [source | {"devices": {"0": device}}],
    }


def full_record() -> dict:
    """A valid ok record with every block a real trial writes (energy windows, ranks, roofline)."""
    row = synthetic.plan_row("local-cpu", "resnet50", "1x1", "fp32", 0)
    record = synthetic.record(row, np.random.default_rng(0))
    record["run"] = {"id": RUN_ID, "site": "local"}
    record["trial"]["campaign"] = "values"
    record["distributed"]["ranks"] = [
        {
            "rank": 0,
            "host": "node0",
            "weights_sha256": "0" * 64,
            "data_loading_s": 0.5,
            "compute_s": 3.0,
            "communication_s": 0.0,
            "device_memory_peak_bytes": None,
        }
    ]
    record["roofline"] = {"peak_flops_per_s": 2e11, "measured_with": "matmul", "achieved_fraction": 0.4}
    record["energy"] = {
        "energy_to_train_j": 100.0,
        "mean_power_w": 50.0,
        "peak_power_w": 60.0,
        "trial_energy_j": 120.0,
        "samples_per_joule": 10.0,
        "not_measured": None,
        "windows": {"timed_training": energy_window(100.0)},
    }
    return record


def with_value(record: dict, path: str, value) -> dict:
    """``record`` with the value at the dotted ``path`` (list indices as numbers) replaced."""
    changed = copy.deepcopy(record)
    *parents, last = path.split(".")
    target = changed
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    target[int(last) if isinstance(target, list) else last] = value
    return changed


NOT_FINITE = "is not a finite number"
BELOW = "is less than the minimum of 0"
ABOVE = "is greater than the maximum of"
BAD_VALUES = [
    ("metrics.throughput_samples_per_s", float("nan"), NOT_FINITE),
    ("metrics.time_to_train_s", float("inf"), NOT_FINITE),
    ("metrics.quality_history.0.value", float("nan"), NOT_FINITE),
    ("benchmark.target_value", float("-inf"), NOT_FINITE),
    ("energy.windows.timed_training.sources.0.devices.0.energy_j", float("nan"), NOT_FINITE),
    ("metrics.time_to_train_s", -5.0, BELOW),
    ("metrics.samples_trained", -3, BELOW),
    ("distributed.ranks.0.compute_s", -0.5, BELOW),
    ("flops.achieved_flops_per_s", -1e18, BELOW),
    ("energy.windows.timed_training.sources.0.devices.0.utilization_pct_max", 250.0, ABOVE),
    ("metrics.throughput_samples_per_s", 1e308, ABOVE),
    ("metrics.time_to_train_s", 1e308, ABOVE),
    ("flops.total", 1e308, ABOVE),
    ("energy.energy_to_train_j", 1e308, ABOVE),
]


def test_the_full_record_is_valid():
    validate_record(full_record())


@pytest.mark.parametrize(("path", "value", "problem"), BAD_VALUES)
def test_validate_record_refuses_the_number_naming_its_key(path, value, problem):
    with pytest.raises(jsonschema.ValidationError) as refused:
        validate_record(with_value(full_record(), path, value))
    assert ".".join(map(str, refused.value.absolute_path)) == path
    assert problem in refused.value.message


def test_every_unit_bound_admits_zero_and_states_a_finite_maximum():
    for unit, (low, high) in UNIT_BOUNDS.items():
        assert low == 0 < high < 1e31, unit


@pytest.mark.parametrize(
    ("status", "failure"),
    [("failed", None), ("ok", {"reason": "diverged", "message": "loss is nan"})],
)
def test_status_and_failure_must_agree(status, failure):
    record = full_record() | {"status": status, "failure": failure}
    with pytest.raises(jsonschema.ValidationError, match="status and failure disagree"):
        validate_record(record)


def test_a_failed_record_with_a_failure_and_null_measurements_is_valid():
    row = synthetic.plan_row("local-cpu", "resnet50", "1x1", "fp32", 0)
    validate_record(synthetic.record(row, np.random.default_rng(0), failure_reason="out_of_memory"))


def test_the_store_refuses_them_at_compiled_speed_too(tmp_path):
    """The store checks records with a compiled schema first; a bound passes NaN there."""
    with open_store(f"sqlite:///{tmp_path / 'history.db'}") as store:
        for path, value, problem in [*BAD_VALUES, ("status", "failed", "status and failure disagree")]:
            bad = RecordFile(f"trials/{path}/record.json", with_value(full_record(), path, value))
            with pytest.raises(RecordError) as refused:
                store.ingest(MANIFEST, [bad])
            assert bad.path in str(refused.value) and problem in str(refused.value)
            if path != "status":
                assert f"'{path}'" in str(refused.value)
        assert store.list_runs() == []


def write_run(results, record: dict):
    run_dir = results / "values" / "runs" / RUN_ID
    write_json_atomic(MANIFEST, run_dir / "run.json")
    # Python's json writes NaN and Infinity as bare words, as a record written by another tool might.
    (run_dir / "trials/local-cpu/resnet50/1x1-fp32/trial0-rep0").mkdir(parents=True)
    (run_dir / "trials/local-cpu/resnet50/1x1-fp32/trial0-rep0/record.json").write_text(json.dumps(record))
    return run_dir


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        ("metrics.throughput_samples_per_s", float("nan"), NOT_FINITE),
        ("metrics.time_to_train_s", -5.0, BELOW),
        ("metrics.throughput_samples_per_s", 1e308, ABOVE),
        ("failure", None, "status and failure disagree"),
    ],
)
def test_mlcampaign_ingest_refuses_them_with_exit_2(tmp_path, capsys, path, value, problem):
    record = with_value(full_record(), path, value)
    if path == "failure":
        record["status"] = "failed"
    run_dir = write_run(tmp_path / "results", record)
    store = f"sqlite:///{tmp_path / 'history.db'}"
    assert main(["--store", store, "ingest", str(run_dir)]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "record.json" in error and problem in error
    if path != "failure":
        assert f"'{path}'" in error


def test_a_refused_record_is_kept_in_the_log_not_lost(tmp_path):
    record = with_value(full_record(), "metrics.time_to_train_s", float("inf"))
    log = io.StringIO()
    with pytest.raises(jsonschema.ValidationError):
        write_record(record, tmp_path / "record.json", log)
    assert not (tmp_path / "record.json").exists()
    assert "key 'metrics.time_to_train_s'" in log.getvalue()
    kept = log.getvalue().split("here it is: ", 1)[1]
    assert json.loads(kept)["metrics"]["throughput_samples_per_s"] == record["metrics"]["throughput_samples_per_s"]
