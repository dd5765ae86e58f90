"""CosmoFlow's keys in MLPerf's HPC rules (closed_cosmoflow.yaml), in the reference's sense."""

from __future__ import annotations

import inspect

from mlperf_logging.mllog import constants

from mlcampaign.benchmarks.cosmoflow.model import CosmoFlow
from mlcampaign.records.mlperf_log import Schedule


def hyperparameters(benchmark: dict, schedule: Schedule) -> dict:
    """The warm-up factor is the peak learning rate over the warm-up's first one; decay boundaries and factors
    describe a step schedule (none for a constant one; a cosine or polynomial schedule has none)."""
    lr_schedule = benchmark["training"]["schedule"]
    options = benchmark["model"].get("options", {})
    values = {
        # The peak over the first step's rate, (k + 1) / warm-up steps at step k: the warm-up's length.
        constants.OPT_LR_WARMUP_FACTOR: float(schedule.warmup_steps) if schedule.warmup_steps else 1.0,
        "dropout": options.get("dropout", inspect.signature(CosmoFlow).parameters["dropout"].default),
    }
    if lr_schedule["name"] in ("step", "constant"):
        milestones = sorted(lr_schedule.get("milestones", []), key=lambda milestone: milestone["epoch"])
        values |= {
            constants.OPT_LR_DECAY_BOUNDARY_EPOCHS: [milestone["epoch"] for milestone in milestones],
            # The factor of the peak rate from each boundary on (the reference logs only the largest).
            constants.OPT_LR_DECAY_FACTOR: [milestone["factor"] for milestone in milestones],
        }
    return values
