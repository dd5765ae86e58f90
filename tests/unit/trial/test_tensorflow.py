"""The TensorFlow/Keras path: model checks, FLOP counting, and a Keras trial writing the torch trial's record schema."""

import pytest
import yaml

from mlcampaign.analysis.frame import flatten
from mlcampaign.data.manifest import ID_FILE
from mlcampaign.data.staging import stage_into
from mlcampaign.measure.flops import count_flops
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.registry import check_model_options
from mlcampaign.records.files import read_record
from mlcampaign.trial.protocol import run_trial
from mlcampaign.trial.torch.models import get

from conftest import REPO


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("deepcam", {}, "no Keras implementation of model 'deepcam'"),
        ("resnet50", {"width_per_group": 16}, "bottleneck width 64, not model option width_per_group=16"),
        ("resnet50", {"image_size": 16}, "needs image_size >= 32"),
        ("cosmoflow", {"filters": 8}, r"has no option\(s\) \['filters'\]"),
    ],
)
def test_models_keras_cannot_build_are_refused(name, options, message):
    with pytest.raises(ValueError, match=message):
        check_model_options(name, options, "tensorflow")


TINY = {
    "resnet50-synthetic": {
        "dataset": {
            "name": "synthetic-tf",
            "source": {"options": {"num_classes": 2, "train_per_class": 8, "val_per_class": 2, "image_size": 32}},
        },
        "model": {"options": {"image_size": 32, "num_classes": 2, "width_per_group": 64}},
        "training": {"epochs_max": 1, "global_batch_size": 8, "warmup_steps": 1},
    }
}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """One Keras and one torch trial of the same benchmark (one process each)."""
    tmp_path = tmp_path_factory.mktemp("tf")
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text()) | {
        "benchmarks": ["resnet50-synthetic"],
        "trials": 1,
        "benchmark_overrides": TINY,
    }
    config["matrix"]["frameworks"] = ["tensorflow", "torch"]
    campaign = load_campaign(config, REPO / "config")
    benchmark = campaign.benchmarks["resnet50-synthetic"]
    stage_into(benchmark["dataset"], tmp_path / "dataset")
    result = {}
    for row in campaign.trials():
        spec = campaign.trial_spec(row, "test-run", "local")
        out = tmp_path / row["framework"]
        run_trial(spec, tmp_path / "dataset" / ID_FILE, out / "record.json", out / "mllog.txt")
        result[row["framework"]] = read_record(out / "record.json")
    return result


def test_keras_trial_trains_and_records(records):
    record = records["tensorflow"]
    assert record["status"] == "ok", record["failure"]
    assert record["trial"]["cell"] == "1x1-fp32-tensorflow"
    assert record["benchmark"]["channels_last"] is True
    assert record["flops"]["method"].startswith("tf.profiler")
    assert record["flops"]["train_per_sample"] > 2 * record["flops"]["forward_per_sample"] > 0
    assert record["metrics"]["samples_trained"] == 16
    assert record["metrics"]["throughput_samples_per_s"] > 0
    assert record["distributed"]["world_size"] == 1
    assert record["distributed"]["weights_consistent"] is True
    # Keras trials measure the machine too (the torch roofline and triad on the trial's device, its dataset read).
    assert set(record["canaries"]) == {"matmul_flops_per_s", "memory_triad_bytes_per_s", "dataset_read_bytes_per_s"}


def test_keras_and_torch_records_have_the_same_schema(records):
    tables = {framework: flatten([record]) for framework, record in records.items()}
    assert list(tables["tensorflow"].columns) == list(tables["torch"].columns)
    assert records["torch"]["trial"]["seed"] == records["tensorflow"]["trial"]["seed"]
    # keras.applications' ResNet v1 and torchvision's v1.5 differ in where they stride: a few % of FLOPs.
    ratio = records["tensorflow"]["flops"]["forward_per_sample"] / records["torch"]["flops"]["forward_per_sample"]
    assert 0.9 < ratio < 1.0


# After the trials: TensorFlow takes its thread settings only before its first op in a process.
def test_keras_cosmoflow_counts_the_flops_of_the_torch_cosmoflow():
    """Same network in both frameworks: TF's profiler (with the 3D-gradient correction) and torch's counter agree."""
    from mlcampaign.trial.keras import models as keras_models
    from mlcampaign.trial.keras.flops import count_keras_flops

    options = {"input_size": 16, "base_filters": 4, "n_conv_layers": 2, "fc1_size": 8, "fc2_size": 8}
    keras_count = count_keras_flops(keras_models.get("cosmoflow").build, options, (16, 16, 16, 4))
    torch_count = count_flops(get("cosmoflow").build, options, (4, 16, 16, 16))
    assert keras_count == torch_count
    assert keras_count.train_per_sample > 2 * keras_count.forward_per_sample  # the backward pass is counted
