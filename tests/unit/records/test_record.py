"""Record schema, atomic writing and flattening; a failure becomes a valid record with its reason."""

import json

import jsonschema
import pytest
import torch

from mlcampaign.analysis.frame import flatten
from mlcampaign.measure.canaries.probe import CanaryReading
from mlcampaign.measure.flops import FlopCount
from mlcampaign.measure.roofline import MatmulPeak
from mlcampaign.plan.canaries import CANARIES
from mlcampaign.plan.config_files import load_schema
from mlcampaign.plan.metrics import UNIT_BOUNDS, empty_trial_metrics
from mlcampaign.plan.runs import utc_now
from mlcampaign.records.builder import build_record, roofline_block
from mlcampaign.records.files import validate_record, write_json_atomic
from mlcampaign.records.provenance import provenance
from mlcampaign.trial.distributed import MissingDeviceError, detect_layout, torch_device
from mlcampaign.trial.protocol import TrainingDiverged, classify_failure


def spec():
    return {
        "campaign": "unit",
        "deterministic": False,
        "run": {"id": "unit-run", "site": "local"},
        "trial": {
            "system": "local-cpu",
            "benchmark": "b",
            "cell": "1x1-fp32",
            "trial": 0,
            "replicate": 0,
            "seed": 42,
            "nodes": 1,
            "tasks_per_node": 1,
            "processes": 1,
            "precision": "fp32",
            "compression": "none",
            "framework": "torch",
            "backend": "native",
        },
        "system": {
            "launcher": "python",
            "accelerator": "cpu",
            "device": "cpu",
            "devices_per_node": 1,
            "peak_flops_per_device": {"fp32": 1e11},
        },
        "benchmark": {
            "model": {"name": "resnet50"},
            "dataset": {"name": "digits"},
            "target": {"metric": "top1", "direction": "higher", "value": 0.9},
            "training": {
                "global_batch_size": 32,
                "batch_scaling": "strong",
                "optimizer": {"lr": 0.1},
                "lr_scaling": {"rule": "none"},
                "channels_last": False,
            },
        },
    }


DATASET_ID = "0123456789abcdef"


def failure_record():
    from mlcampaign.plan.metrics import empty_trial_metrics

    failure = {"reason": "diverged", "message": "loss is nan"}
    return build_record(spec(), DATASET_ID, {}, empty_trial_metrics(), None, failure, utc_now())


def test_failure_record_is_valid_and_flattens():
    record = failure_record()
    validate_record(record)
    assert record["status"] == "failed"
    row = flatten([record]).iloc[0]
    assert row["failure.reason"] == "diverged"
    assert row["trial.seed"] == 42
    assert row["dataset.dataset_id"] == "0123456789abcdef"


def test_schema_rejects_incomplete_records():
    record = failure_record()
    del record["metrics"]["throughput_samples_per_s"]
    with pytest.raises(jsonschema.ValidationError):
        validate_record(record)
    record = failure_record()
    record["status"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        validate_record(record)


def test_provenance_names_host_versions_and_commit():
    prov = provenance(utc_now())
    assert prov["packages"]["torch"] == torch.__version__.split("+")[0] or prov["packages"]["torch"].startswith(
        torch.__version__.split("+")[0]
    )
    assert prov["hostname"]
    assert prov["workflow_commit"] is None or len(prov["workflow_commit"]) == 40


def test_provenance_keeps_scheduler_job_id(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    prov = provenance(utc_now())
    assert prov["scheduler_job_id"] == "4242"
    assert prov["environment"]["SLURM_JOB_ID"] == "4242"


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "record.json"
    write_json_atomic({"a": 1}, path)

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", broken_dump)
    with pytest.raises(OSError):
        write_json_atomic({"a": 2}, path)
    assert json.loads(path.read_text()) == {"a": 1}  # the old complete record survives


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (torch.OutOfMemoryError("CUDA out of memory"), "out_of_memory"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried... out of memory"), "out_of_memory"),
        (TrainingDiverged("loss is nan"), "diverged"),
        (NotImplementedError("op"), "unsupported"),
        (MissingDeviceError("the system config says device 'cuda' but torch sees no GPU"), "unsupported"),
        (ValueError("x"), "error"),
    ],
)
def test_failure_classification(exc, reason):
    assert classify_failure(exc) == reason


def test_a_gpu_system_trial_on_a_machine_without_gpus_is_unsupported_here(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(MissingDeviceError, match="says device 'cuda' but torch sees no GPU") as missing:
        torch_device("cuda", detect_layout({}))
    assert classify_failure(missing.value) == "unsupported"


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


def test_the_canaries_block_of_the_schema_is_generated_from_the_canaries_table():
    block = load_schema("record")["properties"]["canaries"]
    assert "canaries" not in load_schema("record")["required"]  # absent in records of earlier schemas
    assert list(block["properties"]) == list(CANARIES)
    for name, canary in CANARIES.items():
        entry = block["properties"][name]
        assert entry["properties"]["unit"] == {"const": canary.unit}
        assert entry["properties"]["value"]["maximum"] == UNIT_BOUNDS[canary.unit][1]
        assert entry["description"].startswith(canary.description)


def test_record_holds_its_canaries_with_their_units_and_validates():
    readings = {
        "dataset_read_bytes_per_s": CanaryReading(4e8, 3, 0.05, "read"),
        "matmul_flops_per_s": CanaryReading(PEAK.flops_per_s, PEAK.repeats, PEAK.repeat_cv, "roofline"),
    }
    record = build_record(
        spec(), DATASET_ID, {}, empty_trial_metrics(), None, None, utc_now(), measured={"canaries": readings}
    )
    validate_record(record)
    assert list(record["canaries"]) == ["matmul_flops_per_s", "dataset_read_bytes_per_s"]  # the table's order
    assert record["canaries"]["dataset_read_bytes_per_s"] == {
        "value": 4e8,
        "unit": "B/s",
        "repeats": 3,
        "repeat_cv": 0.05,
        "method": "read",
    }
    assert failure_record()["canaries"] == {}  # a record written without the trial measured none
    older = {key: value for key, value in record.items() if key != "canaries"} | {"schema_version": "1.1"}
    validate_record(older)  # a record of an earlier run, written before the canaries existed
    triad = {"value": 1e10, "unit": "B/s", "repeats": 5, "repeat_cv": 0.01, "method": "triad"}
    for broken in (
        {"memory_triad_bytes_per_s": triad | {"value": 0.0}},  # not measured is absent, never 0
        {"memory_triad_bytes_per_s": triad | {"unit": "GB/s"}},
        {"memory_triad_bytes_per_s": {key: value for key, value in triad.items() if key != "repeat_cv"}},
        {"l3_latency_s": triad},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_record(record | {"canaries": broken})
