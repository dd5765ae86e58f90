"""Faster R-CNN's multiply-adds from its architecture (torchvision's ResNet-50 FPN with a 16-channel stem, as
mlcampaign.benchmarks.extreme_weather.model builds it), independent of the FLOP counter: its cross-check."""

from __future__ import annotations

from torchvision.models import ResNet50_Weights


def closed_form_macs(height: int, width: int, regions: int, num_classes: int = 5) -> tuple[int, int]:
    """Forward multiply-adds of Faster R-CNN ResNet-50 FPN (16-channel stem) with ``regions`` boxes through
    the box head, and those of the stem. Backbone: torchvision's published 4.089 G multiply-adds of
    ResNet-50 at 224 x 224, less its classifier and 3-channel stem, scaled with the pixel count (every
    stage's map is the input over its stride: sides divisible by 32)."""
    stem = (height // 2) * (width // 2) * 7 * 7 * 16 * 64
    published = ResNet50_Weights.IMAGENET1K_V1.meta["_ops"] * 1e9
    backbone = (published - 2048 * 1000 - 112 * 112 * 7 * 7 * 3 * 64) * height * width / 224**2 + stem
    pyramid = rpn = 0
    for level, channels in enumerate((256, 512, 1024, 2048)):
        pixels = (height // 2 ** (level + 2)) * (width // 2 ** (level + 2))
        pyramid += pixels * channels * 256 + pixels * 9 * 256 * 256  # lateral 1x1, output 3x3
    for level in range(5):  # P2..P5 and the max-pooled P6
        pixels = (height // 2 ** (level + 2)) * (width // 2 ** (level + 2))
        rpn += pixels * (9 * 256 * 256 + 256 * 3 + 256 * 12)  # 3x3 conv, objectness and deltas of 3 anchors
    box_head = regions * (256 * 7 * 7 * 1024 + 1024 * 1024 + 1024 * num_classes + 1024 * 4 * num_classes)
    return round(backbone + pyramid + rpn + box_head), stem


def closed_form_flops() -> tuple[float, float]:
    """Training and forward FLOPs per sample of the full-size model (768 x 1152): training at the 512 sampled
    regions per image, evaluation at 1000 proposals per image (torchvision's defaults); the stem's input
    gradient is not computed."""
    train_macs, stem = closed_form_macs(768, 1152, regions=512)
    eval_macs, _ = closed_form_macs(768, 1152, regions=1000)
    return 6 * train_macs - 2 * stem, 2 * eval_macs
