"""Reduced-precision workarounds for defects of the libraries under the trials, each scoped to its condition.

oneDNN 3.12.0, the version torch 2.14.1 bundles, computes wrong bf16 convolution weight gradients on x86-64 CPUs
with AVX-512, in its AMX kernels (``brgconv_bwd_w``) and its ``jit_bf16`` ones (without AMX, and for depthwise 3-D
convolutions with it), for two kinds of convolution, both on inputs a few pixels across:

- one with a kernel tap that meets only zero padding at every output position, whose exact gradient is 0:
  ResNet-50's layer4.0.conv2 at image size 16 or 32 (3x3, stride 2, on a 1x1 or 2x2 input). The kernels return
  memory they never wrote there (garbage, inf, NaN) and, for some strided dilated shapes, write out of bounds
  (a segfault, or an abort on a corrupted heap). In 1-D and 2-D a sweep found this only at strides above 1;
  the rule takes every such tap all the same: the class is exact to state and costs nothing;
- a 3-D one whose input is less deep than its dilated kernel: CosmoFlow's last block at input size 32 (3x3x3
  'same' on 2x2x2). Without AMX even taps that see data come out wrong, up to 1e306, and some shapes write out of
  bounds; with AMX the depthwise ones are wrong. Inputs only lower or narrower than the kernel came out right.

Under CPU bf16 autocast, ``float64_where_bf16_weight_gradients_fail`` runs exactly these convolutions in float64,
which torch computes with its own kernels (oneDNN has none), as it does with ``torch.backends.mkldnn.enabled =
False``: oneDNN's float32 kernels fail on some of these shapes too (3-D inputs less deep than the kernel at depth
strides above 1). Every other convolution keeps bf16. A transposed convolution is judged by the convolution oneDNN
computes its weight gradient with: of its output, by its input, at the same kernel, stride, padding and dilation.
The rule depends on the layer and its input shape only, never on the CPU, so a trial computes the same on every
machine. The convolutions it takes are a few pixels across: in the project's CPU-sized models float64 adds a few
per cent to a training step; at full size it takes none. No upstream report of these defects was found
(pytorch/pytorch#169688 is another one: the AMX bf16 3-D forward with an output 1 wide at strides above 1).

The workaround can go once a torch release's oneDNN gets these cases right: from the checkout,
``MALLOC_PERTURB_=165 python -m tests.unit.trial.test_precision --without-workaround`` prints each representative case's
error without it (glibc's MALLOC_PERTURB_ makes memory a kernel never wrote read as garbage, not as zeros). None
may exceed the test's ``BF16_ERROR`` or crash, on a CPU with AMX and with ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Sequence

import torch
from torch import nn

CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
TRANSPOSED_CONVOLUTIONS = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def meets_only_padding(conv: nn.Module, spatial_size: Sequence[int]) -> bool:
    """Whether some kernel tap of convolution ``conv`` reads only zero padding, at every output position, on an
    input of ``spatial_size`` (its weight gradient is then exactly 0)."""
    # A compiled model's trace runs the check once per shape, and Dynamo warns of a cache it would ignore: the
    # plain function there.
    check = _meets_only_padding.__wrapped__ if torch.compiler.is_compiling() else _meets_only_padding
    return check(conv.kernel_size, conv.stride, conv.dilation, conv.padding, conv.padding_mode, tuple(spatial_size))


def shallower_than_kernel(conv: nn.Module, spatial_size: Sequence[int]) -> bool:
    """Whether ``conv`` is a 3-D convolution and an input of ``spatial_size`` (depth, height, width) is less deep
    than its dilated kernel."""
    if len(conv.kernel_size) != 3:
        return False
    return spatial_size[0] < conv.dilation[0] * (conv.kernel_size[0] - 1) + 1


def bf16_weight_gradient_fails(conv: nn.Module, spatial_size: Sequence[int]) -> bool:
    """Whether oneDNN's bf16 weight gradient of convolution ``conv`` on an input of ``spatial_size`` is one of
    those the module's docstring describes: a tap meets only padding, or a 3-D input is less deep than the kernel.
    For a transposed convolution, ``spatial_size`` is its output's (see ``weight_gradient_input_size``)."""
    return meets_only_padding(conv, spatial_size) or shallower_than_kernel(conv, spatial_size)


def weight_gradient_input_size(
    conv: nn.Module, input: torch.Tensor, output_size: Sequence[int] | None = None
) -> tuple[int, ...]:
    """The spatial size of the input of the convolution whose weight gradient oneDNN computes for ``conv`` on
    ``input``: ``input``'s own for a convolution, the output's for a transposed one (``output_size`` as its
    forward takes it, else its ``output_padding``)."""
    dims = len(conv.kernel_size)
    if not isinstance(conv, TRANSPOSED_CONVOLUTIONS):
        return tuple(input.shape[-dims:])
    if output_size is not None:
        return tuple(output_size[-dims:])
    return tuple(
        (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + extra + 1
        for size, stride, padding, dilation, kernel, extra in zip(
            input.shape[-dims:],
            conv.stride,
            conv.padding,
            conv.dilation,
            conv.kernel_size,
            conv.output_padding,
            strict=True,
        )
    )


@functools.cache  # one answer per layer shape and input size: the check runs on every forward
def _meets_only_padding(kernel_size, stride, dilation, padding, padding_mode: str, spatial_size) -> bool:
    if padding_mode != "zeros" or padding == "valid":
        return False  # no zero padding: the other modes pad with data (F.pad), then convolve unpadded
    if padding == "same":
        totals = [d * (k - 1) for d, k in zip(dilation, kernel_size, strict=True)]
        paddings = [(total // 2, total - total // 2) for total in totals]  # as torch splits it
    else:
        paddings = [(p, p) for p in padding]
    for size, k, s, d, (before, after) in zip(spatial_size, kernel_size, stride, dilation, paddings, strict=True):
        outputs = (size + before + after - d * (k - 1) - 1) // s + 1
        for tap in range(k):
            offset = before - tap * d  # tap reads input position o * s - offset; it has data if 0 <= that < size
            first = max(0, -(-offset // s))  # first output position reading at or after the input's start
            if first >= outputs or first * s - offset >= size:
                return True
    return False


def _bf16_autocast_on(device: str) -> bool:
    return device == "cpu" and torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16


def _forward(conv: nn.Module, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
    arguments = (input,) if output_size is None else (input, output_size)  # output_size: transposed ones only
    device = input.device.type
    spatial_size = weight_gradient_input_size(conv, input, output_size)
    if not (_bf16_autocast_on(device) and bf16_weight_gradient_fails(conv, spatial_size)):
        return type(conv).forward(conv, *arguments)
    # In float64 torch convolves with its own kernels: oneDNN has none, and its float32 ones fail on some of these
    # shapes too. functional_call runs this forward again, with autocast off: the plain branch above.
    parameters = {name: parameter.double() for name, parameter in conv.named_parameters()}
    with torch.autocast(device, enabled=False):
        output = torch.func.functional_call(conv, parameters, (input.double(), *arguments[1:]))
    return output.to(torch.bfloat16)  # what autocast returns for every other convolution


def float64_where_bf16_weight_gradients_fail(model: nn.Module) -> None:
    """Make each (transposed) convolution of ``model`` run in float64 under CPU bf16 autocast whenever oneDNN's
    bf16 weight gradient of it on that input is wrong (``bf16_weight_gradient_fails``; see the module's
    docstring), returning bf16 as autocast does; parameters, state dict and every other call are unchanged."""
    for module in model.modules():
        if isinstance(module, CONVOLUTIONS + TRANSPOSED_CONVOLUTIONS):
            module.forward = types.MethodType(_forward, module)
