"""HPC AI500 Valid FLOPS: FLOPS penalised for missing the quality target.

    FLOPS       = counted FLOPs of the training run / time-to-train
    penalty     = min((achieved / target) ** n, cap)   if higher quality is better (accuracy)
                  min((target / achieved) ** n, cap)   if lower is better (MAE)
    Valid FLOPS = FLOPS x penalty

(Jiang et al., "HPC AI500 V2.0", arXiv 2007.00279; Jiang, Gao et al., arXiv 2102.12848.) With the
default cap of 1 a run that beats the target earns no bonus. The exponent n and the target are
per-benchmark config values (``valid_flops`` and ``target`` in config/benchmarks/*.yaml).

Command line, to recompute a published entry from its numbers::

    python -m mlcampaign.analysis.valid_flops --flops-per-sample 23.0e9 --samples 115305030 \
        --time 3600 --achieved 0.75 --target 0.763 --direction higher --exponent 10
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mlcampaign.analysis.valid_flops",
        description="HPC AI500 Valid FLOPS of one training run.",
    )
    work = parser.add_mutually_exclusive_group(required=True)
    work.add_argument("--flops", type=float, help="counted FLOPs of the whole run")
    work.add_argument("--flops-per-sample", type=float, help="FLOPs per training sample (with --samples)")
    parser.add_argument("--samples", type=float, help="samples processed (epochs x dataset size)")
    parser.add_argument("--time", type=float, required=True, help="time-to-train in seconds")
    parser.add_argument("--achieved", type=float, required=True, help="quality reached")
    parser.add_argument("--target", type=float, required=True, help="quality target")
    parser.add_argument("--direction", choices=DIRECTIONS, required=True, help="which way quality is better")
    parser.add_argument("--exponent", type=float, required=True, help="penalty exponent n")
    parser.add_argument("--cap", type=float, default=1.0, help="upper bound of the penalty (default 1)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.flops_per_sample is not None and args.samples is None:
        parser.error("--flops-per-sample needs --samples")
    if args.flops is not None and args.samples is not None:
        parser.error("--samples goes with --flops-per-sample, not with --flops")
    flops = args.flops if args.flops is not None else args.flops_per_sample * args.samples
    try:
        result = valid_flops(flops, args.time, args.achieved, args.target, args.direction, args.exponent, args.cap)
    except ValueError as error:
        parser.error(str(error))
    print(f"FLOPs:       {flops:.6g}")
    print(f"FLOPS:       {result.flops_per_s:.6g} FLOP/s")
    print(f"penalty:     {result.penalty:.6g}")
    print(f"Valid FLOPS: {result.valid_flops_per_s:.6g} FLOP/s")


if __name__ == "__main__":
    main()
