"""HPC AI500 Valid FLOPS: FLOPS penalised for missing the quality target.

    FLOPS       = FLOPs counted under valid_flops.counting / run time (run_start to run_stop)
    penalty     = min((achieved / target) ** n, cap)   if higher quality is better (accuracy)
                  min((target / achieved) ** n, cap)   if lower is better (MAE)
    Valid FLOPS = FLOPS x penalty

(Jiang et al., "HPC AI500 V2.0", arXiv 2007.00279; Jiang, Gao et al., arXiv 2102.12848.) With the
default cap of 1 a run that beats the target earns no bonus. The exponent n and the target are
per-benchmark config values (``valid_flops`` and ``target`` in config/benchmarks/*.yaml).

Which FLOPs count is a stated convention, ``valid_flops.counting`` of the benchmark (a campaign may
override it): ``counted_flops`` applies it and ``counting_label`` names it in every table that shows
Valid FLOPS. The project's default counts what the run did (training steps on every trained sample
and forward passes on every evaluated one, at the project's FLOPs per sample); HPC AI500's ranking
counts training only, over nominal epochs x training-set size, at its own FLOPs per image
(config/campaigns/hpcai500.yaml). The two differ by about 7 % for the same ResNet-50 run.

Command line, to recompute a published entry from its numbers::

    mlcampaign valid-flops --flops-per-sample 23.0e9 --samples 115305030 \
        --time 3600 --achieved 0.75 --target 0.763 --direction higher --exponent 10
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from mlcampaign.plan.config_files import schema_default
from mlcampaign.plan.metrics import work_flops

DIRECTIONS = ("higher", "lower")


def valid_flops_penalty(achieved, target, direction, exponent, cap=1.0):
    """The HPC AI500 penalty factor, elementwise; NaN where ``achieved`` is NaN.

    ``direction`` is "higher" (higher quality is better) or "lower" (e.g. MAE).
    """
    achieved, target = np.asarray(achieved, dtype=float), np.asarray(target, dtype=float)
    direction = np.asarray(direction, dtype=object)
    measured = ~np.isnan(achieved)
    unknown = measured & ~np.isin(direction, DIRECTIONS)
    if unknown.any():
        bad = np.broadcast_to(direction, unknown.shape)[unknown].flat[0]
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {bad!r}")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(direction == "lower", target / achieved, achieved / target)
        penalty = np.minimum(ratio ** np.asarray(exponent, dtype=float), cap)
    penalty = np.where(measured, penalty, np.nan)
    return penalty if penalty.ndim else float(penalty)


@dataclasses.dataclass(frozen=True)
class ValidFlops:
    flops_per_s: float
    penalty: float
    valid_flops_per_s: float


def valid_flops(
    flops: float, time_s: float, achieved: float, target: float, direction: str, exponent: float, cap: float = 1.0
) -> ValidFlops:
    """Valid FLOPS of one run: ``flops`` counted FLOPs in ``time_s`` seconds reaching ``achieved``."""
    if time_s <= 0:
        raise ValueError(f"time must be positive, got {time_s}")
    if flops < 0:
        raise ValueError(f"FLOPs must not be negative, got {flops}")
    flops_per_s = flops / time_s
    penalty = valid_flops_penalty(achieved, target, direction, exponent, cap)
    return ValidFlops(flops_per_s, penalty, flops_per_s * penalty)


# The project's convention (the schema's default): what the run did, at the project's FLOPs per sample.
_DEFAULT_COUNTING = schema_default("benchmark", "valid_flops", "counting")


def counting_of(valid_flops: Mapping) -> dict:
    """A benchmark's ``valid_flops.counting``; the schema's default where it is absent (a benchmark config
    or run manifest written before the setting existed counted that way, the only way there was)."""
    return dict(valid_flops.get("counting", _DEFAULT_COUNTING))


def counted_flops(
    counting: Mapping,
    record_total,
    train_per_sample,
    forward_per_sample,
    samples_trained,
    samples_evaluated,
    train_set_samples,
):
    """FLOPs that Valid FLOPS counts for runs (elementwise) under ``counting`` (``valid_flops.counting``).

    The run's own numbers are its record's: ``record_total`` (``flops.total``, what the run did at the
    project's count: the default convention's number as the record states it), FLOPs per trained and
    per evaluated sample (``flops`` block), ``samples_trained`` and ``samples_evaluated``
    (``metrics``) and ``train_set_samples`` (``dataset.train_samples``, the size of a nominal epoch).
    NaN where a number the convention needs is unknown.
    """
    if {key: value for key, value in counting.items() if key != "source"} == _DEFAULT_COUNTING:
        return np.asarray(record_total, dtype=float) if np.ndim(record_total) else float(record_total)
    per_sample = counting.get("train_flops_per_sample", train_per_sample)
    if counting["samples"] == "nominal":
        trained = counting["nominal_epochs"] * np.asarray(train_set_samples, dtype=float)
    else:
        trained = samples_trained
    evaluated = samples_evaluated if counting["work"] == "training_and_evaluation" else np.zeros_like(trained, float)
    return work_flops(per_sample, forward_per_sample, trained, evaluated)


def counting_label(counting: Mapping) -> str:
    """The convention in words, for the tables' ``flops_counting`` columns."""
    work = "training + evaluation" if counting["work"] == "training_and_evaluation" else "training only"
    if counting["samples"] == "nominal":
        samples = f"{counting['nominal_epochs']} nominal epochs x training set"
    else:
        samples = "measured samples"
    if "train_flops_per_sample" in counting:
        per_sample = f"{counting['train_flops_per_sample'] / 1e9:.4g} GFLOP per training sample"
    else:
        per_sample = "counted FLOPs per sample"
    return f"{work}; {samples}; {per_sample}"
