"""The batch and learning-rate arithmetic that every framework and the planner share (no torch import:
the planner checks batch sizes before any job starts), and the optimizer settings they share."""

from __future__ import annotations

import math

# torch.optim.Adam/AdamW's defaults, which the torch trial keeps; the Keras trial builds Adam with
# epsilon 1e-8 to match (its betas default to the same). MLPerf's DeepCAM reference uses eps 1e-6.
ADAM_BETAS = (0.9, 0.999)
ADAM_EPSILON = 1e-8


def batch_sizes(training: dict, processes: int) -> tuple[int, int]:
    """(global, local) batch of a benchmark's training config at ``processes`` processes.

    Strong scaling keeps ``global_batch_size`` (it must divide evenly); weak scaling keeps
    ``local_batch_size``.
    """
    if training["batch_scaling"] == "weak":
        return training["local_batch_size"] * processes, training["local_batch_size"]
    global_batch = training["global_batch_size"]
    if global_batch % processes:
        raise ValueError(f"global_batch_size {global_batch} is not divisible by {processes} processes")
    return global_batch, global_batch // processes


def scaled_lr(training: dict, global_batch: int) -> float:
    """The peak learning rate at ``global_batch`` under the benchmark's ``lr_scaling`` rule."""
    rule = training["lr_scaling"]["rule"]
    lr = training["optimizer"]["lr"]
    if rule == "none":
        return lr
    ratio = global_batch / training["lr_scaling"]["base_batch_size"]
    return lr * (ratio if rule == "linear" else math.sqrt(ratio))


def lr_factor(schedule: dict, steps_per_epoch: int, total_steps: int):
    """The learning-rate factor of each step (0-based) under the benchmark's ``schedule``: linear warm-up
    over ``warmup_epochs``, then constant, cosine, polynomial or step decay."""
    warmup = int(schedule["warmup_epochs"] * steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if schedule["name"] == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if schedule["name"] == "polynomial":
            return (1.0 - progress) ** schedule["power"]
        if schedule["name"] == "step":
            passed = [m for m in schedule["milestones"] if step >= m["epoch"] * steps_per_epoch]
            return max(passed, key=lambda m: m["epoch"])["factor"] if passed else 1.0
        return 1.0

    return factor
