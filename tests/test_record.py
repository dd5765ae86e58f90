"""Record schema, atomic writing and flattening; a failure becomes a valid record with its reason."""

import json

import jsonschema
import pytest
import torch

from mlcampaign.analysis.frame import flatten
from mlcampaign.distributed import MissingDeviceError, detect_layout, torch_device
from mlcampaign.provenance import provenance
from mlcampaign.record import utc_now, validate_record, write_json_atomic
from mlcampaign.record_builder import build_record
from mlcampaign.trial import TrainingDiverged, classify_failure


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
    from mlcampaign.metrics import empty_trial_metrics

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
