"""ResNet-50's keys in MLPerf's training rules (closed_resnet_sgd.yaml, closed_resnet_lars.yaml)."""

from __future__ import annotations

from mlperf_logging.mllog import constants

from mlcampaign.records.mlperf.trial_log import Schedule


def hyperparameters(benchmark: dict, schedule: Schedule) -> dict:
    """The keys prefixed by the optimizer; the decay keys describe MLPerf's polynomial decay, so only that
    schedule has them."""
    training = benchmark["training"]
    optimizer, lr_schedule = training["optimizer"], training["schedule"]
    values = {constants.MODEL_BN_SPAN: schedule.local_batch}
    name = optimizer["name"]
    if name not in ("sgd", "lars"):
        return values
    values |= {
        f"{name}_opt_base_learning_rate": schedule.peak_lr,
        f"{name}_opt_momentum": optimizer["momentum"],
        f"{name}_opt_weight_decay": optimizer["weight_decay"],
    }
    if name == "lars":
        values |= {
            constants.LARS_EPSILON: 0.0,
            constants.LARS_OPT_LEARNING_RATE_WARMUP_EPOCHS: lr_schedule["warmup_epochs"],
        }
    if lr_schedule["name"] == "polynomial":
        values |= {
            f"{name}_opt_end_learning_rate": schedule.end_lr,
            f"{name}_opt_learning_rate_decay_poly_power": lr_schedule["power"],
            f"{name}_opt_learning_rate_decay_steps": schedule.decay_steps,
        }
    return values
