"""ResNet-50 image classification (torchvision's model, MLPerf's ResNet-50 v1.5 layout).

Options: ``num_classes``, ``image_size`` (square input; 224 at MLPerf spec) and
``width_per_group`` (bottleneck width; 64 is the standard model, smaller values make a
cheaper network of the same depth for CPU runs) and ``zero_init_residual`` (start each
residual branch at zero, the "BN gamma zero-init" used by MLPerf ResNet submissions).
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models import resnet50

from mlcampaign.trial.torch.models import ModelSpec


def build(
    num_classes: int = 1000, image_size: int = 224, width_per_group: int = 64, zero_init_residual: bool = False
) -> nn.Module:
    return resnet50(
        weights=None, num_classes=num_classes, width_per_group=width_per_group, zero_init_residual=zero_init_residual
    )


def sample_shape(num_classes: int = 1000, image_size: int = 224, **_: object) -> tuple[int, ...]:
    return (3, image_size, image_size)


def criterion(training: dict) -> nn.Module:
    return nn.CrossEntropyLoss(label_smoothing=training.get("label_smoothing", 0.0))


def eval_sums(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    correct = (outputs.argmax(dim=1) == targets).sum()
    return {"correct": correct.to(torch.float64), "count": torch.tensor(float(targets.numel()), dtype=torch.float64)}


def eval_finalize(sums: dict[str, float]) -> dict[str, float]:
    return {"top1": sums["correct"] / sums["count"]}


def example_targets(batch: int, shape: tuple[int, ...], device: str = "cpu") -> torch.Tensor:
    return torch.zeros(batch, dtype=torch.long, device=device)


SPEC = ModelSpec(
    build=build,
    sample_shape=sample_shape,
    criterion=criterion,
    eval_sums=eval_sums,
    eval_finalize=eval_finalize,
    example_targets=example_targets,
)
