"""Extreme weather analytics (HPC AI500): generator boxes, HDF5 reader, mAP wiring, full-size step, FLOPs, trial."""

import h5py
import numpy as np
import pytest
import torch
import yaml
from torchvision.models.detection import fasterrcnn_resnet50_fpn

from mlcampaign.benchmarks.extreme_weather.flop_check import closed_form_flops
from mlcampaign.benchmarks.extreme_weather.generator import (
    ATMOSPHERIC_RIVER,
    EXTREME_WEATHER_CHANNELS,
    TROPICAL_CYCLONE,
    extreme_weather_events,
    extreme_weather_snapshot,
)
from mlcampaign.data.formats import open_split
from mlcampaign.data.manifest import ID_FILE, DatasetError
from mlcampaign.data.staging import stage_into
from mlcampaign.measure.flops import analytic_flops, count_flops
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.config_files import ConfigError
from mlcampaign.trial.protocol import run_trial
from mlcampaign.trial.torch import models

from conftest import REPO

SPEC = models.get("extreme_weather")
# A cheap detector of the same kind: one residual block per stage, a narrow pyramid and box head.
SMALL = {
    "backbone": "resnet18",
    "stage_blocks": [1, 1, 1, 1],
    "fpn_channels": 32,
    "representation_size": 128,
    "rpn_pre_nms_top_n_train": 256,
    "rpn_pre_nms_top_n_test": 128,
    "rpn_post_nms_top_n_train": 128,
    "rpn_post_nms_top_n_test": 64,
    "box_batch_size_per_image": 32,
    "box_detections_per_img": 20,
}


# -- generator ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cyclones, rivers, label", [(1, 0, TROPICAL_CYCLONE), (0, 1, ATMOSPHERIC_RIVER)])
def test_each_box_is_the_tight_box_of_the_pixels_its_event_changed(cyclones, rivers, label):
    """The background is drawn before the events, so the same seed without events isolates what the event drew."""
    seed = 11
    images, boxes, labels = extreme_weather_snapshot(np.random.default_rng(seed), 64, 96, cyclones, rivers)
    background, no_boxes, _ = extreme_weather_snapshot(np.random.default_rng(seed), 64, 96, 0, 0)
    assert no_boxes.shape == (0, 4)
    rows, cols = np.nonzero((images != background).any(axis=0))
    assert len(rows) > 0
    assert labels.tolist() == [label]
    assert boxes.tolist() == [[cols.min(), rows.min(), cols.max() + 1, rows.max() + 1]]
    assert images.shape == (len(EXTREME_WEATHER_CHANNELS), 64, 96) and images.dtype == np.float32


def test_several_events_are_all_boxed_and_nothing_outside_the_boxes_changed():
    seed, shape = 5, (64, 96)
    images, boxes, labels = extreme_weather_snapshot(np.random.default_rng(seed), *shape, cyclones=2, rivers=1)
    background, _, _ = extreme_weather_snapshot(np.random.default_rng(seed), *shape, cyclones=0, rivers=0)
    assert sorted(labels.tolist()) == sorted([TROPICAL_CYCLONE] * 2 + [ATMOSPHERIC_RIVER])
    covered = np.zeros(shape, dtype=bool)
    for x0, y0, x1, y1 in boxes.astype(int):
        covered[y0:y1, x0:x1] = True
    changed = (images != background).any(axis=0)
    assert changed.any() and not (changed & ~covered).any()


# -- HDF5 layout and reader ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("extreme_weather")
    extreme_weather_events(root, seed=3, train_samples=4, val_samples=2, height=64, width=96)
    return root


def test_reader_standardises_with_the_training_statistics_and_returns_detection_targets(dataset):
    shape = (16, 64, 96)
    train = open_split("extreme_weather_hdf5", dataset, "train", shape)
    assert len(train) == 4 and len(open_split("extreme_weather_hdf5", dataset, "val", shape)) == 2
    images = torch.stack([train[i][0] for i in range(len(train))])
    per_channel = images.transpose(0, 1).reshape(16, -1).double()
    assert per_channel.mean(dim=1).abs().max() < 1e-3
    assert per_channel.std(dim=1).sub(1).abs().max() < 1e-3
    with h5py.File(train.files[0], "r") as handle:
        stored_boxes, stored_labels = handle["boxes"][...], handle["labels"][...]
    _, target = train[0]
    assert torch.equal(target["boxes"], torch.from_numpy(stored_boxes))
    assert target["labels"].dtype == torch.int64 and target["labels"].tolist() == stored_labels.tolist()


def test_reader_names_the_file_of_a_bad_sample(dataset, tmp_path):
    shape = (16, 64, 96)
    with pytest.raises(DatasetError, match="do not match the model"):
        open_split("extreme_weather_hdf5", dataset, "train", (16, 32, 96))[0]
    victim = open_split("extreme_weather_hdf5", dataset, "val", shape).files[0]
    with h5py.File(victim, "a") as handle:
        del handle["boxes"]
        handle["boxes"] = np.array([[10.0, 5.0, 120.0, 20.0]], dtype=np.float32)  # beyond the 96-pixel width
        del handle["labels"]
        handle["labels"] = np.array([2])
    with pytest.raises(DatasetError, match=str(victim)):
        open_split("extreme_weather_hdf5", dataset, "val", shape)[0]


def test_collate_keeps_one_target_per_image():
    samples = [
        (torch.zeros(16, 32, 32), {"boxes": torch.zeros(n, 4), "labels": torch.ones(n, dtype=torch.int64)})
        for n in (0, 2)
    ]
    images, targets = SPEC.collate(samples)
    assert images.shape == (2, 16, 32, 32)
    assert [len(target["boxes"]) for target in targets] == [0, 2]


# -- mAP@0.5 -----------------------------------------------------------------------------------
def _detections(boxes, scores, labels):
    return {
        "boxes": torch.tensor(boxes, dtype=torch.float32),
        "scores": torch.tensor(scores),
        "labels": torch.tensor(labels),
    }


def test_map50_of_a_hand_made_case():
    """Class 2: two ground truths; detections by score: hit (IoU 0.6), false alarm, hit -> precision 1 up to
    recall 0.5, 2/3 up to recall 1; COCO's 101-point interpolation gives (51 + 50 x 2/3) / 101. Class 4: its
    only detection overlaps its ground truth with IoU 0.4 < 0.5 -> AP 0. mAP = the mean over the 2 classes."""
    truth = [
        {"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]]), "labels": torch.tensor([2, 4])},
        {"boxes": torch.tensor([[40.0, 0.0, 50.0, 10.0]]), "labels": torch.tensor([2])},
    ]
    predictions = [
        # Against the image's class-2 truth: IoU 0.6 (a 10 x 6 box inside it), then nothing; class 4: IoU 0.4.
        _detections(
            [[0.0, 0.0, 10.0, 6.0], [60.0, 60.0, 70.0, 70.0], [20.0, 20.0, 30.0, 24.0]], [0.9, 0.8, 0.95], [2, 2, 4]
        ),
        _detections([[40.0, 0.0, 50.0, 10.0]], [0.7], [2]),
    ]
    metric = SPEC.quality_metric()
    for prediction, target in zip(predictions, truth, strict=True):
        metric.update([prediction], [target])
    values = {key: value.item() for key, value in metric.compute().items() if value.numel() == 1}
    expected = ((51 + 50 * 2 / 3) / 101 + 0.0) / 2
    assert SPEC.eval_finalize(values) == {"map50": pytest.approx(expected, abs=1e-6)}


# -- model -------------------------------------------------------------------------------------
def test_full_size_model_is_torchvisions_faster_rcnn_with_a_16_channel_stem():
    with torch.device("meta"):
        ours = SPEC.build()
        reference = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=5)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in reference.parameters()) + (16 - 3) * 64 * 7 * 7
    assert ours.backbone.body.conv1.in_channels == 16
    assert ours.transform.image_mean == [0.0] * 16 and ours.transform.image_std == [1.0] * 16


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="image_height=100"):
        SPEC.build(image_height=100)
    with pytest.raises(ValueError, match="backbone='vgg'"):
        SPEC.build(backbone="vgg")


def test_one_training_step_at_full_size_on_one_image(tmp_path):
    """768 x 1152 x 16 from the generator through the reader; the detector sees it unresized."""
    extreme_weather_events(tmp_path, seed=1, train_samples=1, val_samples=1)
    shape = SPEC.sample_shape()
    image, target = open_split("extreme_weather_hdf5", tmp_path, "train", shape)[0]
    torch.manual_seed(0)
    model = SPEC.build(**SMALL)
    seen = []
    model.backbone.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images, targets = SPEC.collate([(image, target)])
    before = model.backbone.body.conv1.weight.detach().clone()
    losses = model(images, targets)
    assert set(losses) == {"loss_objectness", "loss_rpn_box_reg", "loss_classifier", "loss_box_reg"}
    loss = SPEC.criterion({})(losses, targets)
    assert torch.isfinite(loss)
    loss.backward()
    optimizer.step()
    assert not torch.equal(before, model.backbone.body.conv1.weight)
    assert seen == [(1, *shape)]


# -- FLOPs ---------------------------------------------------------------------------------------
def test_full_size_flops_match_the_analytic_and_closed_form_counts():
    """Training at 512 sampled regions per image, evaluation at 1000 proposals per image (torchvision's defaults)."""
    shape = SPEC.sample_shape()
    counted = count_flops(SPEC.counted_work, {}, shape)
    with torch.device("meta"):
        work = SPEC.counted_work()
    assert counted.train_per_sample == analytic_flops(work, shape).train_per_sample
    train, forward = closed_form_flops()
    assert counted.forward_per_sample == pytest.approx(forward, rel=1e-3)
    # Backward: weight and input gradients each as costly as the forward, except the stem's input gradient.
    assert counted.train_per_sample == pytest.approx(train, rel=1e-3)


def test_region_counts_set_the_box_head_flops():
    shape = (16, 64, 96)
    fewer = count_flops(SPEC.counted_work, SMALL, shape)
    more = count_flops(
        SPEC.counted_work, SMALL | {"box_batch_size_per_image": 64, "rpn_post_nms_top_n_test": 96}, shape
    )
    per_region = 2 * (32 * 7 * 7 * 128 + 128 * 128 + 128 * 5 + 128 * 4 * 5)
    assert more.forward_per_sample - fewer.forward_per_sample == 32 * per_region
    assert more.train_per_sample - fewer.train_per_sample == 3 * 32 * per_region


# -- campaign and trial --------------------------------------------------------------------------
def _default_campaign_with_extreme_weather_only() -> tuple[dict, dict]:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    overrides = {"extreme-weather": config["benchmark_overrides"]["extreme-weather"]}
    return config | {"benchmarks": ["extreme-weather"], "trials": 1, "benchmark_overrides": overrides}, overrides


def test_tensorflow_cells_are_refused_when_planning():
    config, _ = _default_campaign_with_extreme_weather_only()
    config["matrix"] |= {"frameworks": ["torch", "tensorflow"]}
    with pytest.raises(ConfigError, match="no Keras implementation of model 'extreme_weather'"):
        load_campaign(config, REPO / "config")


def test_trial_trains_and_records_map50(tmp_path):
    config, overrides = _default_campaign_with_extreme_weather_only()
    overrides["extreme-weather"]["dataset"] = {
        "name": "extreme-weather-unit",
        "source": {"options": {"seed": 0, "train_samples": 16, "val_samples": 6, "height": 64, "width": 96}},
    }
    overrides["extreme-weather"]["training"] |= {"epochs_max": 1, "warmup_steps": 1}
    campaign = load_campaign(config, REPO / "config")
    spec = campaign.trial_spec(next(campaign.trials()), "test-run", "local")
    # One intra-op thread: this tiny trial gains nothing from two, which wait on each other on a busy machine.
    spec["system"] = spec["system"] | {"threads_per_process": 1}
    benchmark = spec["benchmark"]
    stage_into(benchmark["dataset"], tmp_path / "dataset")
    record = run_trial(spec, tmp_path / "dataset" / ID_FILE, tmp_path / "r.json", tmp_path / "log.txt")
    assert record["status"] == "ok", record["failure"]
    metrics = record["metrics"]
    assert record["benchmark"]["target_metric"] == "map50"
    assert metrics["samples_trained"] == 16 and metrics["samples_evaluated"] == 6
    assert 0.0 <= metrics["achieved_quality"] <= 1.0
    assert (
        record["flops"]["train_per_sample"]
        == count_flops(SPEC.counted_work, benchmark["model"]["options"], (16, 64, 96)).train_per_sample
    )
    assert '"key": "eval_accuracy"' in (tmp_path / "log.txt").read_text()
