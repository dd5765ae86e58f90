"""DeepCAM: DeepLabv3+ segmentation of extreme weather (background, tropical cyclone, atmospheric river).

Follows the MLPerf HPC reference (mlcommons/hpc, deepcam/src/deepCam/architecture/
deeplab_xception.py) at output stride 16:

- encoder: the modified aligned Xception. Entry: conv 3x3/2 (32), conv 3x3 (64), then blocks
  64->128, 128->256, 256->728 (each two depthwise-separable convolutions + a separable stride-2
  convolution, with a strided 1x1 projection as skip). Middle: ``middle_blocks`` (16) residual
  blocks of three separable 728->728 convolutions. Exit: block 728->1024 (separable 728->728,
  728->1024, 1024->1024; projection skip), then separable 1024->1536, 1536->1536, 1536->2048
  at dilation 2. Every separable convolution is a depthwise 3x3 (groups = channels, 'same'
  padding at its dilation) followed by a pointwise 1x1, both without bias.
- ASPP bottleneck on the 2048 features: 1x1 and 3x3 at dilations 6, 12, 18 (256 each, BN,
  ReLU) and image pooling (1x1 conv, per-channel affine, ReLU, broadcast back), concatenated
  and fused by 1x1 -> 256, BN, ReLU.
- decoder: two 3x3/2 transposed convolutions (256) back to 1/4 resolution, concatenation with
  the low-level features of the first entry block (1x1 -> 48, BN, ReLU), 3x3 -> 256, 3x3 -> 256,
  1x1 -> 256 (with bias), a 3x3/2 transposed convolution (256) and a last 3x3/2 transposed
  convolution to the classes (no bias, no BN).

Options: ``in_channels`` (16), ``num_classes`` (3), ``image_height`` x ``image_width``
(768 x 1152 at MLPerf spec; multiples of 16), ``width`` (fraction of the reference channel
counts, 1.0 = reference; smaller values give a cheaper network of the same depth for CPU
runs) and ``middle_blocks`` (16).

Loss: cross-entropy weighted per class by frequency^-0.125 with the reference's class
frequencies, averaged over pixels (the reference's ``CELoss``). Quality: mean IoU per sample,
averaged over classes, where a class absent from both prediction and label scores 1 (the
reference's ``compute_score``), averaged over validation samples.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from mlcampaign.trial.torch.models import ModelSpec

OUTPUT_STRIDE = 16
ASPP_DILATIONS = (6, 12, 18)
# Pixel frequencies of background, tropical cyclones and atmospheric rivers in the DeepCAM
# training set, and the exponent of the loss weights (deepcam/src/deepCam/train.py).
CLASS_FREQUENCIES = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
CLASS_WEIGHT_EXPONENT = -0.125


class SeparableConv(nn.Sequential):
    """Depthwise 3x3 ('same' padding at its dilation) then pointwise 1x1, no biases."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, dilation: int = 1):
        super().__init__(
            nn.Conv2d(
                in_channels, in_channels, 3, stride, padding=dilation, dilation=dilation, groups=in_channels, bias=False
            ),
            nn.Conv2d(in_channels, out_channels, 1, bias=False),
        )


class XceptionBlock(nn.Module):
    """Residual block of separable convolutions (BN and ReLU between them, none after the last)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        reps: int,
        stride: int = 1,
        grow_first: bool = True,
        extra_conv: bool = False,
        relu_after: bool = True,
    ):
        super().__init__()
        widths = [in_channels] + [out_channels if grow_first else in_channels] * (reps - 1) + [out_channels]
        layers: list[nn.Module] = []
        for index, (c_in, c_out) in enumerate(itertools.pairwise(widths)):
            layers += [SeparableConv(c_in, c_out), nn.BatchNorm2d(c_out)]
            if index < reps - 1:
                layers.append(nn.ReLU())
        if stride != 1 or extra_conv:
            layers.append(SeparableConv(out_channels, out_channels, stride=stride))
        self.body = nn.Sequential(*layers)
        self.skip = (
            nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )
            if in_channels != out_channels or stride != 1
            else nn.Identity()
        )
        self.relu_after = relu_after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x) + self.skip(x)
        return torch.relu(out) if self.relu_after else out


def _conv_bn_relu(in_channels: int, out_channels: int, kernel: int, stride: int = 1, dilation: int = 1):
    return nn.Sequential(
        nn.Conv2d(
            in_channels, out_channels, kernel, stride, padding=dilation * (kernel // 2), dilation=dilation, bias=False
        ),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
    )


def _deconv_bn_relu(in_channels: int, out_channels: int):
    return nn.Sequential(
        nn.ConvTranspose2d(in_channels, out_channels, 3, stride=2, padding=1, output_padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
    )


class ImagePooling(nn.Module):
    """Global average pool -> 1x1 conv -> per-channel affine -> ReLU, broadcast to the feature map."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.scale = nn.Parameter(torch.ones(out_channels, 1, 1))
        self.shift = nn.Parameter(torch.zeros(out_channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.relu(self.conv(x.mean(dim=(2, 3), keepdim=True)) * self.scale + self.shift)
        return pooled.expand(-1, -1, *x.shape[2:])


class DeepLabV3Plus(nn.Module):
    def __init__(
        self,
        in_channels: int = 16,
        num_classes: int = 3,
        image_height: int = 768,
        image_width: int = 1152,
        width: float = 1.0,
        middle_blocks: int = 16,
    ):
        super().__init__()
        for name, size in (("image_height", image_height), ("image_width", image_width)):
            if size % OUTPUT_STRIDE:
                raise ValueError(f"model option {name}={size} must be a multiple of the output stride {OUTPUT_STRIDE}")

        def c(channels: int) -> int:
            return max(1, round(channels * width))

        self.entry = nn.Sequential(_conv_bn_relu(in_channels, c(32), 3, stride=2), _conv_bn_relu(c(32), c(64), 3))
        self.block1 = XceptionBlock(c(64), c(128), reps=2, stride=2, relu_after=False)
        self.encoder = nn.Sequential(
            nn.ReLU(),
            XceptionBlock(c(128), c(256), reps=2, stride=2),
            XceptionBlock(c(256), c(728), reps=2, stride=2),
            *(XceptionBlock(c(728), c(728), reps=3) for _ in range(middle_blocks)),
            XceptionBlock(c(728), c(1024), reps=2, grow_first=False, extra_conv=True, relu_after=False),
            SeparableConv(c(1024), c(1536), dilation=2),
            nn.BatchNorm2d(c(1536)),
            nn.ReLU(),
            SeparableConv(c(1536), c(1536), dilation=2),
            nn.BatchNorm2d(c(1536)),
            nn.ReLU(),
            SeparableConv(c(1536), c(2048), dilation=2),
            nn.BatchNorm2d(c(2048)),
            nn.ReLU(),
        )
        self.aspp = nn.ModuleList(
            [_conv_bn_relu(c(2048), c(256), 1)]
            + [_conv_bn_relu(c(2048), c(256), 3, dilation=d) for d in ASPP_DILATIONS]
        )
        self.image_pooling = ImagePooling(c(2048), c(256))
        self.fuse = _conv_bn_relu(5 * c(256), c(256), 1)
        self.low_level = _conv_bn_relu(c(128), c(48), 1)
        self.upsample_to_low_level = nn.Sequential(_deconv_bn_relu(c(256), c(256)), _deconv_bn_relu(c(256), c(256)))
        self.decoder = nn.Sequential(
            _conv_bn_relu(c(256) + c(48), c(256), 3),
            _conv_bn_relu(c(256), c(256), 3),
            nn.Conv2d(c(256), c(256), 1),
            _deconv_bn_relu(c(256), c(256)),
            nn.ConvTranspose2d(c(256), num_classes, 3, stride=2, padding=1, output_padding=1, bias=False),
        )
        # The reference initialises encoder and ASPP convolutions Kaiming-normal; the rest keep torch's defaults.
        for part in (self.entry, self.block1, self.encoder, self.aspp):
            for module in part.modules():
                if isinstance(module, nn.Conv2d):
                    nn.init.kaiming_normal_(module.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low_level = self.block1(self.entry(x))
        features = self.encoder(low_level)
        pyramid = [branch(features) for branch in self.aspp] + [self.image_pooling(features)]
        x = self.upsample_to_low_level(self.fuse(torch.cat(pyramid, dim=1)))
        # The reference's in-place ReLU after the first entry block also rectifies the
        # low-level features it keeps a reference to.
        x = torch.cat((x, self.low_level(torch.relu(low_level))), dim=1)
        return self.decoder(x)


def sample_shape(in_channels: int = 16, image_height: int = 768, image_width: int = 1152, **_: object):
    return (in_channels, image_height, image_width)


class WeightedPixelCrossEntropy(nn.Module):
    """Cross-entropy weighted by the target's class weight, averaged over all pixels."""

    def __init__(self, class_weights: torch.Tensor):
        super().__init__()
        self.register_buffer("class_weights", class_weights)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # The trial does not move the criterion: follow the logits' device and (autocast) dtype.
        weights = self.class_weights.to(logits.device, logits.dtype)
        return nn.functional.cross_entropy(logits, targets, weight=weights, reduction="none").mean()


def class_weights() -> torch.Tensor:
    return torch.tensor(CLASS_FREQUENCIES, dtype=torch.float32) ** CLASS_WEIGHT_EXPONENT


def criterion(training: dict) -> nn.Module:
    return WeightedPixelCrossEntropy(class_weights())


def per_sample_iou(predictions: torch.Tensor, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Mean over classes of TP / (TP + FP + FN) per sample; a class absent from both scores 1."""
    scores = []
    for label in range(num_classes):
        predicted, actual = predictions == label, targets == label
        intersection = (predicted & actual).flatten(1).sum(dim=1)
        union = (predicted | actual).flatten(1).sum(dim=1)
        scores.append(
            torch.where(union > 0, intersection / union.clamp(min=1), torch.ones_like(union, dtype=torch.float32))
        )
    return torch.stack(scores, dim=1).mean(dim=1)


def eval_sums(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    iou = per_sample_iou(outputs.argmax(dim=1), targets, outputs.shape[1])
    return {"iou": iou.sum().to(torch.float64), "count": torch.tensor(float(len(iou)), dtype=torch.float64)}


def eval_finalize(sums: dict[str, float]) -> dict[str, float]:
    return {"iou": sums["iou"] / sums["count"]}


def example_targets(batch: int, shape: tuple[int, ...], device: str = "cpu") -> torch.Tensor:
    return torch.zeros(batch, *shape[1:], dtype=torch.long, device=device)


SPEC = ModelSpec(
    build=DeepLabV3Plus,
    sample_shape=sample_shape,
    criterion=criterion,
    eval_sums=eval_sums,
    eval_finalize=eval_finalize,
    example_targets=example_targets,
)
