"""Counted FLOPs of a model's training step and forward pass, per sample.

Counts come from ``torch.utils.flop_counter.FlopCounterMode`` run on meta tensors (no memory,
no compute), so even full-size models are counted on a laptop. Only the operations the
counter knows (convolutions, matmuls, attention) are counted; element-wise work (BatchNorm,
activations, pooling, optimizer update) is not, as in MLPerf/HPC AI500 FLOP accounting.
A FLOP is one multiply or one add (a multiply-add is 2 FLOPs).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils.flop_counter import FlopCounterMode


@dataclasses.dataclass(frozen=True)
class FlopCount:
    train_per_sample: float
    forward_per_sample: float

    def total(self, samples_trained: int, samples_evaluated: int) -> float:
        """FLOPs of a trial: training steps on every trained sample plus forward passes on every evaluated one."""
        return self.train_per_sample * samples_trained + self.forward_per_sample * samples_evaluated


def count_flops(build, model_options: dict, sample_shape: tuple[int, ...], batch: int = 2) -> FlopCount:
    """FLOPs per sample of forward+backward (training) and of forward only, for ``build(**model_options)``."""
    with torch.device("meta"):
        model = build(**model_options)
        inputs = torch.empty((batch, *sample_shape))
    model.train()
    with FlopCounterMode(display=False) as counter:
        model(inputs).float().sum().backward()
    train = counter.get_total_flops()
    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(inputs)
    forward = counter.get_total_flops()
    return FlopCount(train_per_sample=train / batch, forward_per_sample=forward / batch)
