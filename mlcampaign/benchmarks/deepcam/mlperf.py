"""DeepCAM's keys in MLPerf's HPC rules (closed_deepcam*.yaml), named after the reference's torch optimizer
parameters and schedulers: those the trials log, and a submission's schedule read back into a campaign."""

from __future__ import annotations

from mlcampaign.plan.hyperparameters import ADAM_BETAS, ADAM_EPSILON
from mlcampaign.plan.reproduce import Settings
from mlcampaign.records.mlperf.trial_log import Schedule

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
        values |= {"opt_betas": list(ADAM_BETAS), "opt_eps": ADAM_EPSILON}
    if lr_schedule["name"] in DEEPCAM_SCHEDULERS:
        values |= {
            "scheduler_type": DEEPCAM_SCHEDULERS[lr_schedule["name"]],
            "scheduler_t_max": schedule.decay_steps,
            "scheduler_eta_min": schedule.end_lr,
        }
    values |= {"scheduler_lr_warmup_steps": schedule.warmup_steps, "scheduler_lr_warmup_factor": 1.0}
    return values


def reproduce_schedule(settings: Settings, steps_per_epoch: float) -> None:
    """A DeepCAM submission's schedule as the project's (``mlcampaign reproduce``): DeepCAM's is in optimizer
    steps, the project's in epochs, at the submission's ``steps_per_epoch`` (mlcampaign.plan.reproduce)."""
    warmup = settings.take("scheduler_lr_warmup_steps", 0)
    factor = settings.take("scheduler_lr_warmup_factor", 1.0)
    if factor != 1.0:
        settings.drop("scheduler_lr_warmup_factor", factor, "the project's warm-up rises linearly from 0 (factor 1)")
    schedule: dict = {"warmup_epochs": round(warmup / steps_per_epoch, 6)}
    kind = settings.take("scheduler_type")
    if kind == "multistep":
        milestones = settings.take("scheduler_milestones", [])
        rate = settings.take("scheduler_decay_rate", 1.0)
        schedule |= {
            "name": "step",
            "milestones": [
                {"epoch": round(step / steps_per_epoch, 6), "factor": round(rate ** (index + 1), 12)}
                for index, step in enumerate(milestones)
            ],
        }
        epochs = [milestone["epoch"] for milestone in schedule["milestones"]]
        factors = [milestone["factor"] for milestone in schedule["milestones"]]
        settings.carry(
            f"scheduler multistep at steps {milestones}, decay {rate} -> step schedule at epochs {epochs} "
            f"(factors of the peak {factors})"
        )
    elif kind == "cosine_annealing":
        schedule["name"] = "cosine"
        for key in ("scheduler_t_max", "scheduler_eta_min"):
            settings.take(key)
        settings.carry("scheduler cosine_annealing -> cosine schedule to 0 over the remaining epochs")
    elif kind is not None:
        settings.drop("scheduler_type", kind, "the project's schedules are constant, cosine, polynomial and step")
        schedule["name"] = "constant"
    settings.carry(f"scheduler_lr_warmup_steps {warmup} -> warmup_epochs {schedule['warmup_epochs']}")
    settings.training["schedule"] = schedule
