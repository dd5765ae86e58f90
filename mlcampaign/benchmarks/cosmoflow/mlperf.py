"""CosmoFlow's keys in MLPerf's HPC rules (closed_cosmoflow.yaml), in the reference's sense: those the trials
log, and a submission's schedule and dropout read back into a campaign."""

from __future__ import annotations

import inspect

from mlperf_logging.mllog import constants

from mlcampaign.plan.reproduce import Settings
from mlcampaign.records.mlperf.trial_log import Schedule


def hyperparameters(benchmark: dict, schedule: Schedule) -> dict:
    """The warm-up factor is the peak learning rate over the warm-up's first one; decay boundaries and factors
    describe a step schedule (none for a constant one; a cosine or polynomial schedule has none)."""
    # Imported here: a reproduction (reproduce_schedule) reads this module without torch.
    from mlcampaign.benchmarks.cosmoflow.model import CosmoFlow

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


def reproduce_schedule(settings: Settings, steps_per_epoch: float) -> None:
    """A CosmoFlow submission's schedule (in epochs, as the project's: ``steps_per_epoch`` is not needed) and
    dropout as the project's (``mlcampaign reproduce``, mlcampaign.plan.reproduce)."""
    warmup = settings.take("opt_learning_rate_warmup_epochs", 0)
    factor = settings.take("opt_learning_rate_warmup_factor")
    if factor is not None:
        settings.drop(
            "opt_learning_rate_warmup_factor", factor, "the project's warm-up rises linearly from 0 to the peak"
        )
    boundaries = settings.take("opt_learning_rate_decay_boundary_epochs", [])
    factors = settings.take("opt_learning_rate_decay_factor", [])
    if not isinstance(factors, list):  # one factor, applied again at each boundary
        factors = [factors ** (index + 1) for index in range(len(boundaries))]
    schedule: dict = {"warmup_epochs": warmup, "name": "constant"}
    if boundaries:
        schedule |= {
            "name": "step",
            "milestones": [
                {"epoch": epoch, "factor": factor} for epoch, factor in zip(boundaries, factors, strict=False)
            ],
        }
    settings.carry(f"opt_learning_rate_warmup_epochs {warmup}; decay at epochs {boundaries} by {factors}")
    settings.training["schedule"] = schedule
    dropout = settings.take("dropout")
    if dropout is not None:
        settings.carry(f"dropout {dropout}")
        settings.model_options["dropout"] = dropout
