"""The scores mlperf-logging's ``result_summarizer`` gives a folder of MLPerf HPC result logs, from the logs
as it reads them (mlcampaign.records.mlperf.result_logs): the olympic average of times to train, a strong-scaling
folder's score, a weak-scaling folder's figures, and for a closed division the RCP checker's verdict as the
summarizer's detailed table has it. Importing a published round scores its folders
(mlcampaign.history.published_rounds); the ``mlperf_results`` table scores the campaign's own cells with the
same olympic average (mlcampaign.analysis.mlperf_results).

These are underscore-private functions of mlperf-logging (pinned in requirements.txt): the tests that compare
every figure with the ``result_summarizer`` command line catch a change.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mlperf_logging.rcp_checker import rcp_checker
from mlperf_logging.result_summarizer import result_summarizer

from mlcampaign.records.mlperf.result_logs import USAGE, ResultLog

# _compute_strong_score_standalone's inline constant: runs the olympic average may drop.
MAX_DROPPED = 1


def olympic_average(minutes: Sequence[float], dropped: int) -> float | None:
    """mlperf-logging's olympic average of times to train (minutes): the fastest and the slowest run dropped,
    a dropped run (one that missed the target, or is not a compliant log) counting as the slowest; None
    where it gives none (more than MAX_DROPPED runs dropped, or too few runs)."""
    if dropped > MAX_DROPPED:
        return None
    return result_summarizer._compute_olympic_average(sorted(minutes), dropped, MAX_DROPPED)


def strong_score(minutes: list[float], dropped: int, factor: float | None) -> dict:
    """The summarizer's strong-scaling score of a folder (``_compute_strong_score_standalone``): the olympic
    average of the counted runs' minutes (runs it drops count as the slowest; None where more than one is
    dropped), times the folder's scaling.json factor (read as the round has it; None: unreadable)."""
    unscaled = olympic_average(minutes, dropped)
    return {
        "time_to_train_min": None if unscaled is None or factor is None else unscaled * factor,
        "unscaled_time_to_train_min": unscaled,
        "scaling_factor": factor,
        "counted_runs": len(minutes),
        "dropped_runs": dropped,
    }


def weak_score(counted: list[ResultLog], required: int | None) -> dict:
    """The summarizer's weak-scaling figures (``_compute_weak_score_standalone``): the compliant runs are the
    models, their instance scale, and the time to train all of them, reported only with at least the runs
    the rules require; throughput = models per minute, the HPC rules' weak-scaling metric."""
    scales = []
    for log in counted:
        try:
            scales.append(result_summarizer._query_instance_scale(log.loglines))
        except ValueError:
            scales.append(None)
    figures = {
        "number_of_models": len(counted),
        "instance_scale": scales[0] if scales else None,
        "instance_scales_differ": len(set(scales)) > 1,
        "time_to_train_all_min": None,
        "throughput_models_per_min": None,
    }
    if counted and required is not None and len(counted) >= required:
        minutes = (max(log.run_stop_ms for log in counted) - min(log.run_start_ms for log in counted)) / 60 / 1000
        figures |= {"time_to_train_all_min": minutes, "throughput_models_per_min": len(counted) / minutes}
    return figures


# The detailed summary's labels of the RCP checker's verdicts (_compute_strong_scaling_scores).
def _rcp_label(passed: bool, message: str) -> str:
    if passed:
        return "Pass"
    if message == "RCP found":
        return "Fail"
    if message == "RCP Interpolation":
        return "Interp. Fail"
    if "Missing" in message:
        return "Missing"
    if message == "Cannot find any RCPs":
        return "No RCP"
    return "Unknown state"


def rcp_failure(message: str) -> dict:
    """What the summarizer leaves of the RCP columns when its RCP code fails: nothing (and the message why)."""
    return {
        "rcp": None,
        "rcp_message": message,
        "rcp_norm_factor": None,
        "gbs": None,
        "epochs_to_converge_olympic": None,
    }


def rcp_block(verdict) -> dict:
    """The summarizer's RCP block of a closed strong-scaling folder from ``verdict()`` = (passed, message,
    norm factor, global batch, epochs): label, message, normalisation factor, global batch and the olympic
    mean of the runs' epochs (its detailed table's "samples_to_converge", which averages EPOCHS: 1e9 for
    a run that did not converge). Where the RCP code raises, the summarizer leaves them empty."""
    try:
        passed, message, norm, batch, epochs = verdict()
    except Exception as error:  # the summarizer's own catch-all around its RCP step
        return rcp_failure(f"RCP/GBS computation failed: {type(error).__name__}: {error}")
    olympic = None
    if epochs is not None and len(epochs) >= 3:
        epochs = sorted(epochs)
        olympic = sum(epochs[1:-1]) / len(epochs[1:-1])
    return {
        "rcp": _rcp_label(passed, message),
        "rcp_message": message,
        "rcp_norm_factor": float(norm),
        "gbs": batch,
        "epochs_to_converge_olympic": olympic,
    }


def library_rcp(folder: Path, ruleset: str) -> tuple:
    """rcp_checker.check_directory as the summarizer calls it (pruned RCPs, no bypass) on ``folder``, a
    throw-away copy (it rewrites scaling.json there), then get_submission_epochs."""
    passed, message, norm = rcp_checker.check_directory(
        str(folder), USAGE, ruleset, False, False, rcp_file=None, rcp_pass="pruned_rcps", rcp_bypass=False,
        set_scaling=True,
    )  # fmt: skip
    batch, epochs, _ = rcp_checker.get_submission_epochs(
        sorted(str(p) for p in folder.glob("result_*.txt")), ruleset, False
    )
    return passed, message, norm, batch, epochs


@functools.cache
def _rcp_checker(ruleset: str, benchmark: str) -> rcp_checker.RCP_Checker:
    # Loads and prunes the benchmark's RCP file once; the checker only reads it afterwards.
    return rcp_checker.RCP_Checker(USAGE, ruleset, benchmark, False)


def readings_rcp(readings: list, ruleset: str, scratch: Path) -> tuple:
    """check_directory's verdict (pruned RCPs, no bypass) and get_submission_epochs' batch and epochs from
    the runs' read_submission_file tuples (mlcampaign.records.mlperf.result_logs.rcp_reading), through the same
    RCP_Checker methods; raises where they raise. ``scratch``: a throw-away folder for the scaling.json that
    _eval_submission_record removes and writes (check_directory's set_scaling=False hands it "", which
    makes it remove /scaling.json)."""
    for reading in readings:
        if isinstance(reading, Exception):
            raise reading
    not_converged, epochs, batch, benchmark = 0, [], -1, None
    for run_not_converged, run_epochs, run_batch, run_benchmark in readings:  # get_submission_epochs
        epochs.append(run_epochs)
        not_converged += run_not_converged
        if batch == -1:
            batch = run_batch
        elif run_batch != batch:
            batch, epochs, benchmark = -1, None, None
            break
        if benchmark is None:
            benchmark = run_benchmark
        elif run_benchmark != benchmark:
            batch, epochs, benchmark = -1, None, None
            break
    else:
        if not_converged > 1:
            epochs = None
    if benchmark is None:
        raise KeyError(None)  # RCP_Checker(benchmark=None), as check_directory builds it
    checker = _rcp_checker(ruleset, benchmark)
    if batch == -1:
        return False, "Could not detect global_batch_size", 1.0, batch, epochs
    if epochs is None:
        return False, "Insufficient convergence", 1.0, batch, epochs
    folder = tempfile.mkdtemp(dir=scratch)
    record = checker._find_rcp(batch, "pruned_rcps")
    if record is not None:
        passed, norm = checker._eval_submission_record(record, list(epochs), folder)
        return passed, "RCP found", norm, batch, epochs
    low, high = checker._find_top_min_rcp(batch, "pruned_rcps"), checker._find_bottom_max_rcp(batch, "pruned_rcps")
    if low is not None and high is not None:
        _, interpolated = checker._create_interp_rcp(batch, low, high)
        passed, norm = checker._eval_submission_record(interpolated, list(epochs), folder)
        return passed, "RCP Interpolation", norm, batch, epochs
    if low is not None:
        return False, f"Missing RCP, please submit RCP with BS = {batch}", 1.0, batch, epochs
    if high is not None:
        passed, norm = checker._eval_submission_record(checker._find_min_rcp("pruned_rcps"), list(epochs), folder)
        message = (
            "RCP not found but slower convergence on smaller batch size"
            if passed
            else (f"Missing RCP, please submit RCP with BS = {batch}")
        )
        return passed, message, norm, batch, epochs
    return False, "Cannot find any RCPs", 1.0, batch, epochs
