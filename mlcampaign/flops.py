"""Counted FLOPs of a model's training step and forward pass, per sample.

Counts come from ``torch.utils.flop_counter.FlopCounterMode`` run on meta tensors (no memory,
no compute), so even full-size models are counted on a laptop. Only the operations the
counter knows (convolutions, matmuls, attention) are counted; element-wise work (BatchNorm,
activations, pooling, optimizer update) is not, as in MLPerf/HPC AI500 FLOP accounting.
A FLOP is one multiply or one add (a multiply-add is 2 FLOPs). A model whose forward cannot run
on meta tensors (a detector selects proposals by value: top-k, NMS, RoIAlign) is counted through
its ``ModelSpec.counted_work`` module, which performs the same layers on fixed region counts.

Correction: torch's stock formula for ``aten.convolution_backward`` counts the weight
gradient of a grouped convolution as if it were ungrouped (it convolves the full input
channels with the full output channels), overcounting it by the number of groups: 728x for
a depthwise convolution of DeepCAM's middle flow. ``count_flops`` replaces that formula with
the exact one (``conv_backward_flop``). ``analytic_flops`` is an independent per-layer count
from module attributes and activation shapes, used to check the counter.
"""

from __future__ import annotations

import dataclasses
from math import prod

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class FlopCount:
    train_per_sample: float
    forward_per_sample: float

    def total(self, samples_trained: int, samples_evaluated: int) -> float:
        """FLOPs of a trial: training steps on every trained sample plus forward passes on every evaluated one."""
        return self.train_per_sample * samples_trained + self.forward_per_sample * samples_evaluated


def _conv_macs(x_shape, w_shape, out_shape, transposed: bool) -> int:
    """Multiply-adds of a (possibly grouped or transposed) convolution.

    The weight holds ``out/groups x in`` (or ``in x out/groups`` when transposed) filter taps
    per position; every tap is applied once at each position of the larger side: the output
    of a convolution, the input of a transposed one. Its two gradients cost the same.
    """
    spatial = (x_shape if transposed else out_shape)[2:]
    return prod(w_shape) * x_shape[0] * prod(spatial)


def conv_backward_flop(
    grad_out_shape,
    x_shape,
    w_shape,
    _bias,
    _stride,
    _padding,
    _dilation,
    transposed,
    _output_padding,
    _groups,
    output_mask,
    **_,
) -> int:
    """FLOPs of ``aten.convolution_backward``: input gradient and weight gradient, each as costly as the forward."""
    macs = _conv_macs(x_shape, w_shape, grad_out_shape, transposed)
    return 2 * macs * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


CORRECTED_FORMULAS = {aten.convolution_backward: conv_backward_flop}


def count_flops(build, model_options: dict, sample_shape: tuple[int, ...], batch: int = 2) -> FlopCount:
    """FLOPs per sample of forward+backward (training) and of forward only, for ``build(**model_options)``."""
    with torch.device("meta"):
        model = build(**model_options)
        inputs = torch.empty((batch, *sample_shape))
    model.train()
    with FlopCounterMode(display=False, custom_mapping=CORRECTED_FORMULAS) as counter:
        model(inputs).float().sum().backward()
    train = counter.get_total_flops()
    model.eval()
    with FlopCounterMode(display=False, custom_mapping=CORRECTED_FORMULAS) as counter, torch.no_grad():
        model(inputs)
    forward = counter.get_total_flops()
    return FlopCount(train_per_sample=train / batch, forward_per_sample=forward / batch)


_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_TRANSPOSED_CONVOLUTIONS = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def _layer_macs(module: nn.Module, inputs: torch.Tensor, output: torch.Tensor) -> int:
    if isinstance(module, _CONVOLUTIONS):
        return output.numel() * (module.in_channels // module.groups) * prod(module.kernel_size)
    if isinstance(module, _TRANSPOSED_CONVOLUTIONS):
        return inputs.numel() * (module.out_channels // module.groups) * prod(module.kernel_size)
    return output.numel() * module.in_features  # nn.Linear


def analytic_flops(model: nn.Module, sample_shape: tuple[int, ...]) -> FlopCount:
    """Per-layer count independent of the flop counter: convolutions and linear layers only.

    Forward: 2 FLOPs per multiply-add. Backward: the weight gradient costs as much as the
    forward for every layer with trainable weights, and the input gradient as much again for
    every layer whose input needs a gradient (all but the layers reading the raw input).
    """
    forward = backward = 0

    def record(module, args, output):
        nonlocal forward, backward
        flops = 2 * _layer_macs(module, args[0], output)
        forward += flops
        backward += flops * (int(module.weight.requires_grad) + int(args[0].requires_grad))

    hooks = [
        module.register_forward_hook(record)
        for module in model.modules()
        if isinstance(module, (*_CONVOLUTIONS, *_TRANSPOSED_CONVOLUTIONS, nn.Linear))
    ]
    try:
        with torch.device("meta"):
            inputs = torch.empty((1, *sample_shape), device="meta")
        model.to("meta").train()
        model(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return FlopCount(train_per_sample=float(forward + backward), forward_per_sample=float(forward))
