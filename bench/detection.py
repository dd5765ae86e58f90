"""Change detection on simulated weekly histories (the #24 grid), big drops after earlier events, and the
change-point libraries' public series (mlcampaign.analysis.detection; docs/regression.md). A benchmark
that prints figures, not a timed test.

    .venv/bin/python bench/detection.py                        # ~12 min on 2 idle cores
    .venv/bin/python bench/detection.py --drop-histories 10000 # the big-drop table at 10 000 a setting (+25 min)
    .venv/bin/python bench/detection.py --settings             # also the settings' trade-offs
    .venv/bin/python bench/detection.py --site                 # only the site simulation (#31, detection_site.py)
    .venv/bin/python bench/detection.py --small-systems        # causes on one-cell systems (detection_small.py)
    .venv/bin/python bench/detection.py --only-null            # only the null rows' listings by detector

E-Divisive (MongoDB's signal-processing-algorithms) runs when it imports. It pins numpy < 2 and builds a
C extension, so it goes into the bench's own folder, never the project's environment:

    .venv/bin/python -m pip install --no-deps --target /tmp/edivisive \\
        signal-processing-algorithms==2.1.6 structlog==24.4.0 more-itertools==8.14.0
    PYTHONPATH=/tmp/edivisive .venv/bin/python bench/detection.py

The grid (#24): simulated weekly histories of one cell, 20 runs, a step at run 10 (runs 0-9 before,
10-19 after), throughput (higher is better) around 1000 samples/s, 3 trials per run. Noise models at a
coefficient of variation (CV) of 1, 3 or 5 %: normal (1 + CV z), lognormal (mean 1, same CV), outliers
(normal, and each trial slow with probability 1/10: throughput / 1.15), week-level (normal, and a run's
trials share a factor 1 + (CV / 2) z). Steps: runs 10-19 times (1 - step), for steps of 0, 3, 5, 10, 20 %.

Ours: everything ``detection.scan`` lists (CellChanges: alarms, minor shifts, outlying runs, whole-history
change points, big drops), online, as every week runs it (the scan of a history is causal: each run's
analysis sees only the runs up to it, so one scan lists what the weekly summaries list). apache-otava as
an operator runs it (compute_change_points with its defaults on the run medians, missing runs
forward-filled as otava's series do, re-run at every run); E-Divisive (signal-processing-algorithms
e_divisive, pvalue 0.01, 100 permutations, on the run medians; at the analyses of runs 10-13 and 19);
oracle: the per-run test's candidate starts with the run sd known exactly (z tests on run means,
calibrated to the same false-alarm rate): about the best any test on run values can do with this history.

Scoring. A listing names a start within 1 run of run 10, at an analysis of run 10 or later; d<=k: the
share of histories whose change was listed (any kind) by the analysis of run 10 + k ("within 3 runs" is
d<=3); matters d<=k: listed as an alarm that matters. FA/run (histories without a step): distinct
changes listed (a listing that updates an earlier one is the same change) by the analyses of runs 3-19,
over 17 analysed runs; matters FA/run: those that were, or became, alarms that matter. listings/change:
distinct changes listed in the step's direction starting from run 9 on, over the histories that listed
one (1.00: each change listed once; false alarms after the step add ~0.05). misnamed: share of step
histories with a listing more than 1 run from the step.

Big drops: 12 quiet runs, an earlier event at run 12 (none; a false improvement: run 12 alone 4 run sds
high; a true improvement: +5-15 % from run 12 on; a minor shift: +-1-2 % from run 12 on; an outlying run:
run 12 slow by 12 %), a drop of 10, 15 or 20 % 1-4 runs later (2-4 after a level change or a slow run: a
level of one run is an outlying run, and a slow run just before a drop is its start) lasting 2, 3 or
>= 4 runs (then back to the level before it), analysed up to 3 runs after the drop started. Missed:
no regression listed by the analyses of the drop's first run to the third after it (d<=3) whose runs
hold the drop's first run (its start at most a run after it, at most ``confirmation`` runs before it).
The oracle knows the run sd: the per-run test's candidate starts as z tests against the window before
them at the same per-run rate, with no knowledge of the earlier events (the information these histories
hold about the drop).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.special
import scipy.stats
from otava.analysis import compute_change_points, fill_missing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.analysis import detection

try:
    from signal_processing_algorithms.determinism import deterministic_numpy_random
    from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

    EDIVISIVE_MISSING = None
except ImportError as error:  # not in the project's environment: see the module docstring
    EDIVISIVE_MISSING = f"E-Divisive left out: {error} (install it in the bench's own folder: see bench/detection.py)"

RUNS = 20
STEP_RUN = 10
TOLERANCE = 1
FIRST_ANALYSED = 3
ANALYSED = RUNS - FIRST_ANALYSED
CVS = (0.01, 0.03, 0.05)
MODELS = ("normal", "lognormal", "outliers", "week-level")
STEPS = (0.0, 0.03, 0.05, 0.10, 0.20)
SETTINGS = detection.DetectionSettings()
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "changepoints"  # ../shared beside the checkout
SENSITIVITY = (
    {},
    {"confirmation": 0},
    {"confirmation": 1},
    {"false_alarm_rate": 0.005},
    {"false_alarm_rate": 0.02},
    {"window": 8},
    {"reference_outlier_alpha": 0.0},
    {"history_same_start": 0},
    {"matters_level": 2 * SETTINGS.per_run_rate},
    {"per_run_share": 1.0, "history_max_pvalue": 0.001},
)


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a table: a noise model, CV, step and the history's shape."""

    model: str
    cv: float
    step: float
    trials: int = 3
    one_trial_share: float = 0.0
    missing_share: float = 0.0
    label: str = ""


def trial_noise(rng: np.random.Generator, shape: tuple, model: str, cv: float) -> np.ndarray:
    """Multiplicative trial noise (histories x runs x trials) of a noise model at a CV."""
    z = rng.standard_normal(shape)
    if model == "lognormal":
        sigma = math.sqrt(math.log1p(cv**2))
        values = np.exp(sigma * z - sigma**2 / 2)
    else:
        values = 1 + cv * z
    if model == "outliers":
        values = np.where(rng.random(shape) < 0.1, values / 1.15, values)
    if model == "week-level":
        values = values * (1 + cv / 2 * rng.standard_normal((*shape[:2], 1)))
    return values


def simulate(rng: np.random.Generator, histories: int, row: Row, runs: int = RUNS) -> np.ndarray:
    """Trial values (histories x runs x trials) with the row's step at STEP_RUN; NaN for trials not ok."""
    values = trial_noise(rng, (histories, runs, row.trials), row.model, row.cv)
    values[:, STEP_RUN:, :] *= 1 - row.step
    values = 1000 * values
    if row.one_trial_share:
        values[:, :, 1:][rng.random((histories, runs)) < row.one_trial_share] = np.nan
    if row.missing_share:
        values[rng.random((histories, runs)) < row.missing_share] = np.nan
    return values


def scanned(trials: np.ndarray, settings: detection.DetectionSettings = SETTINGS) -> detection.ScanResult:
    """Everything the scan lists on one history (runs x trials; higher is better)."""
    return detection.scan(detection.run_series(list(trials)), "higher", settings)


@dataclasses.dataclass
class Score:
    """One history's listings against its step: first listing and first alarm that matters naming the
    step, distinct false changes (and those that mattered), changes listed in the step's direction."""

    first: int | None = None
    first_matters: int | None = None
    false: int = 0
    false_matters: int = 0
    listed_after_step: int = 0


def change_roots(changes: list[detection.CellChange]) -> list[int]:
    """For each CellChange, the change it belongs to (the index of its first listing): a listing that
    updates an earlier one (``updates``: that listing's run, same direction) is the same change."""
    roots: list[int] = []
    for number, change in enumerate(changes):
        earlier = [
            other
            for other in range(number)
            if changes[other].listed_at == change.updates
            and changes[other].direction_verdict == change.direction_verdict
        ]
        roots.append(roots[earlier[-1]] if change.updates is not None and earlier else number)
    return roots


def score(changes: list[detection.CellChange], step: float) -> Score:
    """Score one history's CellChanges (step down at STEP_RUN when ``step`` > 0). Distinct changes are
    update chains (change_roots); a chain names the step when one of its listings does (a regression
    starting within TOLERANCE of it, listed from STEP_RUN on)."""
    result = Score()
    roots = change_roots(changes)
    named = {
        root
        for change, root in zip(changes, roots, strict=True)
        if step > 0
        and abs(change.start - STEP_RUN) <= TOLERANCE
        and change.direction_verdict == "regression"
        and change.listed_at >= STEP_RUN
    }
    false, false_matters, after = set(), set(), set()
    for change, root in zip(changes, roots, strict=True):
        if root in named:
            result.first = change.listed_at if result.first is None else min(result.first, change.listed_at)
            if change.matters:
                first = result.first_matters
                result.first_matters = change.listed_at if first is None else min(first, change.listed_at)
        else:
            false.add(root)
            if change.matters:
                false_matters.add(root)
        if step > 0 and change.start >= STEP_RUN - TOLERANCE and change.direction_verdict == "regression":
            after.add(root)
    result.false, result.false_matters, result.listed_after_step = len(false), len(false_matters), len(after)
    return result


def _otava_starts(medians: list, analysed: int) -> list[int]:
    filled = medians[: analysed + 1]
    fill_missing(filled)
    return [int(point.index) for point in compute_change_points(filled)[0]] if filled[0] is not None else []


def apache_otava(trials: np.ndarray, step: float) -> Score:
    """apache-otava as an operator runs it, re-run at every run: first naming of the step, false starts."""
    medians = [None if np.isnan(run).all() else float(np.nanmedian(run)) for run in trials]
    result, false = Score(), set()
    for analysed in range(FIRST_ANALYSED, RUNS):
        for start in _otava_starts(medians, analysed):
            if step > 0 and abs(start - STEP_RUN) <= TOLERANCE and analysed >= STEP_RUN:
                result.first = analysed if result.first is None else min(result.first, analysed)
            else:
                false.add(start)
    result.false = len(false)
    return result


def edivisive_first(trials: np.ndarray, step: float, seed: int) -> int | None:
    """E-Divisive's first analysis (10-13) naming the step."""
    centres = np.array([np.nan if np.isnan(run).all() else float(np.nanmedian(run)) for run in trials])
    for analysed in range(STEP_RUN, STEP_RUN + 4):
        kept = np.flatnonzero(~np.isnan(centres[: analysed + 1]))
        with deterministic_numpy_random(seed):
            points = e_divisive(centres[kept], pvalue=0.01, permutations=100)
        if any(abs(int(kept[index]) - STEP_RUN) <= TOLERANCE for index in points):
            return analysed
    return None


@dataclasses.dataclass
class Oracle:
    """Known-noise z tests on run means over the same candidate starts as ours (no gate, no reset)."""

    levels: dict

    @classmethod
    @functools.cache
    def make(cls) -> Oracle:
        rng = np.random.default_rng(11)
        levels = {}
        for analysed in range(STEP_RUN, STEP_RUN + 4):
            draws = rng.standard_normal((200_000, analysed + 1))
            p = np.stack([cls._p(draws, analysed, k) for k in range(1, SETTINGS.confirmation + 2)], axis=1)
            levels[analysed] = float(np.quantile(p.min(axis=1), SETTINGS.per_run_rate))
        return cls(levels)

    @staticmethod
    def _p(values: np.ndarray, analysed: int, k: int, sd: float = 1.0) -> np.ndarray:
        start = analysed - k + 1
        reference = values[:, max(0, start - SETTINGS.window) : start]
        new = values[:, start : analysed + 1]
        z = (new.mean(axis=1) - reference.mean(axis=1)) / (sd * math.sqrt(1 / reference.shape[1] + 1 / k))
        return scipy.special.erfc(np.abs(z) / math.sqrt(2))

    def first(self, values: np.ndarray, sd: float) -> np.ndarray:
        """First analysis (10-13) naming a start within 1 of run 10, per history; 99 for none."""
        first = np.full(len(values), 99)
        for analysed in range(STEP_RUN + 3, STEP_RUN - 1, -1):
            p = np.stack([self._p(values, analysed, k, sd) for k in range(1, SETTINGS.confirmation + 2)], axis=1)
            start = analysed - p.argmin(axis=1)
            hit = (p.min(axis=1) <= self.levels[analysed]) & (np.abs(start - STEP_RUN) <= TOLERANCE)
            first = np.where(hit, analysed, first)
        return first


def _stationary(model: str, cv: float, trials: int = 3, runs: int = 4000) -> np.ndarray:
    return 1000 * trial_noise(np.random.default_rng(99), (1, runs, trials), model, cv)[0]


@functools.cache
def run_value_sd(model: str, cv: float, trials: int = 3) -> float:
    """sd of our run value (the Huber centre, log scale) under the model without a step: a long series
    through the package's own run values."""
    values = detection.run_values(detection.run_series(list(_stationary(model, cv, trials))), SETTINGS)
    return float(np.std(values))


@functools.cache
def run_mean_sd(model: str, cv: float) -> float:
    """sd of the log mean of a run's trials under the model without a step (the oracle's run value)."""
    return float(np.std(np.log(np.mean(_stationary(model, cv), axis=1))))


def _rate(values: list, histories: int) -> float:
    return float(np.sum(values) / (histories * ANALYSED))


def run_row(job: tuple[Row, int, int, int]) -> dict:
    """Ours, apache-otava, E-Divisive and the oracle over the histories of one row."""
    row, histories, edivisive_histories, seed = job
    data = simulate(np.random.default_rng(seed), histories, row)
    ours = [score(scanned(history).changes, row.step) for history in data]
    otava = [apache_otava(history, row.step) for history in data]
    summary = {"row": dataclasses.asdict(row), "histories": histories}
    for method, scores in (("ours", ours), ("apache-otava", otava)):
        firsts = np.array([99 if item.first is None else item.first for item in scores])
        summary[method] = {f"d<={k}": float(np.mean(firsts <= STEP_RUN + k)) for k in range(4)}
        summary[method] |= {
            "fa_run": _rate([item.false for item in scores], histories),
            "misnamed": float(np.mean([item.false > 0 for item in scores])),
        }
    matters = np.array([99 if item.first_matters is None else item.first_matters for item in ours])
    listed = [item.listed_after_step for item in ours if item.listed_after_step]
    summary["ours"] |= {f"matters d<={k}": float(np.mean(matters <= STEP_RUN + k)) for k in range(4)}
    summary["ours"] |= {
        "matters_fa_run": _rate([item.false_matters for item in ours], histories),
        "listings_per_change": float(np.mean(listed)) if listed else math.nan,
        "listed_twice": float(np.mean([count > 1 for count in listed])) if listed else math.nan,
    }
    if edivisive_histories and row.step:
        firsts = [edivisive_first(data[h], row.step, seed * 10_000 + h) for h in range(edivisive_histories)]
        summary["E-Divisive"] = {"d<=3": float(np.mean([first is not None for first in firsts]))}
    if not row.one_trial_share and not row.missing_share and row.model != "outliers" and row.step:
        firsts = Oracle.make().first(np.log(np.mean(data, axis=2)), run_mean_sd(row.model, row.cv))
        summary["oracle"] = {f"d<={k}": float(np.mean(firsts <= STEP_RUN + k)) for k in range(4)}
    return summary


def _cell(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value * 100:.{digits}f}"


def null_table(summaries: list[dict]) -> str:
    """Markdown: per null row, the false changes listed and those that matter, per cell-run."""
    lines = [
        "| model | CV | histories | ours: listed FA/run % | ours: alarms that matter FA/run % "
        "| ours: histories with a listing % | apache-otava FA/run % |",
        "|---|---|---|---|---|---|---|",
    ]
    for summary in summaries:
        row, ours = summary["row"], summary["ours"]
        if row["step"]:
            continue
        lines.append(
            f"| {row['label'] or row['model']} | {row['cv']:.0%} | {summary['histories']} | "
            f"{_cell(ours['fa_run'], 2)} | "
            f"{_cell(ours['matters_fa_run'], 3)} | {_cell(ours['misnamed'], 1)} | "
            f"{_cell(summary['apache-otava']['fa_run'], 2)} |"
        )
    return "\n".join(lines)


def power_table(summaries: list[dict]) -> str:
    """Markdown: per step row, listed and alarms that matter by the analysis of the step run + k."""
    lines = [
        "| model | CV | step | ours listed d<=0 / 1 / 2 / 3 | ours matters d<=0 / 1 / 2 / 3 | listings/change "
        "| listed twice % | misnamed % | apache-otava d<=0 / 1 / 3 | E-Divisive d<=3 | oracle d<=0 / 1 / 3 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for summary in summaries:
        row, ours = summary["row"], summary["ours"]
        if not row["step"]:
            continue
        otava, oracle = summary["apache-otava"], summary.get("oracle")
        listed = " / ".join(_cell(ours[f"d<={k}"]) for k in range(4))
        matters = " / ".join(_cell(ours[f"matters d<={k}"]) for k in range(4))
        edivisive = _cell(summary["E-Divisive"]["d<=3"]) if "E-Divisive" in summary else "—"
        oracle_text = " / ".join(_cell(oracle[f"d<={k}"]) for k in (0, 1, 3)) if oracle else "—"
        lines.append(
            f"| {row['label'] or row['model']} | {row['cv']:.0%} | {row['step']:.0%} | {listed} | {matters} | "
            f"{ours['listings_per_change']:.2f} | {_cell(ours['listed_twice'], 1)} | {_cell(ours['misnamed'])} | "
            f"{' / '.join(_cell(otava[f'd<={k}']) for k in (0, 1, 3))} | {edivisive} | {oracle_text} |"
        )
    return "\n".join(lines)


def goals(summaries: list[dict], drops: list[dict]) -> str:
    """The issue's goals (#31) against the figures."""
    by = {(s["row"]["model"], s["row"]["cv"], s["row"]["step"]): s for s in summaries if not s["row"]["label"]}
    null = [by[(model, cv, 0.0)]["ours"] for model in MODELS for cv in CVS]
    listed, matters = [entry["fa_run"] for entry in null], [entry["matters_fa_run"] for entry in null]
    lines = ["| goal | figure | met? |", "|---|---|---|"]
    lines.append(
        f"| everything listed <= 1 % a cell-run in every null row | {_cell(min(listed), 2)}-{_cell(max(listed), 2)} % "
        f"(alarms that matter {_cell(min(matters), 3)}-{_cell(max(matters), 3)} %) | "
        f"{'yes' if max(listed) <= 0.01 else 'no'} |"
    )
    for model in ("normal", "lognormal"):
        ours = by[(model, 0.03, 0.05)]["ours"]
        lines.append(
            f"| 5 % step, CV 3 %, {model}: listed within 3 runs >= 90 % | {_cell(ours['d<=3'])} % (alarm that matters "
            f"{_cell(ours['matters d<=3'])} %; oracle "
            f"{_cell(by[(model, 0.03, 0.05)].get('oracle', {}).get('d<=3'))} %) "
            f"| {'yes' if ours['d<=3'] >= 0.9 else 'no'} |"
        )
    for model in MODELS:
        ours = by[(model, 0.01, 0.05)]["ours"]
        lines.append(
            f"| CV 1 %, {model}: 5 % step listed at the first changed run >= 95 % | {_cell(ours['d<=0'])} % "
            f"(alarm that matters {_cell(ours['matters d<=0'])} %) | {'yes' if ours['d<=0'] >= 0.95 else 'no'} |"
        )
    if drops:
        missed = sum(entry["missed"] for entry in drops)
        oracle = sum(entry["oracle_missed"] for entry in drops)
        total = sum(entry["histories"] for entry in drops)
        lines.append(
            f"| big drops (>= 2 x target, >= 2 runs): 0 missed within 3 runs | {missed} of {total} (oracle: {oracle}) "
            f"| {'yes' if not missed else 'no'} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Big drops after earlier events

EVENTS = ("none", "false improvement", "true improvement", "minor shift", "outlying run")
QUIET_RUNS = 12


def drop_history(rng: np.random.Generator, drop: float, duration: int, model: str, cv: float, event: str):
    """One history (runs x trials) with ``event`` at run 12 and a drop starting 1-4 runs later (2-4 after a
    level change or a slow run: a level of one run is an outlying run, and a slow run just before a drop
    is its start), lasting ``duration`` runs (99: to the end); and the drop's start."""
    start = QUIET_RUNS + int(rng.integers(1 if event in ("none", "false improvement") else 2, 5))
    runs = start + 4
    levels = np.ones(runs)
    if event == "false improvement":
        levels[QUIET_RUNS] *= math.exp(4 * run_value_sd(model, cv))
    elif event == "true improvement":
        levels[QUIET_RUNS:] *= 1 + rng.uniform(0.05, 0.15)
    elif event == "minor shift":
        levels[QUIET_RUNS:] *= 1 + rng.choice([-1, 1]) * rng.uniform(0.01, 0.02)
    elif event == "outlying run":
        levels[QUIET_RUNS] /= 1.12
    levels[start : start + duration] *= 1 - drop
    trials = 1000 * levels[:, None] * trial_noise(rng, (1, runs, 3), model, cv)[0]
    return trials, start


@functools.cache
def _drop_oracle_level() -> float:
    """The z threshold of the oracle's candidate starts (k = 1 .. confirmation + 1 against the window
    before them) that gives the per-run rate at a run."""
    draws = np.random.default_rng(13).standard_normal((200_000, SETTINGS.window + SETTINGS.confirmation + 1))
    return float(np.quantile(np.abs(_oracle_z(draws, draws.shape[1] - 1, 1.0)).max(axis=1), 1 - SETTINGS.per_run_rate))


def _oracle_z(values: np.ndarray, analysed: int, sd: float) -> np.ndarray:
    """z of each candidate start (columns: k = 1 ..) of the analysis of run ``analysed``, rows of run values."""
    columns = []
    for k in range(1, SETTINGS.confirmation + 2):
        first = analysed - k + 1
        reference = values[:, max(0, first - SETTINGS.window) : first]
        new = values[:, first : analysed + 1]
        columns.append((new.mean(axis=1) - reference.mean(axis=1)) / (sd * math.sqrt(1 / k + 1 / reference.shape[1])))
    return np.stack(columns, axis=1)


def drop_oracle(values: np.ndarray, start: int, sd: float) -> bool:
    """Whether the oracle — the per-run test's candidate starts as z tests with the run sd known (no
    knowledge of the earlier events) — names a drop starting within a run of ``start`` by the analysis of
    start + 3: the information these histories hold about the drop."""
    critical = _drop_oracle_level()
    for analysed in range(start, start + 4):
        z = _oracle_z(values[None, : analysed + 1], analysed, sd)[0]
        for k, value in enumerate(z, start=1):
            if abs(analysed - k + 1 - start) <= TOLERANCE and value < -critical:
                return True
    return False


def drop_row(job: tuple[float, int, int, int]) -> dict:
    """Misses of the big drops of one setting (drop, duration) over models, CVs and earlier events."""
    drop, duration, histories, seed = job
    rng = np.random.default_rng(seed)
    missed, oracle_missed, not_matters, by_cause = 0, 0, 0, {}
    for number in range(histories):
        model, cv = MODELS[number % len(MODELS)], CVS[(number // len(MODELS)) % len(CVS)]
        event = EVENTS[int(rng.integers(len(EVENTS)))]
        trials, start = drop_history(rng, drop, duration, model, cv, event)
        changes = scanned(trials).changes
        named = [
            change
            for change in changes
            if change.direction_verdict == "regression"
            and start - SETTINGS.confirmation <= change.start <= start + TOLERANCE
            and start <= change.listed_at <= start + 3
        ]
        values = detection.run_values(detection.run_series(list(trials)), SETTINGS)
        oracle = drop_oracle(values, start, run_value_sd(model, cv))
        oracle_missed += not oracle
        if not named:
            missed += 1
            key = f"{model} CV {cv:.0%} after {event}"
            by_cause[key] = by_cause.get(key, 0) + 1
        elif not any(change.matters for change in named):
            not_matters += 1
    return {
        "drop": drop,
        "duration": duration,
        "histories": histories,
        "missed": missed,
        "oracle_missed": oracle_missed,
        "not_matters": not_matters,
        "by_cause": by_cause,
    }


def drop_table(results: list[dict]) -> str:
    lines = [
        "| drop | lasting | histories | missed (not listed within 3 runs) | oracle missed | listed, not as an alarm "
        "that matters | where missed |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        lasting = ">= 4 runs" if result["duration"] >= 4 else f"{result['duration']} runs"
        causes = "; ".join(f"{key}: {count}" for key, count in sorted(result["by_cause"].items())) or "—"
        lines.append(
            f"| {result['drop']:.0%} | {lasting} | {result['histories']} | {result['missed']} | "
            f"{result['oracle_missed']} | {result['not_matters']} | {causes} |"
        )
    return "\n".join(lines)


def drop_bound_table(missed: float = 1e-4, drops: tuple = (0.10, 0.15, 0.20)) -> str:
    """What "0 missed in 10 000" asks of any test: the false alarms an ideal test of a 2-run drop makes where it
    misses fewer than ``missed`` of them. Ideal: the level before the drop, its start and length known, one-sided,
    on the mean of the drop's 2 run values (normal, with the sd our run values have under the model, simulated:
    run_value_sd); its threshold set where a drop of that size falls short of it with probability ``missed``, and
    the false alarms are the share of runs without a drop beyond that threshold."""
    lines = [
        f"| model | CV | run sd % | {' | '.join(f'{drop:.0%} drop: false alarms needed' for drop in drops)} |",
        "|---|---|---|" + "---|" * len(drops),
    ]
    quantile = scipy.stats.norm.ppf(1 - missed)
    for model in MODELS:
        for cv in CVS:
            sd = run_value_sd(model, cv)
            needed = [scipy.stats.norm.cdf(quantile + math.log1p(-drop) / (sd / math.sqrt(2))) for drop in drops]
            lines.append(f"| {model} | {cv:.0%} | {100 * sd:.2f} | " + " | ".join(f"{p:.2g}" for p in needed) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Settings, smallest detectable change, public series, convergence


def sensitivity_job(job: tuple[Row, dict, int, int]) -> dict:
    """Ours with other settings (the trade-offs behind the defaults), on one row."""
    row, changes, histories, seed = job
    settings = dataclasses.replace(SETTINGS, **changes)
    data = simulate(np.random.default_rng(seed), histories, row)
    scores = [score(scanned(history, settings).changes, row.step) for history in data]
    firsts = np.array([99 if item.first is None else item.first for item in scores])
    matters = np.array([99 if item.first_matters is None else item.first_matters for item in scores])
    listed = [item.listed_after_step for item in scores if item.listed_after_step]
    cells = {f"d<={k}": float(np.mean(firsts <= STEP_RUN + k)) for k in range(4)}
    cells["matters d<=3"] = float(np.mean(matters <= STEP_RUN + 3))
    cells["fa_run"] = _rate([item.false for item in scores], histories)
    cells["matters_fa_run"] = _rate([item.false_matters for item in scores], histories)
    cells["listings_per_change"] = float(np.mean(listed)) if listed else math.nan
    return {"row": dataclasses.asdict(row), "settings": changes, "histories": histories, **cells}


def sensitivity_table(results: list[dict]) -> str:
    lines = [
        "| model | CV | step | histories | settings | listed d<=0 | d<=1 | d<=2 | d<=3 | matters d<=3 | FA/run % "
        "| matters FA/run % | listings/change |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        row = result["row"]
        changes = ", ".join(f"{key}={value:g}" for key, value in result["settings"].items()) or "defaults"
        step = bool(row["step"])
        cells = " | ".join(_cell(result[f"d<={k}"]) if step else "—" for k in range(4))
        per_change = "—" if math.isnan(result["listings_per_change"]) else f"{result['listings_per_change']:.2f}"
        lines.append(
            f"| {row['model']} | {row['cv']:.0%} | {row['step']:.0%} | {result['histories']} | {changes} | {cells} | "
            f"{_cell(result['matters d<=3']) if step else '—'} | {_cell(result['fa_run'], 2)} | "
            f"{_cell(result['matters_fa_run'], 3)} | {per_change} |"
        )
    return "\n".join(lines)


def detectable_table() -> str:
    """Smallest change detected with 90 % power per model and CV (our run values' sd under the model),
    and the trials per run a 5 % change needs."""
    lines = [
        "| model | CV | run sd % | 1st run (10 ref) | within 4 runs (10 ref) | within 4 runs (12 ref)"
        " | trials/run for 5 % (simulated) | trials_needed (from the noise) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        for cv in CVS:
            run_sd = run_value_sd(model, cv)
            first = detection.detectable_change(run_sd, 10, 1, SETTINGS)
            four = detection.detectable_change(run_sd, 10, 4, SETTINGS)
            steady = detection.detectable_change(run_sd, 12, 4, SETTINGS)
            needed = next(
                (
                    str(trials)
                    for trials in range(1, 31)
                    if detection.detectable_change(run_value_sd(model, cv, trials), 12, 4, SETTINGS) <= 0.05
                ),
                "> 30",
            )
            within = math.sqrt(math.log1p(cv**2)) if model == "lognormal" else cv
            between = cv / 2 if model == "week-level" else 0.0
            noise = detection.Noise(12, 3, within, run_sd, 11, between, 0.0 if between else 1.0)
            module = detection.trials_needed(noise, SETTINGS) if model != "outliers" else "n/a"
            lines.append(
                f"| {model} | {cv:.0%} | {run_sd * 100:.2f} | {first:.1%} | {four:.1%} | {steady:.1%} | {needed} |"
                f" {'none suffices' if module is None else module} |"
            )
    return "\n".join(lines)


def public_series() -> list[dict]:
    """The series of the libraries' tests, with the change points those tests expect (docs/regression.md)."""
    sample = pd.read_csv(DATA / "otava-sample.csv")
    single = pd.read_csv(DATA / "otava-sample_single_branch.csv")
    long_series = json.loads((DATA / "mongodb-long_series.json").read_text())
    return [
        {"name": "otava-sample.csv metric1", "values": sample["metric1"].to_numpy(float), "expected": "none"},
        {"name": "otava-sample.csv metric2", "values": sample["metric2"].to_numpy(float), "expected": "6"},
        {
            "name": "otava-sample_single_branch.csv metric1",
            "values": single["metric1"].to_numpy(float),
            "expected": "none",
        },
        {
            "name": "otava-sample_single_branch.csv metric2",
            "values": single["metric2"].to_numpy(float),
            "expected": "none",
        },
        {"name": "mongodb-long_series.json", "values": np.asarray(long_series, float), "expected": "4 (count only)"},
    ]


def public_table() -> str:
    """Each method's change points on the public series; ours: what the scan lists (start at run, kind)."""
    lines = [
        "| series | runs | expected (libraries' tests) | apache-otava | E-Divisive | ours history (final) |"
        " ours listed (start at run: kind, source) |",
        "|---|---|---|---|---|---|---|",
    ]
    for item in public_series():
        values = item["values"]
        series = detection.run_series([[value] for value in values], detection.scale_of(values))
        otava = [int(point.index) for point in compute_change_points(values.tolist())[0]]
        edivisive = "not run"
        if EDIVISIVE_MISSING is None:
            with deterministic_numpy_random(1234):
                edivisive = _list(sorted(int(index) for index in e_divisive(values, pvalue=0.01, permutations=100)))
        ours = sorted(detection.change_points(series, SETTINGS))
        listed = [
            f"{change.start} at {change.listed_at}: {change.kind}, {change.source}"
            for change in detection.scan(series, "higher", SETTINGS).changes
            if change.updates is None
        ]
        lines.append(
            f"| {item['name']} | {len(values)} | {item['expected']} | {_list(otava)} | {edivisive} | {_list(ours)} |"
            f" {'; '.join(listed) or 'none'} |"
        )
    return "\n".join(lines)


def _list(values: list[int]) -> str:
    return ", ".join(map(str, values)) if values else "none"


def convergence_table(repeats: int = 4000) -> str:
    """Epochs to target, one-sided: 10 reference runs of 3 trials, epochs lognormal with a CV of 8 % around
    20, counted at whole-epoch evaluations (resolution 1); week-level: a run's trials share a factor with a
    CV of 4 %; misses: each trial misses the target with probability 0.1 (a convergence regression only
    when this run misses more than the history did)."""
    lines = ["| model | slowdown | runs flagged % (one-sided, 1 %) |", "|---|---|---|"]
    rng = np.random.default_rng(5)
    for model in ("trial noise", "week-level", "10 % misses"):
        for slowdown in (0.0, 0.05, 0.10, 0.20):
            flagged = 0
            for _ in range(repeats):
                base = 20 * np.exp(0.08 * rng.standard_normal((11, 3)))
                if model == "week-level":
                    base = base * np.exp(0.04 * rng.standard_normal((11, 1)))
                base[10] *= 1 + slowdown
                epochs = np.ceil(base)
                if model == "10 % misses":
                    epochs[rng.random(epochs.shape) < 0.1] = np.nan
                result = detection.convergence_test(list(epochs[:10]), epochs[10], SETTINGS, resolution=1.0)
                flagged += result.verdict == "regression"
            lines.append(f"| {model} | {slowdown:.0%} | {flagged / repeats * 100:.1f} |")
    return "\n".join(lines)


def rcp_cross_check() -> str:
    """rcp_checker's min acceptable mean (its bisection) against the closed form our test mirrors."""
    from mlperf_logging.rcp_checker import rcp_checker

    checker = rcp_checker.RCP_Checker("hpc", "3.0.0", "cosmoflow", False)
    lines = []
    for name, record in list(checker.rcp_data.items())[:3]:
        n_reference = len(record["Epochs to converge"]) - 2
        n_submission = checker.submission_runs - 2
        df = n_reference + n_submission - 2
        closed = record["RCP Mean"] - scipy.stats.t.isf(checker.alpha, df) * record["RCP Stdev"] * math.sqrt(
            1 / n_reference + 1 / n_submission
        )
        lines.append(f"{name}: rcp_checker min epochs {record['Min Epochs']:.4f}, closed form {closed:.4f}")
    return "\n".join(lines)


def scan_cost(runs: int = 52, repeats: int = 20) -> str:
    """The cost of one scan of a 52-run series (CV 3 %, normal), calibrations warm, and cold."""
    series = detection.run_series(list(simulate(np.random.default_rng(7), 1, Row("normal", 0.03, 0.0), runs)[0]))
    started = time.perf_counter()
    for _ in range(repeats):
        detection.scan(series, "higher", SETTINGS)
    cost = (time.perf_counter() - started) / repeats * 1000
    return f"one scan of a {runs}-run series: {cost:.0f} ms (calibrations cached)"


# ---------------------------------------------------------------------------------------------------


def grid_jobs(histories: int, null_histories: int, edivisive: int) -> tuple[list, list]:
    """The grid's rows (main, then other shapes of history) as jobs for run_row."""
    main_rows = [Row(model, cv, step) for model in MODELS for cv in CVS for step in STEPS]
    robust_rows = [
        Row("normal", 0.03, step, label=label, **shape)
        for label, shape in (
            ("2 trials", {"trials": 2}),
            ("5 trials", {"trials": 5}),
            ("20 % runs 1 ok trial", {"one_trial_share": 0.2}),
            ("10 % runs missing", {"missing_share": 0.1}),
        )
        for step in (0.0, 0.05)
    ]
    jobs = [
        (row, null_histories if not row.step else histories, edivisive if row.step else 0, index + 1)
        for index, row in enumerate(main_rows)
    ]
    jobs += [(row, histories, 0, 1000 + index) for index, row in enumerate(robust_rows)]
    return jobs, main_rows


def drop_jobs(histories: int, parts: int = 4) -> list[tuple]:
    """The big-drop settings (drop, duration) as jobs for drop_row, each split in ``parts`` (merged by
    drop_results)."""
    settings = [(drop, duration) for drop in (0.10, 0.15, 0.20) for duration in (2, 3, 99)]
    return [
        (drop, duration, histories // parts, 7000 + 10 * index + part)
        for index, (drop, duration) in enumerate(settings)
        for part in range(parts)
    ]


def drop_results(parts: list[dict]) -> list[dict]:
    """The parts of drop_jobs merged per setting."""
    merged: dict[tuple, dict] = {}
    counts = ("histories", "missed", "oracle_missed", "not_matters")
    for part in parts:
        entry = merged.setdefault(
            (part["drop"], part["duration"]),
            {"drop": part["drop"], "duration": part["duration"], **dict.fromkeys(counts, 0), "by_cause": {}},
        )
        for name in counts:
            entry[name] += part[name]
        for cause, count in part["by_cause"].items():
            entry["by_cause"][cause] = entry["by_cause"].get(cause, 0) + count
    return list(merged.values())


def drops_only(args) -> None:
    """Only the big-drop table (``--only-drops``)."""
    started = time.perf_counter()
    warm()
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        drops = drop_results(pool.map(drop_row, drop_jobs(args.drop_histories), chunksize=1))
    print(f"## Big drops after earlier events ({args.drop_histories} histories a setting)\n")
    print(drop_table(drops))
    print("\nThe false alarms an ideal test needs to miss fewer than 1 two-run drop in 10 000:\n")
    print(drop_bound_table())
    print(f"\nRuntime: {time.perf_counter() - started:.0f} s wall on {args.workers} workers.")
    if args.json:
        args.json.write_text(json.dumps({"drops": drops}))


def null_sources(job: tuple[str, float, int]) -> dict:
    """The listings of one null row (no change: every listing is false) per cell-run, by the detector that listed
    them (source: per run, history, big drop); and the distinct false changes (a listing that updates an earlier
    one is the same change: score) and those of them that mattered."""
    model, cv, histories = job
    rng = np.random.default_rng(1000 * MODELS.index(model) + round(cv * 100))
    counts: dict[str, int] = {}
    distinct = matters = 0
    for trials in simulate(rng, histories, Row(model, cv, 0.0)):
        changes = scanned(trials).changes
        for change in changes:
            if change.listed_at >= FIRST_ANALYSED:
                counts[change.source] = counts.get(change.source, 0) + 1
        scored = score(changes, 0.0)
        distinct, matters = distinct + scored.false, matters + scored.false_matters
    cell_runs = histories * ANALYSED
    rates = {source: 100 * count / cell_runs for source, count in counts.items()}
    return {
        "row": f"{model} CV {cv:.0%}",
        **rates,
        "distinct": 100 * distinct / cell_runs,
        "matters": 100 * matters / cell_runs,
    }


def null_only(args) -> None:
    """Only the null rows' listings by detector (``--only-null``)."""
    started = time.perf_counter()
    warm()
    jobs = [(model, cv, args.null_histories) for model in MODELS for cv in CVS]
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        rows = pool.map(null_sources, jobs, chunksize=1)
    print(f"## Listings without a change, per cell-run, by detector ({args.null_histories} histories a row)\n")
    print("| row | per run | history | big drop | all listings | distinct false changes | of them mattering |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        sources = [row.get(source, 0.0) for source in ("per run", "history", "big drop")]
        figures = [*sources, sum(sources), row["distinct"], row["matters"]]
        print(f"| {row['row']} | " + " | ".join(f"{value:.2f} %" for value in figures) + " |")
    print(f"\nRuntime: {time.perf_counter() - started:.0f} s wall on {args.workers} workers.")
    if args.json:
        args.json.write_text(json.dumps({"null_sources": rows}))


def warm() -> None:
    """Warm the calibrations and run-value sds once, before workers fork."""
    for model in MODELS:
        for cv in CVS:
            run_value_sd(model, cv)
            run_mean_sd(model, cv)
    for seed in range(4):
        for row in (Row("normal", 0.03, 0.05), Row("normal", 0.01, 0.20)):
            scanned(simulate(np.random.default_rng(seed), 1, row)[0])
    Oracle.make()
    _drop_oracle_level()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--histories", type=int, default=200, help="histories per row with a step")
    parser.add_argument("--null-histories", type=int, default=800, help="histories per row without a step")
    parser.add_argument("--drop-histories", type=int, default=1000, help="histories per big-drop setting")
    parser.add_argument("--edivisive-histories", type=int, default=100, help="of those, also through E-Divisive")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--settings", action="store_true", help="also the settings' trade-offs")
    parser.add_argument("--only-drops", action="store_true", help="only the big-drop table")
    parser.add_argument("--only-null", action="store_true", help="only the null rows' listings by detector")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--site", action="store_true", help="only the site simulation (bench/detection_site.py)")
    parser.add_argument("--site-years", type=int, default=2, help="simulated years of the site")
    parser.add_argument("--site-cells", type=int, default=50, help="cells per system of the site")
    parser.add_argument(
        "--small-systems", action="store_true", help="only the causes on systems of one cell (bench/detection_small.py)"
    )
    args = parser.parse_args()
    if args.small_systems:
        from detection_small import small_systems, small_table

        print(small_table(small_systems(args.histories, args.workers)))
        return
    if args.site:
        from detection_site import site, site_table, week_level_power

        figures = site(cells=args.site_cells, years=args.site_years, workers=args.workers)
        figures["week_level"] = week_level_power(args.histories, args.workers)
        print(site_table(figures))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1, default=float))
        return
    if args.only_drops:
        drops_only(args)
        return
    if args.only_null:
        null_only(args)
        return
    started = time.perf_counter()
    edivisive = 0 if EDIVISIVE_MISSING else args.edivisive_histories
    jobs, main_rows = grid_jobs(args.histories, args.null_histories, edivisive)
    warm()
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        summaries = pool.map(run_row, jobs, chunksize=1)
        drops = (
            drop_results(pool.map(drop_row, drop_jobs(args.drop_histories), chunksize=1)) if args.drop_histories else []
        )
        sensitivity = []
        if args.settings:
            rows = [Row("normal", 0.03, 0.05), Row("week-level", 0.03, 0.05)]
            rows += [Row("normal", 0.05, 0.0), Row("outliers", 0.01, 0.0)]
            sensitivity = pool.map(
                sensitivity_job,
                [
                    (row, changes, args.histories * (2 if not row.step else 1), 5000 + index)
                    for index, row in enumerate(rows)
                    for changes in SENSITIVITY
                ],
                chunksize=1,
            )
    simulated = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    main_summaries, robust_summaries = summaries[: len(main_rows)], summaries[len(main_rows) :]
    print(f"# Change detection bench ({args.histories} histories a row with a step, {args.null_histories} without;")
    print(f"{args.workers} workers, {os.cpu_count()} cpus)\n")
    print(f"{EDIVISIVE_MISSING}\n" if EDIVISIVE_MISSING else f"E-Divisive on {edivisive} histories a row.\n")
    se90 = math.sqrt(0.9 * 0.1 / args.histories)
    se_fa = math.sqrt(0.01 * 0.99 / (args.null_histories * ANALYSED))
    print(f"Monte-Carlo SE: {se90:.1%} at 90 %, {se_fa:.2%} at a false-alarm rate of 1 % a run.\n")
    print("## Goals\n")
    print(goals(main_summaries, drops))
    print("\n## False alarms: everything listed, per cell-run (histories without a step)\n")
    print(null_table(summaries))
    print("\n## Power: listed, and alarms that matter, by the analysis of the step run + k\n")
    print(power_table(main_summaries))
    print("\n## Other shapes of history: CV 3 %, normal\n")
    print(power_table(robust_summaries))
    if drops:
        print(f"\n## Big drops after earlier events ({args.drop_histories} histories a setting)\n")
        print(drop_table(drops))
        print("\nThe false alarms an ideal test needs to miss fewer than 1 two-run drop in 10 000:\n")
        print(drop_bound_table())
    if sensitivity:
        print("\n## Settings: one setting changed\n")
        print(sensitivity_table(sensitivity))
    print("\n## Smallest change detectable with 90 % power (per run, 1 % false alarms a run)\n")
    print(detectable_table())
    print("\n## Public series\n")
    print(public_table())
    print("\n## Convergence: epochs to target, one-sided\n")
    print(convergence_table())
    print("\nrcp_checker cross-check (hpc 3.0.0 cosmoflow):\n" + rcp_cross_check())
    print("\n" + scan_cost())
    own = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"\nRuntime: {time.perf_counter() - started:.0f} s wall ({simulated:.0f} s for the simulated tables on "
        f"{args.workers} workers); CPU {children.ru_utime + children.ru_stime:.0f} s in the workers, "
        f"{own.ru_utime + own.ru_stime:.0f} s in the main process."
    )
    if args.json:
        args.json.write_text(json.dumps({"grid": summaries, "drops": drops, "settings": sensitivity}))


if __name__ == "__main__":
    main()
