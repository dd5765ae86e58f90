"""Systems of one cell (#31): is the cause named right where no common mode exists? bench/detection.py
--small-systems runs it. A benchmark that prints figures, not a timed test.

    .venv/bin/python bench/detection.py --small-systems --histories 1000

A system of one cell, 16 weekly runs of 3 trials: throughput (higher is better) at a trial CV drawn between 1 and
5 %, its own week-level noise of CV / 4, the machine's week-level noise of 2 % (sd, log scale) shared with its
canaries, which are noisy as this machine's are in the weekly-flow test (per trial, lognormal: matmul 2 %, memory
triad 8 %, dataset read 15 %). From run 12 on, one change of +-5-20 %:

- ``step``: the cell alone (its canaries unchanged): a benchmark change;
- ``machine``: the machine, the cell and its canaries with it: a system change.

Each series is scanned as the summary scans it (detection.scan, causal); the alert groups of runs 12 to 15 with the
cell's canaries' runs (a canary not listed yet may corroborate the cell's change, alerts.CORROBORATION_LEVEL) and
without (only canaries' listings). Scored: the first group that matters naming the cell, starting within 1 run of
the change, by run 15 (3 runs after): found, and whether its cause is the change's.
"""

from __future__ import annotations

import math
import multiprocessing

import numpy as np

from mlcampaign.analysis import detection
from mlcampaign.history.alerts import CanaryRuns, SeriesChange, alert_groups, cell_events

SETTINGS = detection.DetectionSettings()
RUNS, CHANGE, TRIALS, WITHIN = 16, 12, 3, 3
SYSTEM_WEEK_SD = 0.02
CANARY_CVS = {"matmul_flops_per_s": 0.02, "memory_triad_bytes_per_s": 0.08, "dataset_read_bytes_per_s": 0.15}
EXPECTED_CAUSE = {"step": "benchmark change", "machine": "system change"}
RUN_IDS = [f"w{run:02d}" for run in range(RUNS)]
KEY = ("small", "bench", "c0")


def _history(rng: np.random.Generator, scenario: str):
    """One history: the cell's trials and each canary's (runs x trials)."""
    size = math.log1p(rng.uniform(0.05, 0.2) * rng.choice([-1, 1]))
    machine = rng.normal(0, SYSTEM_WEEK_SD, RUNS)
    cv = rng.uniform(0.01, 0.05)
    cell = machine + rng.normal(0, cv / 4, RUNS)
    cell[CHANGE:] += size  # the cell moves in both scenarios, its canaries only with the machine
    if scenario == "machine":
        machine[CHANGE:] += size
    trials = 100 * np.exp(cell)[:, None] * np.clip(1 + cv * rng.standard_normal((RUNS, TRIALS)), 0.05, None)
    canaries = {
        name: np.exp(machine)[:, None] * rng.lognormal(0, canary_cv, (RUNS, TRIALS))
        for name, canary_cv in CANARY_CVS.items()
    }
    return trials, canaries


def _first_that_matters(groups_by_run: dict[int, list[dict]]) -> str | None:
    """The cause of the first group that matters naming the cell (or its system), starting with the change."""
    for run in range(CHANGE, CHANGE + WITHIN + 1):
        for group in groups_by_run[run]:
            start = RUN_IDS.index(group["start_run_id"])
            names_cell = group["cells"] or group["systems"] == ["small"]
            if group["matters"] and names_cell and abs(start - CHANGE) <= 1:
                return group["cause"]
    return None


def small_job(job: tuple[str, int, int]) -> dict:
    """``histories`` histories of a scenario (module docstring): found, and causes named right, per variant."""
    scenario, histories, seed = job
    rng = np.random.default_rng(seed)
    found = {"with canaries' runs": [], "listings only": []}
    for _ in range(histories):
        trials, canaries = _history(rng, scenario)
        scanned = detection.scan(detection.run_series(list(trials)), "higher", SETTINGS)
        events = cell_events(scanned.changes, KEY, "throughput")
        machine, runs = [], {}
        for name, values in canaries.items():
            for change in detection.scan(detection.run_series(list(values)), "higher", SETTINGS).changes:
                machine.append(SeriesChange.of(change, "small", name, benchmark="bench", cell="c0"))
            runs[name] = CanaryRuns("higher", np.arange(RUNS), np.log(np.median(values, axis=1)))
        for variant, options in (("with canaries' runs", {"canary_runs": {KEY: runs}}), ("listings only", {})):
            by_run = {
                run: alert_groups(run, RUN_IDS, events, machine, {"small": 1}, SETTINGS, **options)
                for run in range(CHANGE, CHANGE + WITHIN + 1)
            }
            found[variant].append(_first_that_matters(by_run))
    return {"scenario": scenario, "histories": histories, "found": found}


def small_systems(histories: int = 1000, workers: int = 2, seed: int = 331) -> list[dict]:
    """Every scenario's ``histories`` histories, merged."""
    parts = 4  # per scenario, for the workers
    jobs = [
        (scenario, histories // parts, seed + parts * index + part)
        for index, scenario in enumerate(EXPECTED_CAUSE)
        for part in range(parts)
    ]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        parts = pool.map(small_job, jobs, chunksize=1)
    merged: dict[str, dict] = {}
    for part in parts:
        into = merged.setdefault(part["scenario"], {"scenario": part["scenario"], "histories": 0, "found": {}})
        into["histories"] += part["histories"]
        for variant, causes in part["found"].items():
            into["found"].setdefault(variant, []).extend(causes)
    return list(merged.values())


def small_table(results: list[dict]) -> str:
    """Per scenario and variant: the share of histories with a group that matters, and of those, named right."""
    lines = [
        "| change (one-cell system) | histories | variant | a group that matters within 3 runs | cause named right |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        expected = EXPECTED_CAUSE[result["scenario"]]
        for variant, causes in result["found"].items():
            listed = [cause for cause in causes if cause is not None]
            right = sum(cause == expected for cause in listed)
            lines.append(
                f"| {result['scenario']} ({expected}) | {result['histories']} | {variant} | "
                f"{len(listed) / len(causes):.1%} | {right / max(len(listed), 1):.1%} ({right} / {len(listed)}) |"
            )
    return "\n".join(lines)
