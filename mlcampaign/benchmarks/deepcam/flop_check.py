"""DeepCAM's forward multiply-adds from the reference architecture (mlcommons/hpc deepcam: Xception
entry, middle and exit flows, ASPP, decoder), independent of the FLOP counter: its cross-check."""

from __future__ import annotations


def _sep(c_in: int, c_out: int, pixels: int) -> int:
    """Multiply-adds of a depthwise 3x3 + pointwise 1x1 at ``pixels`` output positions."""
    return pixels * (9 * c_in + c_in * c_out)


def deepcam_macs(height: int, width: int) -> tuple[int, int]:
    """Forward multiply-adds of DeepCAM and those of its first convolution, from the reference architecture."""
    p2, p4, p8, p16 = (height * width // s**2 for s in (2, 4, 8, 16))
    first = p2 * 9 * 16 * 32
    entry = first + p2 * 9 * 32 * 64
    block1 = _sep(64, 128, p2) + _sep(128, 128, p2) + _sep(128, 128, p4) + p4 * 64 * 128
    block2 = _sep(128, 256, p4) + _sep(256, 256, p4) + _sep(256, 256, p8) + p8 * 128 * 256
    block3 = _sep(256, 728, p8) + _sep(728, 728, p8) + _sep(728, 728, p16) + p16 * 256 * 728
    middle = 16 * 3 * _sep(728, 728, p16)
    exit_flow = _sep(728, 728, p16) + _sep(728, 1024, p16) + _sep(1024, 1024, p16) + p16 * 728 * 1024
    exit_flow += _sep(1024, 1536, p16) + _sep(1536, 1536, p16) + _sep(1536, 2048, p16)
    aspp = p16 * 2048 * 256 + 3 * p16 * 9 * 2048 * 256 + 2048 * 256 + p16 * 1280 * 256
    decoder = p4 * 128 * 48 + p16 * 9 * 256 * 256 + p8 * 9 * 256 * 256  # low-level 1x1, two deconvolutions
    decoder += p4 * 9 * 304 * 256 + p4 * 9 * 256 * 256 + p4 * 256 * 256 + p4 * 9 * 256 * 256 + p2 * 9 * 256 * 3
    return entry + block1 + block2 + block3 + middle + exit_flow + aspp + decoder, first


def closed_form_flops() -> tuple[float, float]:
    """Training and forward FLOPs per sample of the full-size model: 2 FLOPs per multiply-add forward; training
    adds the weight gradients and the input gradients (each as costly as the forward), except the input
    gradient of the first layer, which reads the raw input."""
    macs, first_layer_macs = deepcam_macs(768, 1152)
    return 6 * macs - 2 * first_layer_macs, 2 * macs
