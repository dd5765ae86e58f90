"""Reduced-precision workarounds (mlcampaign.trial.torch.onednn_bf16): which convolutions get oneDNN's wrong bf16 weight
gradients, that exactly those run in float64 under CPU bf16 autocast with float32-accurate gradients, on this CPU
and as on an AVX-512 CPU without AMX, and that every other convolution keeps bf16.

Run from the checkout as ``python -m tests.test_precision [--without-workaround]``, it prints each representative
case's weight-gradient error as a JSON line: the test's subprocess, and the check of whether a newer oneDNN still
needs the workaround (without it, an error above ``BF16_ERROR`` or a crash is the defect).
"""

import copy
import itertools
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from mlcampaign.trial.torch.onednn_bf16 import (
    bf16_weight_gradient_fails,
    float64_where_bf16_weight_gradients_fail,
    meets_only_padding,
    shallower_than_kernel,
    weight_gradient_input_size,
)

from conftest import REPO

# Convolutions whose bf16 weight gradient oneDNN 3.12.0 gets wrong, one of each kind a sweep of 12,400 shapes
# against float64 found (two of them layers of the project's models at small sizes), each wrong on AMX, under
# CPU_WITHOUT_AMX's cap, or both; and one the rule takes whose float32 weight gradient oneDNN gets wrong:
# constructor, its arguments, input shape.
REPRESENTATIVE_CASES = {
    "ResNet-50 layer4.0.conv2 at image 16: 3x3 stride 2 on 1x1": (nn.Conv2d, (128, 128, 3, 2, 1), (4, 128, 1, 1)),
    "3x3 with stride 2 across a width of 1": (nn.Conv2d, (32, 64, 3, (1, 2), 1), (2, 32, 4, 1)),
    "1-D 3 taps stride 2 on 1": (nn.Conv1d, (32, 64, 3, 2, 1), (2, 32, 1)),
    "CosmoFlow's last block at input 32: 3x3x3 'same' on 2x2x2": (nn.Conv3d, (32, 64, 3, 1, "same"), (4, 32, 2, 2, 2)),
    "3x3x3 on an input 2 deep": (nn.Conv3d, (32, 64, 3, 1, 1), (2, 32, 2, 4, 4)),
    "depthwise 3x3x3 on 2x2x2": (nn.Conv3d, (32, 32, 3, 1, 1, 1, 32), (2, 32, 2, 2, 2)),
    "transposed 3x3 stride 2 on 1x1": (nn.ConvTranspose2d, (32, 32, 3, 2, 1), (2, 32, 1, 1)),
    "transposed 3x3x3 on 2x2x2": (nn.ConvTranspose3d, (32, 32, 3, 1, 1), (2, 32, 2, 2, 2)),
    "4x3x3 at depth stride 2 on 3x4x4, wrong in float32": (
        nn.Conv3d,
        (32, 64, (4, 3, 3), (2, 1, 1), (3, 1, 1)),
        (2, 32, 3, 4, 4),
    ),
}
FLOAT32_ERROR = 1e-5  # float32 accumulation of these few products; bf16 operands alone give ~4e-3
BF16_ERROR = 2**-5  # above bf16 rounding (~4e-3): a wrong bf16 gradient (the defect gives 1 to inf)
CPU_WITHOUT_AMX = {
    "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",  # oneDNN's AVX-512 kernels as on a CPU without AMX; no-op without AVX-512
    # glibc: every allocation from the heap, filled with 0x5a bytes, so a kernel that reads memory it never wrote
    # reads garbage, not zeros that could pass for a right gradient (other C libraries ignore these)
    "MALLOC_PERTURB_": "165",
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
}


def _channels_last(dims: int) -> torch.memory_format:
    return {3: torch.contiguous_format, 4: torch.channels_last, 5: torch.channels_last_3d}[dims]


def _weight_gradient_error(conv: nn.Module, inputs: torch.Tensor) -> float:
    """Largest error of ``conv``'s weight gradient under CPU bf16 autocast against float64, relative to the sum of
    the absolute products each element accumulates; inf where not finite."""
    reference = copy.deepcopy(conv).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = conv(inputs)
    assert outputs.dtype == torch.bfloat16  # as autocast returns every convolution, in float64 or not
    grad_outputs = torch.randn(outputs.shape).bfloat16().contiguous(memory_format=_channels_last(outputs.dim()))
    outputs.backward(grad_outputs)
    exact = _weight_gradient(reference, inputs.double(), grad_outputs.double())
    scale = _weight_gradient(reference, inputs.double().abs(), grad_outputs.double().abs())
    error = ((conv.weight.grad.double() - exact).abs() / scale.clamp(min=1e-300)).max().item()
    return error if math.isfinite(error) else math.inf


def _weight_gradient(conv: nn.Module, inputs: torch.Tensor, grad_outputs: torch.Tensor) -> torch.Tensor:
    conv.zero_grad(set_to_none=True)
    conv(inputs).backward(grad_outputs)
    return conv.weight.grad


def representative_case_errors(with_workaround: bool) -> dict[str, float]:
    """Each representative case's weight-gradient error (``_weight_gradient_error``), printed as it comes with
    whether it is wrong: above float32's error with the workaround, above bf16's without."""
    torch.manual_seed(0)
    errors = {}
    for name, (kind, arguments, input_shape) in REPRESENTATIVE_CASES.items():
        memory_format = _channels_last(len(input_shape))
        conv = kind(*arguments, bias=False).to(memory_format=memory_format)
        if with_workaround:
            float64_where_bf16_weight_gradients_fail(conv)
        errors[name] = _weight_gradient_error(conv, torch.randn(input_shape).contiguous(memory_format=memory_format))
        wrong = errors[name] > (FLOAT32_ERROR if with_workaround else BF16_ERROR)
        print(json.dumps({"case": name, "error": errors[name], "wrong": wrong}), flush=True)  # a crash: no line
    return errors


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # torch's note on a copy it makes
@pytest.mark.parametrize("padding_mode", ["zeros", "reflect"])
def test_padding_only_taps_are_those_whose_gradient_is_exactly_zero(padding_mode):
    checked = 0
    for kernel, stride, dilation, padding in itertools.product(
        (1, 2, 3, 5), (1, 2, 3), (1, 2, 4), [0, 1, 2, 4, "same", "valid"]
    ):
        if padding == "same" and stride > 1:
            continue  # torch refuses 'same' with strides
        conv = nn.Conv1d(1, 1, kernel, stride, padding, dilation, bias=False, padding_mode=padding_mode).double()
        for size in range(1, 7):
            conv.zero_grad(set_to_none=True)
            try:
                outputs = conv(torch.ones(1, 1, size, dtype=torch.float64))
            except RuntimeError:
                continue  # no output position, or reflection wider than the input
            outputs.sum().backward()  # a tap's gradient sums the inputs it reads: 0 iff it reads only padding
            assert meets_only_padding(conv, (size,)) == bool((conv.weight.grad == 0).any()), (conv, size)
            checked += 1
    assert checked > 500


def test_shallower_than_kernel_compares_a_3d_input_depth_with_the_dilated_kernel_depth():
    conv = nn.Conv3d(1, 1, (3, 5, 5), dilation=(2, 1, 1), padding=(2, 2, 2))
    assert not shallower_than_kernel(conv, (5, 1, 1))  # height and width do not count
    assert shallower_than_kernel(conv, (4, 9, 9))
    assert not shallower_than_kernel(nn.Conv2d(1, 1, 5), (1, 1))  # 2-D: never


def test_the_rule_takes_padding_only_taps_everywhere_and_3d_inputs_less_deep_than_the_kernel():
    same_3d = nn.Conv3d(8, 8, 3, padding="same")
    assert bf16_weight_gradient_fails(same_3d, (2, 2, 2)) and bf16_weight_gradient_fails(same_3d, (2, 8, 8))
    assert not bf16_weight_gradient_fails(same_3d, (3, 3, 3))  # every tap sees data, the kernel fits
    assert not bf16_weight_gradient_fails(nn.Conv3d(8, 8, (3, 5, 5), padding=2), (3, 3, 3))  # only wider than high
    wide_2d = nn.Conv2d(8, 8, 5, padding=2)
    assert not bf16_weight_gradient_fails(wide_2d, (3, 3))  # smaller than the kernel, but every tap sees data
    assert bf16_weight_gradient_fails(wide_2d, (2, 3))  # on 2 rows the outer taps meet only padding
    assert not bf16_weight_gradient_fails(nn.Conv3d(8, 8, 3), (3, 3, 3))  # unpadded: the 1x1x1 output sees all


def test_a_transposed_convolution_is_judged_by_its_output_size():
    # oneDNN computes its weight gradient as that of a convolution of the output by the input
    transposed = nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1)
    assert weight_gradient_input_size(transposed, torch.empty(1, 8, 2, 3)) == (4, 6)
    assert weight_gradient_input_size(transposed, torch.empty(1, 8, 1, 1), output_size=[1, 8, 1, 1]) == (1, 1)
    assert weight_gradient_input_size(nn.Conv2d(8, 8, 3), torch.empty(1, 8, 5, 7)) == (5, 7)
    assert not bf16_weight_gradient_fails(transposed, (4, 6))  # every tap adds to some output position kept
    assert bf16_weight_gradient_fails(transposed, (1, 1))  # the outer taps add only to positions cropped away


def test_representative_cases_get_float32_accurate_gradients_on_this_cpu():
    errors = representative_case_errors(with_workaround=True)
    assert {name: error for name, error in errors.items() if not error < FLOAT32_ERROR} == {}


def test_representative_cases_get_float32_accurate_gradients_as_on_an_avx512_cpu_without_amx():
    result = subprocess.run(
        [sys.executable, "-m", "tests.unit.trial.test_precision"],
        cwd=REPO,
        env={**os.environ, **CPU_WITHOUT_AMX, "PYTHONPATH": str(REPO / "tests")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    errors = {record["case"]: record["error"] for record in map(json.loads, result.stdout.splitlines())}
    assert set(errors) == set(REPRESENTATIVE_CASES)
    assert {name: error for name, error in errors.items() if not error < FLOAT32_ERROR} == {}


def test_other_convolutions_keep_bf16_and_the_model_keeps_its_parameters():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ConvTranspose2d(8, 8, 2, stride=2)
    )
    keys, parameters = list(model.state_dict()), list(model.parameters())
    float64_where_bf16_weight_gradients_fail(model)
    assert list(model.state_dict()) == keys and list(model.parameters()) == parameters
    with torch.autocast("cpu", dtype=torch.bfloat16):
        wide = model[:2](torch.randn(2, 3, 8, 8))  # 8x8 -> 4x4: every tap sees data
        narrow = model[:2](torch.randn(2, 3, 1, 1))  # on one pixel, both convolutions' outer taps meet only padding
        upsampled = model[2](wide)  # 4x4 -> 8x8, every tap meets data
        padded = model[2](narrow, output_size=[3, 3])  # 1x1 -> 3x3 through output_padding: every tap meets data
    assert wide.grad_fn.name() == "ConvolutionBackward0"  # a bf16 convolution, as autocast makes it
    assert upsampled.dtype == torch.bfloat16 and upsampled.grad_fn.name() == "ConvolutionBackward0"
    assert narrow.dtype == torch.bfloat16 and narrow.grad_fn.name() == "ToCopyBackward0"  # float64, cast back
    assert narrow.grad_fn.next_functions[0][0].name() == "ConvolutionBackward0"
    assert padded.shape[-2:] == (3, 3) and padded.grad_fn.name() == "ConvolutionBackward0"
    assert model[:2](torch.randn(2, 3, 1, 1)).dtype == torch.float32  # without autocast nothing changes


if __name__ == "__main__":
    representative_case_errors(with_workaround="--without-workaround" not in sys.argv[1:])
