"""Model registry: one module per benchmark model, each exporting a ``SPEC``.

A model module says how to build the network from the benchmark's ``model.options``, the
shape of one input sample, its loss, and how to evaluate quality. Evaluation works in two
steps, ``eval_sums`` per batch (additive tensors, so ranks can all-reduce them) and
``eval_finalize`` on the totals, so the same code serves one process and many.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

import torch
from torch import nn

# Registered model name -> module of this package defining its SPEC.
MODELS = {"resnet50": "resnet", "cosmoflow": "cosmoflow", "deepcam": "deepcam"}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    build: Callable[..., nn.Module]
    sample_shape: Callable[..., tuple[int, ...]]
    criterion: Callable[[dict], nn.Module]  # from the benchmark's training config
    eval_sums: Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]
    eval_finalize: Callable[[dict[str, float]], dict[str, float]]


def get(name: str) -> ModelSpec:
    return importlib.import_module(f"mlcampaign.models.{MODELS[name]}").SPEC
