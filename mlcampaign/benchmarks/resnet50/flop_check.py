"""ResNet-50's forward multiply-adds as torchvision publishes them, independent of the FLOP counter: its
cross-check."""

from __future__ import annotations


def resnet50_macs() -> tuple[int, int]:
    """The full-size model's (224 x 224, 1000 classes) forward multiply-adds per sample, torchvision's published
    figure (its "GFLOPS" are multiply-adds), and those of its first layer (7 x 7 convolution, stride 2)."""
    from torchvision.models import ResNet50_Weights

    first = 112 * 112 * 49 * 3 * 64
    return round(ResNet50_Weights.IMAGENET1K_V1.meta["_ops"] * 1e9), first


def closed_form_flops() -> tuple[float, float]:
    """Training and forward FLOPs per sample of the full-size model: 2 FLOPs per multiply-add forward; training
    adds the weight gradients and the input gradients (each as costly as the forward), except the input
    gradient of the first layer, which reads the raw input."""
    macs, first_layer_macs = resnet50_macs()
    return 6 * macs - 2 * first_layer_macs, 2 * macs
