"""FLOP counts: the corrected counter against hand counts, a per-layer analytic count and closed forms per model,
and HPC AI500's FLOPs per training image recomputed from its inputs."""

import pytest
import torch
import torchvision
import yaml
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from mlcampaign.measure.flops import CORRECTED_FORMULAS, analytic_flops, count_flops
from mlcampaign.plan import registry
from mlcampaign.plan.config import load_campaign
from mlcampaign.trial.torch import models

from conftest import REPO


def _train_flops(module: nn.Module, inputs: torch.Tensor, corrected: bool) -> dict:
    with FlopCounterMode(display=False, custom_mapping=CORRECTED_FORMULAS if corrected else None) as counter:
        module(inputs).sum().backward()
    return {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}


def _depthwise():
    with torch.device("meta"):
        return nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False), torch.empty(1, 64, 32, 32, requires_grad=True)


DEPTHWISE_MACS = 32 * 32 * 64 * 9  # each output value: 9 taps of its own channel


def test_stock_counter_overcounts_the_weight_gradient_of_grouped_convolutions():
    """The trap this module corrects (torch 2.14): the weight gradient is counted as if ungrouped, x groups."""
    conv, inputs = _depthwise()
    stock = _train_flops(conv, inputs, corrected=False)
    assert stock["aten.convolution"] == 2 * DEPTHWISE_MACS
    assert stock["aten.convolution_backward"] == 2 * DEPTHWISE_MACS + 64 * 2 * DEPTHWISE_MACS


def test_corrected_backward_of_a_depthwise_convolution_costs_twice_its_forward():
    conv, inputs = _depthwise()
    corrected = _train_flops(conv, inputs, corrected=True)
    assert corrected["aten.convolution"] == 2 * DEPTHWISE_MACS
    assert corrected["aten.convolution_backward"] == 4 * DEPTHWISE_MACS


def test_backward_without_input_gradient_counts_only_the_weight_gradient():
    with torch.device("meta"):
        conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        inputs = torch.empty(2, 3, 16, 16)  # raw input: no gradient needed
    corrected = _train_flops(conv, inputs, corrected=True)
    assert corrected["aten.convolution_backward"] == 2 * (2 * 16 * 16 * 8 * 3 * 9)


# Each case puts a trainable layer in front, so the layer under test also computes its input gradient.
@pytest.mark.parametrize(
    "build, shape",
    [
        (
            lambda: nn.Sequential(nn.Conv2d(16, 16, 1), nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=4)),
            (16, 33, 33),
        ),
        (
            lambda: nn.Sequential(nn.Conv2d(24, 24, 1), nn.Conv2d(24, 24, 3, padding=4, dilation=4, groups=24)),
            (24, 20, 28),
        ),
        (
            lambda: nn.Sequential(
                nn.Conv2d(32, 32, 1), nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1, output_padding=1)
            ),
            (32, 12, 10),
        ),
        (lambda: nn.Sequential(nn.Conv2d(32, 32, 1), nn.ConvTranspose2d(32, 32, 3, stride=2, groups=8)), (32, 9, 9)),
        (lambda: nn.Sequential(nn.Conv3d(4, 4, 1), nn.Conv3d(4, 8, 3, padding="same")), (4, 10, 10, 10)),
        (lambda: nn.Sequential(nn.Linear(50, 50), nn.Linear(50, 7)), (50,)),
    ],
)
def test_counter_agrees_with_analytic_count_per_layer_type(build, shape):
    with torch.device("meta"):
        model = build()
    assert count_flops(build, {}, shape) == analytic_flops(model, shape)


# -- full-size models: counter vs per-layer analytic count vs closed forms ---------------------
CROSS_CHECKED = sorted(name for name, model in registry.models().items() if model.closed_form_flops)


def test_every_model_has_a_closed_form_cross_check():
    assert sorted(registry.models()) == CROSS_CHECKED


@pytest.mark.parametrize("name", CROSS_CHECKED)
def test_full_size_flops_match_the_analytic_and_closed_form_counts(name):
    """The counter's count of each registered model (its counted work where its forward cannot run on meta
    tensors) against a per-layer analytic count and the closed form its benchmark folder derives from the
    published architecture."""
    spec = models.get(name)
    counted_work = spec.counted_work or spec.build
    shape = spec.sample_shape()
    counted = count_flops(counted_work, {}, shape)
    with torch.device("meta"):
        model = counted_work()
    assert counted.train_per_sample == pytest.approx(analytic_flops(model, shape).train_per_sample, rel=0.01)
    if spec.counted_work is None:  # a detector's counted work evaluates more regions than it trains on
        assert counted.forward_per_sample == pytest.approx(analytic_flops(model, shape).forward_per_sample, rel=0.01)
    train, forward = registry.resolve(registry.models()[name].closed_form_flops)()
    assert counted.forward_per_sample == pytest.approx(forward, rel=0.01)
    assert counted.train_per_sample == pytest.approx(train, rel=0.01)


def test_deepcam_count_would_be_far_off_without_the_correction():
    spec = models.get("deepcam")
    shape = spec.sample_shape()
    with torch.device("meta"):
        model, inputs = spec.build(), torch.empty(1, *shape)
    with FlopCounterMode(display=False) as stock:
        model(inputs).sum().backward()
    corrected = count_flops(spec.build, {}, shape).train_per_sample
    assert stock.get_total_flops() > 1.5 * corrected


# -- HPC AI500's FLOPs per training image, recomputed from its inputs ----------------------------
def resnet50_v1(**options) -> nn.Module:
    """ResNet-50 v1 (He et al. 2016): torchvision's v1.5 with the stride of each downsampling block moved
    from its 3x3 convolution back to its first 1x1 convolution (the shortcut keeps its own stride)."""
    model = torchvision.models.resnet50(weights=None, **options)
    for stage in (model.layer2, model.layer3, model.layer4):
        block = stage[0]
        block.conv1.stride, block.conv2.stride = block.conv2.stride, (1, 1)
    return model


def test_hpcai500_flops_per_training_image_is_three_resnet50_v1_forward_passes():
    """The ~23.0 GFLOP per training image of HPC AI500's ranking (shared/REFERENCES.md), the figure the
    hpcai500 campaign counts, recomputed from its inputs: ResNet-50 v1 at 224 x 224 with 1000 classes,
    convolutions and linear layers counted with a multiply-add as 2 FLOPs, training = 3 x forward."""
    campaign = load_campaign(
        yaml.safe_load((REPO / "config" / "campaigns" / "hpcai500.yaml").read_text()), REPO / "config"
    )
    study = campaign.benchmarks["resnet50"]["valid_flops"]["counting"]["train_flops_per_sample"]
    shape = (3, 224, 224)
    v1 = count_flops(resnet50_v1, {"num_classes": 1000}, shape)
    with torch.device("meta"):
        assert v1 == analytic_flops(resnet50_v1(num_classes=1000), shape)
    assert 3 * v1.forward_per_sample == pytest.approx(study, rel=0.02)  # 23.15 GFLOP
    assert v1.train_per_sample == pytest.approx(study, rel=0.02)  # exact count: 22.91 GFLOP
    # The v1.5 that the project runs is outside 2 % either way: the study's figure is not its count.
    v15 = count_flops(models.get("resnet50").build, {"num_classes": 1000}, shape)
    assert 3 * v15.forward_per_sample > 1.02 * study and v15.train_per_sample > 1.02 * study
