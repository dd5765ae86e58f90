"""Change detection on simulated weekly histories and on the change-point libraries' public series
(mlcampaign.analysis.detection; docs/regression.md). A benchmark that prints figures, not a timed test.

    .venv/bin/python bench/detection.py                   # ~5 min on 2 idle cores
    .venv/bin/python bench/detection.py --histories 400   # tighter figures (twice the time)
    .venv/bin/python bench/detection.py --settings        # also the settings' trade-offs (+3 min)

E-Divisive (MongoDB's signal-processing-algorithms) runs when it imports. It pins numpy < 2 and builds a
C extension, so it goes into the bench's own folder, never the project's environment:

    .venv/bin/python -m pip install --no-deps --target /tmp/edivisive \\
        signal-processing-algorithms==2.1.6 structlog==24.4.0 more-itertools==8.14.0
    PYTHONPATH=/tmp/edivisive .venv/bin/python bench/detection.py

Simulated weekly histories of one cell: 20 runs, a step at run 10 (runs 0-9 before, 10-19 after),
throughput (higher is better) around 1000 samples/s, 3 trials per run. Noise models at a coefficient of
variation (CV) of 1, 3 or 5 %: normal (1 + CV z), lognormal (mean 1, same CV), outliers (normal, and
each trial slow with probability 1/10: throughput / 1.15), week-level (normal, and a run's trials share
a factor 1 + (CV / 2) z). Steps: runs 10-19 times (1 - step), for steps of 0, 3, 5, 10, 20 %.

Methods, on the same histories: ours per run (detection.scan, online, as every week runs it); ours
history (detection.change_points: apache-otava on our run values, re-run at every run); ours combined
(the first detection of either, the union of their false alarms); apache-otava as an operator runs it
(compute_change_points with its defaults on the run medians, missing runs forward-filled as otava's
series do, re-run at every run); E-Divisive (signal-processing-algorithms e_divisive, pvalue 0.01, 100
permutations, on the run medians; at the analyses of runs 10-13 and 19 only, on a subset: ~2 ms a call);
oracle: the per-run test's candidate starts with the run sd known exactly (z tests on run means,
calibrated to the same false-alarm rate): about the best any test on run values can do with this history.

Scoring. A detection names a start within 1 run of run 10, at an analysis of run 10 or later; d<=k: the
share of histories detected by the analysis of run 10 + k ("within 3 runs" is d<=3). "found": detected
by the end (per run: ever; history methods: by the final analysis). FA/run (histories without a step):
distinct starts named by any analysis of runs 3-19, over 17 analysed runs. misnamed (with a step): share
of histories in which a start more than 1 run from the step was named. FA/boundary: false change points
of the final analysis over its 19 run boundaries. The history methods are re-run at the analyses of
runs 3-13 and 19 (time). The oracle is left out under the outlier model (its run values are not normal).
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
HISTORY_ANALYSES = (*range(FIRST_ANALYSED, STEP_RUN + 4), RUNS - 1)
CVS = (0.01, 0.03, 0.05)
MODELS = ("normal", "lognormal", "outliers", "week-level")
STEPS = (0.0, 0.03, 0.05, 0.10, 0.20)
METHODS = ("ours per run", "ours history", "ours combined", "apache-otava", "E-Divisive", "oracle")
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


def simulate(rng: np.random.Generator, histories: int, row: Row, runs: int = RUNS) -> np.ndarray:
    """Trial values (histories x runs x trials); NaN for trials that are not ok."""
    shape = (histories, runs, row.trials)
    z = rng.standard_normal(shape)
    if row.model == "lognormal":
        sigma = math.sqrt(math.log1p(row.cv**2))
        values = np.exp(sigma * z - sigma**2 / 2)
    else:
        values = 1 + row.cv * z
    if row.model == "outliers":
        values = np.where(rng.random(shape) < 0.1, values / 1.15, values)
    if row.model == "week-level":
        values = values * (1 + row.cv / 2 * rng.standard_normal((histories, runs, 1)))
    values[:, STEP_RUN:, :] *= 1 - row.step
    values = 1000 * values
    if row.one_trial_share:
        values[:, :, 1:][rng.random((histories, runs)) < row.one_trial_share] = np.nan
    if row.missing_share:
        values[rng.random((histories, runs)) < row.missing_share] = np.nan
    return values


def _is_step(start: int, step: float) -> bool:
    return step > 0 and abs(start - STEP_RUN) <= TOLERANCE


class Outcome:
    """One method on one history: first detecting analysis, false starts named online, final analysis."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.false: set[int] = set()
        self.final_found = False
        self.final_false = 0

    def name(self, start: int, analysed: int, step: float) -> None:
        if _is_step(start, step) and analysed >= STEP_RUN:
            self.first = analysed if self.first is None else min(self.first, analysed)
        else:
            self.false.add(start)

    def final(self, starts: list[int], step: float) -> None:
        self.final_found = any(_is_step(start, step) for start in starts)
        self.final_false = sum(not _is_step(start, step) for start in starts)


def evaluate(trials: np.ndarray, step: float, edivisive_seed: int | None) -> dict[str, Outcome]:
    """Every method on one history (runs x trials)."""
    outcomes = {method: Outcome() for method in METHODS[:5]}
    series = detection.run_series(list(trials))
    per_run = outcomes["ours per run"]
    for result in detection.scan(series, "higher", SETTINGS):
        if result.verdict in detection.ALARMS:
            per_run.name(result.change_start, result.run, step)
    per_run.final_found = per_run.first is not None
    medians = [None if np.isnan(run).all() else float(np.nanmedian(run)) for run in trials]
    history, otava = outcomes["ours history"], outcomes["apache-otava"]
    starts = otava_starts = []
    for analysed in HISTORY_ANALYSES:
        upto = detection.RunSeries(series.values[: analysed + 1], series.scale)
        starts = list(detection.change_points(upto, SETTINGS))
        for start in starts:
            history.name(start, analysed, step)
        filled = medians[: analysed + 1]
        fill_missing(filled)
        otava_starts = [int(point.index) for point in compute_change_points(filled)[0]] if filled[0] is not None else []
        for start in otava_starts:
            otava.name(start, analysed, step)
    history.final(starts, step)
    otava.final(otava_starts, step)
    combined = outcomes["ours combined"]
    firsts = [first for first in (per_run.first, history.first) if first is not None]
    combined.first = min(firsts) if firsts else None
    combined.false = per_run.false | history.false
    combined.final_found = per_run.final_found or history.final_found
    combined.final_false = history.final_false
    if edivisive_seed is not None:
        edivisive = outcomes["E-Divisive"]
        centres = np.array([np.nan if median is None else median for median in medians])
        for analysed in (*range(STEP_RUN, STEP_RUN + 4), RUNS - 1):
            kept = np.flatnonzero(~np.isnan(centres[: analysed + 1]))
            with deterministic_numpy_random(edivisive_seed):
                points = e_divisive(centres[kept], pvalue=0.01, permutations=100)
            found = [int(kept[index]) for index in points]
            if analysed < RUNS - 1:
                for start in found:
                    if _is_step(start, step):
                        edivisive.name(start, analysed, step)
            else:
                edivisive.final(found, step)
    return outcomes


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
            levels[analysed] = float(np.quantile(p.min(axis=1), SETTINGS.false_alarm_rate))
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


def _stationary(row: Row, trials: int | None = None, runs: int = 4000) -> np.ndarray:
    shaped = dataclasses.replace(row, step=0.0, trials=trials or row.trials, one_trial_share=0.0, missing_share=0.0)
    return simulate(np.random.default_rng(99), 1, shaped, runs)[0]


@functools.cache
def run_value_sd(row: Row, trials: int | None = None) -> float:
    """sd of our run value (the Huber centre, log scale) under the model without a step: a long series
    through the package's own run values."""
    values = detection.run_values(detection.run_series(list(_stationary(row, trials))), SETTINGS)
    return float(np.std(values))


@functools.cache
def run_mean_sd(row: Row) -> float:
    """sd of the log mean of a run's trials under the model without a step (the oracle's run value)."""
    return float(np.std(np.log(np.mean(_stationary(row), axis=1))))


def run_row(job: tuple[Row, int, int, int]) -> dict:
    """Every method over the histories of one row."""
    row, histories, edivisive_histories, seed = job
    data = simulate(np.random.default_rng(seed), histories, row)
    results = [
        evaluate(data[h], row.step, seed * 10_000 + h if h < edivisive_histories else None) for h in range(histories)
    ]
    summary = {"row": dataclasses.asdict(row), "histories": histories, "edivisive_histories": edivisive_histories}
    for method in METHODS[:5]:
        outcomes = [result[method] for result in results]
        if method == "E-Divisive":
            outcomes = outcomes[:edivisive_histories]
            if not outcomes:
                continue
        firsts = np.array([99 if outcome.first is None else outcome.first for outcome in outcomes])
        summary[method] = {
            **{f"d<={k}": float(np.mean(firsts <= STEP_RUN + k)) for k in range(4)},
            "found": float(np.mean([outcome.final_found for outcome in outcomes])),
            "fa_run": float(np.sum([len(outcome.false) for outcome in outcomes]) / (len(outcomes) * ANALYSED)),
            "misnamed": float(np.mean([len(outcome.false) > 0 for outcome in outcomes])),
            "fa_boundary": float(np.sum([outcome.final_false for outcome in outcomes]) / (len(outcomes) * (RUNS - 1))),
        }
    if not row.one_trial_share and not row.missing_share and row.model != "outliers":
        firsts = Oracle.make().first(np.log(np.mean(data, axis=2)), run_mean_sd(row))
        summary["oracle"] = {f"d<={k}": float(np.mean(firsts <= STEP_RUN + k)) for k in range(4)}
        summary["oracle"] |= {"found": math.nan, "fa_run": SETTINGS.false_alarm_rate, "fa_boundary": math.nan}
        summary["oracle"]["misnamed"] = math.nan
    return summary


def _cell(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value * 100:.{digits}f}"


def power_table(summaries: list[dict], methods: tuple[str, ...]) -> str:
    """Markdown: one line per row and method."""
    lines = [
        "| model | CV | step | method | d<=0 | d<=1 | d<=2 | d<=3 | found | FA/run % | misnamed % | FA/boundary % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for summary in summaries:
        row = summary["row"]
        for method in methods:
            if method not in summary:
                continue
            cells = summary[method]
            null = row["step"] == 0
            edivisive = method == "E-Divisive"
            steps = " | ".join("—" if null else _cell(cells[f"d<={k}"]) for k in range(4))
            fa_run = "—" if edivisive or not null else _cell(cells["fa_run"], 2)
            misnamed = "—" if edivisive or null else _cell(cells["misnamed"])
            lines.append(
                f"| {row['label'] or row['model']} | {row['cv']:.0%} | {row['step']:.0%} | {method} | {steps} | "
                f"{'—' if null else _cell(cells['found'])} | {fa_run} | {misnamed} | {_cell(cells['fa_boundary'], 2)} |"
            )
    return "\n".join(lines)


def goals(summaries: list[dict]) -> str:
    """The issue's goals against the figures of the main table."""
    by = {(s["row"]["model"], s["row"]["cv"], s["row"]["step"]): s for s in summaries}
    lines = ["| goal | figure | met? |", "|---|---|---|"]
    for model in ("normal", "week-level"):
        cells = by[(model, 0.03, 0.05)]
        combined, null = cells["ours combined"], by[(model, 0.03, 0.0)]["ours combined"]
        oracle = cells.get("oracle", {}).get("d<=3", math.nan)
        met = combined["d<=3"] >= 0.9 and null["fa_run"] <= 0.01
        lines.append(
            f"| 5 % step, CV 3 %, {model}: >= 90 % within 3 runs, <= 1 % false alarms a cell-run | "
            f"{_cell(combined['d<=3'])} % (per run alone {_cell(cells['ours per run']['d<=3'])} %, apache-otava "
            f"{_cell(cells['apache-otava']['d<=3'])} %, oracle {_cell(oracle)} %); false alarms "
            f"{_cell(null['fa_run'], 2)} % a run | {'yes' if met else 'no'} |"
        )
    for model in MODELS:
        first = by[(model, 0.01, 0.05)]["ours combined"]["d<=0"]
        lines.append(
            f"| CV 1 %, {model}: >= 90 % of 5 % steps at the first changed run | {_cell(first)} % "
            f"(apache-otava {_cell(by[(model, 0.01, 0.05)]['apache-otava']['d<=0'])} %) | "
            f"{'yes' if first >= 0.9 else 'no'} |"
        )
    null_rates = [by[(model, cv, 0.0)]["ours per run"]["fa_run"] for model in MODELS for cv in CVS]
    combined_rates = [by[(model, cv, 0.0)]["ours combined"]["fa_run"] for model in MODELS for cv in CVS]
    lines.append(
        f"| <= 1 % false alarms a cell-run (12 null rows) | per run {_cell(min(null_rates), 2)}-"
        f"{_cell(max(null_rates), 2)} %, per run + history {_cell(min(combined_rates), 2)}-"
        f"{_cell(max(combined_rates), 2)} % | {'yes' if max(null_rates) <= 0.01 else 'no'} (per run) |"
    )
    behind = []
    for summary in summaries:
        if summary["row"]["step"] == 0:
            continue
        for column in ("d<=0", "d<=1", "d<=3", "found"):
            ours, theirs = summary["ours combined"][column], summary["apache-otava"][column]
            if round(ours * 100) < round(theirs * 100):
                row = summary["row"]
                behind.append(
                    f"{row['model']} CV {row['cv']:.0%} step {row['step']:.0%} {column} {ours:.0%} < {theirs:.0%}"
                )
    compared = 4 * sum(1 for summary in summaries if summary["row"]["step"])
    lines.append(
        f"| no row worse than apache-otava | behind in {len(behind)} of {compared} cells"
        f"{': ' + '; '.join(behind) if behind else ''} | {'yes' if not behind else 'no'} |"
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
            row = Row(model, cv, 0.0)
            run_sd = run_value_sd(row)
            first = detection.detectable_change(run_sd, 10, 1, SETTINGS)
            four = detection.detectable_change(run_sd, 10, 4, SETTINGS)
            steady = detection.detectable_change(run_sd, 12, 4, SETTINGS)
            needed = next(
                (
                    str(trials)
                    for trials in range(1, 31)
                    if detection.detectable_change(run_value_sd(row, trials), 12, 4, SETTINGS) <= 0.05
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


def sensitivity_job(job: tuple[Row, dict, int, int]) -> dict:
    """Ours per run with other settings (the trade-offs behind the defaults), on one row."""
    row, changes, histories, seed = job
    settings = dataclasses.replace(SETTINGS, **changes)
    firsts, false = [], 0
    for history in simulate(np.random.default_rng(seed), histories, row):
        first = None
        for result in detection.scan(detection.run_series(list(history)), "higher", settings):
            if result.verdict in detection.ALARMS:
                if _is_step(result.change_start, row.step) and result.run >= STEP_RUN:
                    first = result.run if first is None else min(first, result.run)
                else:
                    false += 1
        firsts.append(99 if first is None else first)
    firsts = np.array(firsts)
    cells = {f"d<={k}": float(np.mean(firsts <= STEP_RUN + k)) for k in range(4)}
    return {"row": dataclasses.asdict(row), "settings": changes, **cells, "fa_run": false / (histories * ANALYSED)}


def sensitivity_table(results: list[dict]) -> str:
    lines = [
        "| model | CV | step | settings | d<=0 | d<=1 | d<=2 | d<=3 | FA/run % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        row = result["row"]
        changes = ", ".join(f"{key}={value}" for key, value in result["settings"].items()) or "defaults"
        cells = " | ".join(_cell(result[f"d<={k}"]) for k in range(4))
        fa_run = _cell(result["fa_run"], 2)
        lines.append(f"| {row['model']} | {row['cv']:.0%} | {row['step']:.0%} | {changes} | {cells} | {fa_run} |")
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
    """Each method's change points on the public series; ours per run: its online alarms (start, at run)."""
    lines = [
        "| series | runs | expected (libraries' tests) | apache-otava | E-Divisive | ours history (final) |"
        " ours per run (online alarms: start at run) | ours history first found at run |",
        "|---|---|---|---|---|---|---|---|",
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
        alarms = {}
        for result in detection.scan(series, "higher", SETTINGS):
            if result.verdict in detection.ALARMS:
                alarms.setdefault(result.change_start, result.run)
        # Re-run at every run (every 10th run on the long series: otava costs ~1 s a call there).
        every = 1 if len(values) < 100 else 10
        first_found: dict[int, int] = {}
        for analysed in range(2, len(values), every):
            upto = detection.RunSeries(series.values[: analysed + 1], series.scale)
            for start in detection.change_points(upto, SETTINGS):
                first_found.setdefault(start, analysed)
        alarm_text = ", ".join(f"{start} at {run}" for start, run in alarms.items()) or "none"
        found_text = ", ".join(f"{start}: {first_found.get(start, len(values) - 1)}" for start in ours) or "—"
        lines.append(
            f"| {item['name']} | {len(values)} | {item['expected']} | {_list(otava)} | {edivisive} | {_list(ours)} |"
            f" {alarm_text} | {found_text} |"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--histories", type=int, default=200, help="histories per row")
    parser.add_argument("--edivisive-histories", type=int, default=100, help="of those, also through E-Divisive")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--settings", action="store_true", help="also the settings' trade-offs (ours per run)")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    args = parser.parse_args()
    started = time.perf_counter()
    edivisive = 0 if EDIVISIVE_MISSING else args.edivisive_histories
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
    jobs = [(row, args.histories, edivisive, index + 1) for index, row in enumerate(main_rows)]
    jobs += [(row, args.histories, 0, 1000 + index) for index, row in enumerate(robust_rows)]
    # Warm every calibration and run-value sd once, before the workers fork.
    detection.scan(detection.run_series([[1.0, 1.01, 0.99]] * RUNS), "higher", SETTINGS)
    Oracle.make()
    for row in main_rows:
        if row.model != "outliers":
            run_mean_sd(dataclasses.replace(row, step=0.0))
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        summaries = pool.map(run_row, jobs, chunksize=1)
        sensitivity = []
        if args.settings:
            rows = [Row("normal", 0.03, 0.05), Row("week-level", 0.03, 0.05), Row("week-level", 0.01, 0.05)]
            rows.append(Row("normal", 0.03, 0.0))
            sensitivity = pool.map(
                sensitivity_job,
                [
                    (row, changes, args.histories * 2, 5000 + index)
                    for index, row in enumerate(rows)
                    for changes in SENSITIVITY
                ],
                chunksize=1,
            )
    simulated = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    main_summaries, robust_summaries = summaries[: len(main_rows)], summaries[len(main_rows) :]
    print(
        f"# Change detection bench ({args.histories} histories a row; {args.workers} workers, {os.cpu_count()} cpus)\n"
    )
    if EDIVISIVE_MISSING:
        print(f"{EDIVISIVE_MISSING}\n")
    else:
        print(f"E-Divisive on {edivisive} histories a row.\n")
    se90 = math.sqrt(0.9 * 0.1 / args.histories)
    se_fa = math.sqrt(0.01 * 0.99 / (args.histories * ANALYSED))
    print(f"Monte-Carlo SE: {se90:.1%} at a power of 90 %, {se_fa:.2%} at a false-alarm rate of 1 % a run.\n")
    print("## Goals\n")
    print(goals(main_summaries))
    print("\n## Power and false alarms\n")
    print(power_table(main_summaries, METHODS))
    print("\n## Other shapes of history: CV 3 %, normal (ours and apache-otava)\n")
    print(power_table(robust_summaries, ("ours per run", "ours history", "ours combined", "apache-otava")))
    if sensitivity:
        print(f"\n## Settings: ours per run with one setting changed ({args.histories * 2} histories a row)\n")
        print(sensitivity_table(sensitivity))
    print("\n## Smallest change detectable with 90 % power (ours per run, 1 % false alarms a run)\n")
    print(detectable_table())
    print("\n## Public series\n")
    print(public_table())
    print("\n## Convergence: epochs to target, one-sided\n")
    print(convergence_table())
    print("\nrcp_checker cross-check (hpc 3.0.0 cosmoflow):\n" + rcp_cross_check())
    own = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"\nRuntime: {time.perf_counter() - started:.0f} s wall ({simulated:.0f} s for the simulated tables on "
        f"{args.workers} workers); CPU {children.ru_utime + children.ru_stime:.0f} s in the workers, "
        f"{own.ru_utime + own.ru_stime:.0f} s in the main process."
    )
    if args.json:
        args.json.write_text(json.dumps({"main": main_summaries, "robust": robust_summaries, "settings": sensitivity}))


if __name__ == "__main__":
    main()
