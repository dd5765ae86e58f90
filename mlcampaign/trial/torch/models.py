"""The torch model protocol: each benchmark folder's ``model.py`` exports a ``SPEC = ModelSpec(...)``, named
in its registry entry (mlcampaign.plan.registry.models(), with its option names and quality metrics).

A model module says how to build the network from the benchmark's ``model.options``, the
shape of one input sample, its loss, and how to evaluate quality. Evaluation works in two
steps, ``eval_sums`` per batch (additive tensors, so ranks can all-reduce them) and
``eval_finalize`` on the totals, so the same code serves one process and many.

A model whose training forward needs the targets, or whose quality is not a sum over samples
(object detection: a torchvision detector returns its losses given targets; mAP ranks every
detection of the validation set), sets the optional fields: ``forward_takes_targets`` (the
criterion then receives the forward's output, e.g. the loss dict, and the targets),
``collate`` (the DataLoader's collate_fn, e.g. for per-image box lists), ``quality_metric``
(a torchmetrics metric updated with every rank's (outputs, targets) batches, gathered, whose
computed values go through ``eval_finalize``; ``eval_sums`` is then None) and ``counted_work``
(a module whose forward on a dense batch performs the counted work of the model, for a model
whose own forward cannot run on meta tensors; ``mlcampaign.measure.flops``); ``example_targets``
makes the targets of a batch for checks of a training step without data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mlcampaign.plan.registry import models


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    build: Callable[..., nn.Module]
    sample_shape: Callable[..., tuple[int, ...]]
    criterion: Callable[[dict], nn.Module]  # from the benchmark's training config
    eval_sums: Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]] | None
    eval_finalize: Callable[[dict[str, float]], dict[str, float]]
    forward_takes_targets: bool = False
    collate: Callable[[list], Any] | None = None  # None: torch's default_collate
    quality_metric: Callable[[], Any] | None = None  # () -> torchmetrics.Metric
    counted_work: Callable[..., nn.Module] | None = None  # (**options) -> module; None: build
    # (batch, sample_shape, device) -> zero targets of a batch, for checks of a training step without data
    # (tests); None for a model whose training forward takes the targets (a detector: its own tests).
    example_targets: Callable[[int, tuple[int, ...], str], Any] | None = None


def get(name: str) -> ModelSpec:
    return models()[name].spec()
