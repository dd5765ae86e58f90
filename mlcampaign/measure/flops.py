"""Counted FLOPs of a model's training step and forward pass, per sample.

Counts come from ``torch.utils.flop_counter.FlopCounterMode`` run on meta tensors (no memory,
no compute), so even full-size models are counted on a laptop. Only the operations the
counter knows (convolutions, matmuls, attention) are counted; element-wise work (BatchNorm,
activations, pooling, optimizer update) is not, as in MLPerf/HPC AI500 FLOP accounting.
A FLOP is one multiply or one add (a multiply-add is 2 FLOPs). A model whose forward cannot run
on meta tensors (a detector selects proposals by value: top-k, NMS, RoIAlign) is counted through
its ``ModelSpec.counted_work`` module, which performs the same layers on fixed region counts.
It measures a model, not a training run: the trials count theirs with it (``cached_flop_count``), and
importing a published MLPerf round counts the project's models at the MLPerf size
(mlcampaign.history.published_rounds) without the training runtime.

Correction: torch's stock formula for ``aten.convolution_backward`` counts the weight
gradient of a grouped convolution as if it were ungrouped (it convolves the full input
channels with the full output channels), overcounting it by the number of groups: 728x for
a depthwise convolution of DeepCAM's middle flow. ``count_flops`` replaces that formula with
the exact one (``conv_backward_flop``). ``analytic_flops`` is an independent per-layer count
from module attributes and activation shapes, used to check the counter.

Counting a model costs a trial about as much as importing torch (0.4-2 s on a 2-core CPU), so trials
take it from ``cached_flop_count``: one JSON file per counted (model, options, sample shape) in a cache
directory (a trial's is beside its staged dataset), keyed by the hash of everything the count depends
on: those three, the batch counted, the torch and torchvision versions, and the source of this module
and of the model modules (``mlcampaign/benchmarks/``). A change of any of them counts again; a file that
cannot be read, or whose key differs from the one asked for, is counted again and rewritten.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
from importlib import metadata
from math import prod
from pathlib import Path

import torch
from torch import nn

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class FlopCount:
    train_per_sample: float
    forward_per_sample: float


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
    # Imported here: the counter pulls in triton and more (0.4 s), which a trial whose count is cached never needs.
    from torch.utils.flop_counter import FlopCounterMode

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


PACKAGE_DIR = Path(__file__).resolve().parents[1]
# The source files a count depends on besides torch's and torchvision's: this module, the model protocol and
# every benchmark's torch model.
COUNTED_SOURCES = (
    PACKAGE_DIR / "measure" / "flops.py",
    PACKAGE_DIR / "trial" / "torch" / "models.py",
    *sorted((PACKAGE_DIR / "benchmarks").glob("*/model.py")),
)


@functools.cache
def _counting_code() -> dict[str, str]:
    """The versions and source digest a count depends on (once per process)."""
    sources = hashlib.sha256()
    for path in COUNTED_SOURCES:
        sources.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0" + path.read_bytes())
    try:
        torchvision = metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        torchvision = None
    return {"torch": torch.__version__, "torchvision": torchvision, "sources_sha256": sources.hexdigest()}


def flop_count_key(model_name: str, model_options: dict, sample_shape: tuple[int, ...], batch: int = 2) -> dict:
    """Everything a FLOP count depends on, as JSON-able data (its hash names the cache file)."""
    return {
        "model": model_name,
        "options": model_options,
        "sample_shape": list(sample_shape),
        "batch": batch,
    } | _counting_code()


def cached_flop_count(
    model_name: str, build, model_options: dict, sample_shape: tuple[int, ...], cache_dir: Path, batch: int = 2
) -> FlopCount:
    """``count_flops(build, model_options, sample_shape, batch)``, from ``cache_dir`` where it was counted
    before under the same key (``flop_count_key``: ``build`` must be the model ``model_name``'s counted work).
    A cache that cannot be written costs the next trial a count again, nothing else (a note on stderr)."""
    canonical = json.dumps(
        flop_count_key(model_name, model_options, sample_shape, batch), sort_keys=True, separators=(",", ":")
    )
    key = json.loads(canonical)  # as the cache file holds it (tuples read back as lists)
    path = Path(cache_dir) / f"{hashlib.sha256(canonical.encode()).hexdigest()[:32]}.json"
    try:
        cached = json.loads(path.read_text())
        if cached["key"] == key:
            return FlopCount(float(cached["train_per_sample"]), float(cached["forward_per_sample"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not counted yet, or unreadable: count again
    count = count_flops(build, model_options, sample_shape, batch)
    entry = {"key": key} | dataclasses.asdict(count)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp_path.write_text(json.dumps(entry, sort_keys=True, indent=1) + "\n")
        tmp_path.replace(path)
    except OSError as error:
        print(
            f"note: the FLOP count could not be cached in {path} ({error}); the next trial counts again",
            file=sys.stderr,
        )
    return count


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
