"""CosmoFlow's forward multiply-adds from the reference architecture (mlcommons/hpc cosmoflow), independent of
the FLOP counter: its cross-check."""

from __future__ import annotations


def cosmoflow_macs(size: int = 128) -> tuple[int, int]:
    """Forward multiply-adds of CosmoFlow (5 conv3d k3 'same' + max-pool, dense 128/64/4) and of its first layer."""
    macs, channels, first = 0, 4, None
    for index in range(5):
        filters = 32 * 2**index
        layer = (size // 2**index) ** 3 * 27 * channels * filters
        first = layer if first is None else first
        macs, channels = macs + layer, filters
    return macs + 4**3 * 512 * 128 + 128 * 64 + 64 * 4, first


def closed_form_flops() -> tuple[float, float]:
    """Training and forward FLOPs per sample of the full-size model: 2 FLOPs per multiply-add forward; training
    adds the weight gradients and the input gradients (each as costly as the forward), except the input
    gradient of the first layer, which reads the raw input."""
    macs, first_layer_macs = cosmoflow_macs()
    return 6 * macs - 2 * first_layer_macs, 2 * macs
