"""DeepCAM's keys in MLPerf's HPC rules (closed_deepcam*.yaml), named after the reference's torch optimizer
parameters and schedulers."""

from __future__ import annotations

from mlcampaign.records import mlperf_log
from mlcampaign.records.mlperf_log import Schedule

# MLPerf's DeepCAM schedule names for the project's schedules (MultiStepLR's one decay rate cannot
# express the project's per-milestone factors in general, so a step schedule has none).
DEEPCAM_SCHEDULERS = {"cosine": "cosine_annealing"}


def hyperparameters(benchmark: dict, schedule: Schedule) -> dict:
    """Its warm-up factor 1 means "linearly from 0 to opt_lr", as the trial does."""
    training = benchmark["training"]
    optimizer, lr_schedule = training["optimizer"], training["schedule"]
    values = {"batchnorm_group_size": 1, "opt_lr": schedule.peak_lr}
    if optimizer["name"] in ("adam", "adamw"):
        # The trial's Adam settings, as the torch and Keras trials build the optimizer.
        values |= {"opt_betas": list(mlperf_log.ADAM_BETAS), "opt_eps": mlperf_log.ADAM_EPSILON}
    if lr_schedule["name"] in DEEPCAM_SCHEDULERS:
        values |= {
            "scheduler_type": DEEPCAM_SCHEDULERS[lr_schedule["name"]],
            "scheduler_t_max": schedule.decay_steps,
            "scheduler_eta_min": schedule.end_lr,
        }
    values |= {"scheduler_lr_warmup_steps": schedule.warmup_steps, "scheduler_lr_warmup_factor": 1.0}
    return values
