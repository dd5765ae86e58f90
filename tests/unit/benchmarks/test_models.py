"""The benchmark models: parameter counts at full size, training steps, losses, metrics, options."""

import math

import pytest
import torch
from torch import nn
from torchvision.models import ResNet50_Weights

from mlcampaign.benchmarks.cosmoflow import model as cosmoflow
from mlcampaign.benchmarks.deepcam import model as deepcam
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.hyperparameters import lr_factor
from mlcampaign.plan.registry import models as registered_models
from mlcampaign.trial.torch import models

from conftest import REPO


def _parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _conv(c_in: int, c_out: int, k: int, bias: bool = False) -> int:
    return k * k * c_in * c_out + (c_out if bias else 0)


def _sep_bn(c_in: int, c_out: int) -> int:
    """Depthwise 3x3 + pointwise 1x1 (no biases) + BatchNorm (scale and shift)."""
    return 9 * c_in + c_in * c_out + 2 * c_out


def deepcam_parameters() -> int:
    """Parameters of the reference DeepLabv3+ (16 inputs, 3 classes), counted layer by layer."""
    bn = 2  # BatchNorm scale and shift per channel

    def block(c_in: int, c_out: int, convs: list[tuple[int, int]]) -> int:
        """Separable convolutions with BN, a last separable convolution without BN, a 1x1 projection skip with BN."""
        return sum(_sep_bn(a, b) for a, b in convs) + 9 * c_out + c_out * c_out + _conv(c_in, c_out, 1) + bn * c_out

    entry = _conv(16, 32, 3) + bn * 32 + _conv(32, 64, 3) + bn * 64
    entry += block(64, 128, [(64, 128), (128, 128)]) + block(128, 256, [(128, 256), (256, 256)])
    entry += block(256, 728, [(256, 728), (728, 728)])
    middle = 16 * 3 * _sep_bn(728, 728)
    exit_flow = block(728, 1024, [(728, 728), (728, 1024)])
    exit_flow += _sep_bn(1024, 1536) + _sep_bn(1536, 1536) + _sep_bn(1536, 2048)
    aspp = _conv(2048, 256, 1) + 3 * _conv(2048, 256, 3) + 4 * bn * 256
    aspp += _conv(2048, 256, 1) + 2 * 256 + _conv(1280, 256, 1) + bn * 256  # image pooling (+ affine), fusion
    decoder = _conv(128, 48, 1) + bn * 48 + 2 * (_conv(256, 256, 3) + bn * 256)  # low-level 1x1, two deconvolutions
    decoder += _conv(304, 256, 3) + bn * 256 + _conv(256, 256, 3) + bn * 256 + _conv(256, 256, 1, bias=True)
    decoder += _conv(256, 256, 3) + bn * 256 + _conv(256, 3, 3)  # deconvolution, last deconvolution to classes
    return entry + middle + exit_flow + aspp + decoder


def cosmoflow_parameters() -> int:
    convs = sum(27 * c_in * c_out + c_out for c_in, c_out in [(4, 32), (32, 64), (64, 128), (128, 256), (256, 512)])
    return convs + (4**3 * 512 * 128 + 128) + (128 * 64 + 64) + (64 * 4 + 4)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("cosmoflow", cosmoflow_parameters()),
        ("deepcam", deepcam_parameters()),
        ("resnet50", ResNet50_Weights.IMAGENET1K_V1.meta["num_params"]),
    ],
)
def test_full_size_parameter_counts(name, expected):
    with torch.device("meta"):
        model = models.get(name).build()
    assert _parameters(model) == expected


def test_documented_full_size_counts_are_the_measured_ones():
    """docs/benchmarks.md quotes these numbers; they must stay true."""
    text = (REPO / "docs" / "benchmarks.md").read_text()
    for count in (cosmoflow_parameters(), deepcam_parameters(), ResNet50_Weights.IMAGENET1K_V1.meta["num_params"]):
        assert f"{count:,}" in text


# The registered models whose training step runs on a batch of inputs alone (a detector takes its targets in
# its forward and selects regions by value: mlcampaign/benchmarks/extreme_weather's own tests step it).
DENSE = sorted(name for name in registered_models() if models.get(name).example_targets is not None)


def test_only_detectors_leave_the_dense_checks():
    assert {name for name in registered_models() if name not in DENSE} == {
        name for name in registered_models() if models.get(name).forward_takes_targets
    }


@pytest.mark.parametrize("name", DENSE)
def test_full_size_training_step_on_meta_tensors(name):
    """Shapes, autograd graph and optimizer step of the full-size model, without allocating memory."""
    spec = models.get(name)
    with torch.device("meta"):
        model = spec.build()
        inputs = torch.empty(2, *spec.sample_shape())
        targets = spec.example_targets(2, spec.sample_shape(), "meta")
    loss = spec.criterion({})(model(inputs), targets)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).step()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("name", DENSE)
def test_full_size_training_step_on_real_tensors(name):
    """One real SGD step of the full-size model at batch 1 (DeepCAM: ~6 GB and about a minute on 2 cores)."""
    torch.manual_seed(0)
    spec = models.get(name)
    model = spec.build()
    model.train()
    shape = spec.sample_shape()
    inputs = torch.randn(1, *shape)
    targets = spec.example_targets(1, shape)
    before = [p.detach().clone() for p in model.parameters()]
    loss = spec.criterion({})(model(inputs), targets)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.01).step()
    assert math.isfinite(loss.item())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


# -- CosmoFlow ---------------------------------------------------------------------------------
def test_cosmoflow_layout_and_output_range():
    model = cosmoflow.SPEC.build(input_size=32, base_filters=4)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv3d)]
    assert [c.out_channels for c in convs] == [4, 8, 16, 32, 64]
    assert all(c.kernel_size == (3, 3, 3) and c.padding == "same" for c in convs)
    assert [m.negative_slope for m in model.modules() if isinstance(m, nn.LeakyReLU)] == [0.3] * 7
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.5, 0.5]
    assert [m.out_features for m in model.modules() if isinstance(m, nn.Linear)] == [128, 64, 4]
    outputs = model(torch.randn(3, 4, 32, 32, 32) * 100)
    assert outputs.shape == (3, 4)
    assert outputs.abs().max() <= 1.2


def test_cosmoflow_rejects_an_input_size_the_pooling_cannot_halve():
    with pytest.raises(ValueError, match="input_size=48"):
        cosmoflow.SPEC.build(input_size=48)


def test_cosmoflow_mae_sums_over_samples_and_parameters():
    outputs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 0.0, 0.0]])
    targets = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.5, -0.5, 0.5, -0.5]])
    half = {k: float(v) for k, v in cosmoflow.eval_sums(outputs[:1], targets[:1]).items()}
    other = {k: float(v) for k, v in cosmoflow.eval_sums(outputs[1:], targets[1:]).items()}
    totals = {k: half[k] + other[k] for k in half}
    assert cosmoflow.eval_finalize(totals)["mae"] == pytest.approx((1.0 + 2.0) / 8)


def test_cosmoflow_schedule_is_the_reference_warmup_and_step_decay():
    campaign = load_campaign(
        {
            "campaign": "schedule",
            "seed": 1,
            "trials": 1,
            "systems": ["local-cpu"],
            "benchmarks": ["cosmoflow"],
            "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
        },
        REPO / "config",
    )
    schedule = campaign.benchmarks["cosmoflow"]["training"]["schedule"]
    steps_per_epoch = 64  # 2048 samples / batch 32
    factor = lr_factor(schedule, steps_per_epoch, steps_per_epoch * 100)
    assert factor(0) == pytest.approx(1 / (4 * steps_per_epoch))  # linear warm-up over 4 epochs
    assert factor(2 * steps_per_epoch - 1) == pytest.approx(0.5)
    assert factor(4 * steps_per_epoch) == 1.0
    assert factor(32 * steps_per_epoch - 1) == 1.0
    assert factor(32 * steps_per_epoch) == 0.25
    assert factor(64 * steps_per_epoch) == 0.125


# -- DeepCAM -----------------------------------------------------------------------------------
def test_deepcam_output_and_separable_convolutions():
    model = deepcam.SPEC.build(image_height=64, image_width=96, width=0.125, middle_blocks=1)
    assert model(torch.randn(2, 16, 64, 96)).shape == (2, 3, 64, 96)
    with torch.device("meta"):
        full = deepcam.SPEC.build()
    depthwise = [m for m in full.modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert len(depthwise) == 3 * 3 + 16 * 3 + 3 + 3  # entry blocks, middle blocks, exit block, exit convolutions
    assert all(m.groups == m.in_channels == m.out_channels for m in depthwise)
    assert sorted({m.dilation for m in full.modules() if isinstance(m, nn.Conv2d)}) == [
        (1, 1),
        (2, 2),
        (6, 6),
        (12, 12),
        (18, 18),
    ]


def test_deepcam_rejects_sizes_that_are_not_multiples_of_the_output_stride():
    with pytest.raises(ValueError, match="image_width=100"):
        deepcam.SPEC.build(image_height=64, image_width=100)


def test_deepcam_loss_is_the_reference_weighted_cross_entropy_averaged_over_pixels():
    weights = deepcam.class_weights()
    assert weights.tolist() == pytest.approx([f**-0.125 for f in deepcam.CLASS_FREQUENCIES])
    torch.manual_seed(0)
    logits, targets = torch.randn(2, 3, 4, 5), torch.randint(0, 3, (2, 4, 5))
    per_pixel = -torch.log_softmax(logits, dim=1).gather(1, targets[:, None]).squeeze(1) * weights[targets]
    assert deepcam.criterion({})(logits, targets).item() == pytest.approx(per_pixel.mean().item())


def test_deepcam_iou_averages_classes_per_sample_and_counts_absent_classes_as_one():
    targets = torch.tensor([[[0, 0, 1, 1]], [[0, 0, 0, 0]]])
    predictions = torch.tensor([[[0, 1, 1, 1]], [[0, 0, 0, 0]]])
    logits = nn.functional.one_hot(predictions, 3).permute(0, 3, 1, 2).float()
    sums = {k: float(v) for k, v in deepcam.eval_sums(logits, targets).items()}
    # Sample 1: background 1/2, cyclone 2/3, river absent -> 1. Sample 2: background 1, others absent -> 1.
    expected = ((0.5 + 2 / 3 + 1) / 3 + 1.0) / 2
    assert deepcam.eval_finalize(sums)["iou"] == pytest.approx(expected)


def test_registry_serves_every_registered_model():
    for name in registered_models():
        spec = models.get(name)
        assert len(spec.sample_shape()) in (1, 3, 4)
