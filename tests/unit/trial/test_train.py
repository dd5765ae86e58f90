"""The trial runner on a tiny staged dataset: honest metrics, and failures recorded with their reason."""

import dataclasses
import time

import pytest
import torch
import yaml

from mlcampaign.data.manifest import ID_FILE
from mlcampaign.data.staging import stage_into
from mlcampaign.job.deadlines import NO_DEADLINE, Deadline
from mlcampaign.plan.config import load_campaign
from mlcampaign.records.files import read_record
from mlcampaign.trial.protocol import run_trial
from mlcampaign.trial.torch import models
from mlcampaign.trial.torch.trial import TorchTrial

from conftest import REPO

OVERRIDES = {
    "resnet50-synthetic": {
        "dataset": {
            "name": "synthetic-unit",
            "source": {"options": {"num_classes": 2, "train_per_class": 16, "val_per_class": 4, "image_size": 16}},
        },
        "model": {"options": {"image_size": 16, "num_classes": 2}},
        "training": {"epochs_max": 2, "global_batch_size": 8, "warmup_steps": 1},
    }
}


@pytest.fixture
def trial_setup(tmp_path):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config |= {"benchmarks": ["resnet50-synthetic"], "trials": 1, "benchmark_overrides": OVERRIDES}
    campaign = load_campaign(config, REPO / "config")
    spec = campaign.trial_spec(next(campaign.trials()), "test-run", "local")
    stage_into(spec["benchmark"]["dataset"], tmp_path / "dataset")

    def run(deadline=NO_DEADLINE):
        return run_trial(
            spec, tmp_path / "dataset" / ID_FILE, tmp_path / "record.json", tmp_path / "mllog.txt", deadline
        )

    return spec, run, tmp_path


def test_metrics_exclude_the_declared_warmup(trial_setup):
    spec, run, _ = trial_setup
    record = run()
    metrics = record["metrics"]
    assert record["status"] == "ok", record["failure"]
    steps_per_epoch = 32 // 8
    assert metrics["samples_trained"] == metrics["epochs_run"] * steps_per_epoch * 8
    assert metrics["warmup_steps_excluded"] == 1
    measured_samples = metrics["samples_trained"] - 8
    step_time = metrics["data_loading_s"] + metrics["compute_s"]
    assert metrics["throughput_samples_per_s"] == pytest.approx(measured_samples / step_time)
    assert metrics["time_to_train_s"] >= metrics["train_loop_s"]
    assert record["flops"]["total"] == pytest.approx(
        record["flops"]["train_per_sample"] * metrics["samples_trained"]
        + record["flops"]["forward_per_sample"] * metrics["samples_evaluated"]
    )
    assert record["trial"]["seed"] == spec["trial"]["seed"]


def test_an_fp32_trial_computes_ieee_float32_on_gpus_too(trial_setup):
    """torch runs cuDNN convolutions in TF32 by default on Ampere and later GPUs; an "fp32" trial turns it off.
    The flags are global and settable without a GPU, so this is checked here."""
    spec, run, _ = trial_setup
    assert spec["trial"]["precision"] == "fp32"
    before = torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    try:
        assert run()["status"] == "ok"
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    finally:
        torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision = before


def test_same_seed_gives_same_training_curve(trial_setup):
    _, run, _ = trial_setup
    first = run()["metrics"]["quality_history"]
    assert run()["metrics"]["quality_history"] == first


def test_diverging_loss_becomes_a_failure_record(trial_setup, monkeypatch):
    _, run, tmp_path = trial_setup
    spec = models.get("resnet50")

    class NanLoss(torch.nn.Module):
        def forward(self, outputs, targets):
            return outputs.sum() * float("nan")

    monkeypatch.setattr(models, "get", lambda name: dataclasses.replace(spec, criterion=lambda training: NanLoss()))
    record = run()
    assert record["status"] == "failed"
    assert record["failure"]["reason"] == "diverged"
    assert (tmp_path / "record.json").exists()


def test_an_evaluation_that_is_not_finite_is_a_diverged_trial_with_a_valid_record(trial_setup, monkeypatch):
    """A model whose outputs became NaN evaluates to NaN: the trial diverged, and its record (which
    JSON could not hold with a NaN quality) is written."""
    spec, run, tmp_path = trial_setup
    metric = spec["benchmark"]["target"]["metric"]
    monkeypatch.setattr(TorchTrial, "_evaluate", lambda self: {metric: float("nan")})
    record = run()
    assert (record["status"], record["failure"]["reason"]) == ("failed", "diverged")
    assert f"{metric} is nan at the evaluation after epoch" in record["failure"]["message"]
    assert read_record(tmp_path / "record.json")["metrics"]["quality_history"] == []


def test_corrupted_dataset_is_named_before_training(trial_setup):
    _, run, tmp_path = trial_setup
    victim = sorted((tmp_path / "dataset" / "data" / "train").rglob("*.png"))[0]
    victim.write_bytes(b"not a png")
    record = run()
    assert record["failure"]["reason"] == "dataset"
    assert str(victim) in record["failure"]["message"]
    assert record["metrics"]["samples_trained"] is None  # nothing was trained


def test_trial_at_its_time_limit_stops_with_a_timeout_record(trial_setup):
    _, run, tmp_path = trial_setup
    record = run(Deadline(time.time()))
    assert record["status"] == "failed"
    assert record["failure"]["reason"] == "timeout"
    assert (tmp_path / "record.json").exists()


def test_trial_records_its_measured_roofline(trial_setup):
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


def test_a_one_process_trial_records_its_canaries_but_no_collective(trial_setup, capfd):
    """The canaries of a 1x1 trial: the roofline reused as the matmul canary, the triad and the read of its
    staged dataset; no all-reduce for one process. Every value positive with its unit and repeat noise."""
    _, run, _ = trial_setup
    record = run()
    assert record["status"] == "ok", record["failure"]
    canaries = record["canaries"]
    assert list(canaries) == ["matmul_flops_per_s", "memory_triad_bytes_per_s", "dataset_read_bytes_per_s"]
    assert canaries["matmul_flops_per_s"]["value"] == record["roofline"]["peak_flops_per_s"]  # one process: reused
    assert {entry["unit"] for entry in canaries.values()} == {"FLOP/s", "B/s"}
    for entry in canaries.values():
        assert entry["value"] > 0 and entry["repeats"] >= 3 and entry["repeat_cv"] >= 0
    assert "canary allreduce_bus_bytes_per_s" not in capfd.readouterr().err  # not tried: not a failure to log
