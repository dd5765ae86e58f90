"""A site, simulated (#31): systems x cells x weekly runs through the alert groups that ``mlcampaign summary`` lists
(mlcampaign.history.alerts; bench/detection.py --site runs it). A benchmark that prints figures, not a timed test.

    .venv/bin/python bench/detection.py --site                           # 4 systems x 50 cells x 52 runs, 2 years
    .venv/bin/python bench/detection.py --site --site-years 1 --site-cells 25

The site: ``systems`` systems of ``cells`` cells, ``runs`` weekly runs of 3 trials, throughput (higher is better).
Each cell: a level, a trial CV drawn between 1 and 5 % (normal trial noise; a quarter of the cells lognormal), its
own week-level noise of CV / 4, and a canary per trial (the matmul peak the trial measured: the machine's level
during the trial times its own noise of 1 % CV). Per system: week-level noise of 2 % (sd, log scale) shared by its
cells and their canaries. Per system-year, at random runs from 14 on (after a reference):

- one machine-wide shift of +-3-15 % from that run on: every cell and canary of the system;
- one software upgrade: a stack difference on every cell of the system at that run, moving a random 5-20 % of its
  cells by +-5-15 %;
- two single-cell steps of +-5-20 % (no stack difference);
- three single outlying runs (one cell, one run off by 10-20 %, either way);
- two slow drifts (one cell, -0.2 to -0.8 % a run for 12 runs: below 1 % a run, 2.4-9.6 % in all);
- one contended week: every trial of the system contended, the machine 10-30 % slower during them, the canaries
  measured under the same contention (steady: judged relative where a cell is; otherwise left out, unjudged).

Every cell's series is scanned (detection.scan, causal: each run's analysis sees only the runs up to it) raw, and
relative to its canary where relative judging chooses it (mlcampaign.history.relative, on the cell's reference:
its runs before the newest confirmation + 1 of the year); the system's canaries and the common mode of its cells
(series_changes); then each run's alert groups (alert_groups). Two variants: with relative judging (as the summary
judges) and without.

Scoring (run positions): a group is *true* when one of its cells (a canary-only system change: its system) has a
simulated change (machine shift, upgrade, step, drift) starting at most 1 run after the group's start and at most 3
runs before it (a drift: while it lasts, and 3 runs after); an outlying run or a contended week is no change. False
alert groups per site-week: groups that matter with no simulated event behind (an outlying run at the group's start
is one: its listing as it happens is counted apart, "outlying onsets"), over the site's weeks (all systems' runs of one
week) from run 3 on. Recall of changes >= target_change (5 %), per changed cell: a group listed at the change's run
or up to 3 runs later, naming the cell (or a system change of its system for a machine shift), starting within 1 run
of it: "listed"; of a group that matters: "matters"; delay: runs from the change to the first such listing. Cause
named right: the true groups that matter whose cause is the change's (machine -> system change, upgrade ->
software-stack change, step and drift -> benchmark change). False listings per cell-run: every listing of a cell
without a simulated change (outlying runs excepted: each is one listing as it should be) over its analysed runs.
Power under week-level noise: the recall of single-cell steps, with and without relative judging.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import time

import numpy as np

from mlcampaign.analysis import detection
from mlcampaign.history.alerts import (
    COMMON_MODE,
    Contended,
    SeriesChange,
    alert_groups,
    cell_events,
    series_changes,
)
from mlcampaign.history.relative import choose, relative_trials

SETTINGS = detection.DetectionSettings()
TRIALS = 3
SYSTEM_WEEK_SD = 0.02
CANARY_CV = 0.01
EXPECTED_CAUSE = {
    "machine": "system change",
    "upgrade": "software-stack change",
    "step": "benchmark change",
    "drift": "benchmark change",
}
FIRST_EVENT = 14
FIRST_SCORED = 3
WITHIN = 3


@dataclasses.dataclass
class Event:
    kind: str
    cells: set
    start: int
    size: float
    end: int | None = None  # last run of a drift


def _simulate(rng: np.random.Generator, cells: int, runs: int):
    """One system-year: trial values (cells x runs x trials), canaries (same), contended run, events, stack run."""
    last = runs - 4
    events = [Event("machine", set(range(cells)), int(rng.integers(FIRST_EVENT, last)), _signed(rng, 0.03, 0.15))]
    upgrade_run = int(rng.integers(FIRST_EVENT, last))
    moved = rng.choice(cells, max(1, round(cells * rng.uniform(0.05, 0.2))), replace=False)
    events.append(Event("upgrade", set(moved.tolist()), upgrade_run, _signed(rng, 0.05, 0.15)))
    for _ in range(2):
        events.append(
            Event("step", {int(rng.integers(cells))}, int(rng.integers(FIRST_EVENT, last)), _signed(rng, 0.05, 0.2))
        )
    for _ in range(3):
        events.append(
            Event("outlying", {int(rng.integers(cells))}, int(rng.integers(FIRST_EVENT, last)), _signed(rng, 0.1, 0.2))
        )
    for _ in range(2):
        start = int(rng.integers(FIRST_EVENT, last - 12))
        events.append(Event("drift", {int(rng.integers(cells))}, start, -rng.uniform(0.002, 0.008), start + 11))
    contended = int(rng.integers(FIRST_EVENT, last))
    slower = math.log1p(-rng.uniform(0.1, 0.3))

    cv = rng.uniform(0.01, 0.05, cells)
    lognormal = rng.random(cells) < 0.25
    machine = rng.normal(0, SYSTEM_WEEK_SD, runs)
    own_week = rng.normal(0, 1, (cells, runs)) * (cv / 4)[:, None]
    level = np.zeros((cells, runs))  # log scale
    for event in events:
        rows = sorted(event.cells)
        if event.kind == "machine":  # through the machine's level, the canaries' too
            continue
        if event.kind in ("upgrade", "step"):
            level[rows, event.start :] += math.log1p(event.size)
        elif event.kind == "outlying":
            level[rows, event.start] += math.log1p(event.size)
        else:
            for run in range(event.start, runs):
                level[rows, run] += math.log1p(event.size) * min(run - event.start + 1, event.end - event.start + 1)
    machine_level = machine.copy()
    machine_level[events[0].start :] += math.log1p(events[0].size)
    machine_level[contended] += slower
    normal = 1 + cv[:, None, None] * rng.standard_normal((cells, runs, TRIALS))
    sigma = np.sqrt(np.log1p(cv**2))[:, None, None]
    logn = np.exp(sigma * rng.standard_normal((cells, runs, TRIALS)) - sigma**2 / 2)
    noise = np.where(lognormal[:, None, None], logn, np.clip(normal, 0.05, None))
    cell_level = np.exp(level + machine_level[None, :] + own_week)
    values = 1000 * cell_level[:, :, None] * noise
    canaries = 1e11 * np.exp(machine_level)[None, :, None] * np.exp(rng.normal(0, CANARY_CV, (cells, runs, TRIALS)))
    return values, canaries, contended, events, upgrade_run


def _signed(rng, low, high) -> float:
    return float(rng.uniform(low, high) * rng.choice([-1, 1]))


def _scan(trials: list[np.ndarray]) -> detection.ScanResult:
    return detection.scan(detection.run_series(trials, "log"), "higher", SETTINGS)


def _machine_changes(system: str, table: np.ndarray, series: str) -> list[SeriesChange]:
    found = []
    for change in series_changes(table, "higher", SETTINGS):
        found.append(SeriesChange.of(change, system, series, metric="throughput" if series == COMMON_MODE else None))
    return found


def system_year(job: tuple[int, int, int]) -> dict:
    """Simulate and score one system-year (module docstring); ``job``: (seed, cells, runs)."""
    seed, cells, runs = job
    rng = np.random.default_rng(seed)
    values, canaries, contended, events, upgrade_run = _simulate(rng, cells, runs)
    system = f"s{seed}"
    run_ids = [f"w{run:02d}" for run in range(runs)]
    raw_trials, relative_series, chosen = [], [], 0
    for cell in range(cells):
        used = [values[cell, run] if run != contended else np.array([]) for run in range(runs)]
        raw_trials.append(used)
        with_nan = [run if len(run) else np.full(TRIALS, np.nan) for run in used]
        choice = choose(with_nan, {"matmul": (list(canaries[cell]), 1.0)}, SETTINGS)
        if choice.canary is None:
            relative_series.append(None)
            continue
        chosen += 1
        relative_series.append(relative_trials(list(values[cell]), list(canaries[cell]), 1.0))
    stack = (("packages.torch", "2.14.1", "2.15.0"),)
    raw_events, relative_events = [], []
    for cell in range(cells):
        key = (system, "bench", f"c{cell}")
        raw = cell_events(_scan(raw_trials[cell]).changes, key, "throughput", {upgrade_run: stack})
        raw_events.append(raw)
        if relative_series[cell] is None:
            relative_events.append(raw)
        else:
            relative_events.append(
                cell_events(_scan(relative_series[cell]).changes, key, "throughput", {upgrade_run: stack})
            )
    canary_table = np.log(np.median(canaries, axis=2)).T
    raw_table = np.log(np.array([[np.median(run) if len(run) else np.nan for run in cell] for cell in raw_trials])).T
    machine = _machine_changes(system, canary_table, "matmul") + _machine_changes(system, raw_table, COMMON_MODE)
    result = {"chosen": chosen, "cells": cells}
    for variant, per_cell in (("relative", relative_events), ("raw", raw_events)):
        events_all = [event for listed in per_cell for event in listed]
        by_run: dict[int, list[dict]] = {}
        for run in range(FIRST_SCORED, runs):
            judged = "relative" if variant == "relative" else "left out"
            contention = (
                [
                    Contended(
                        system, "bench", f"c{cell}", TRIALS, judged if relative_series[cell] is not None else "left out"
                    )
                    for cell in range(cells)
                ]
                if run == contended
                else []
            )
            by_run[run] = alert_groups(
                run, run_ids, events_all, machine, {system: cells}, SETTINGS, contended=contention
            )
        result[variant] = _score(by_run, per_cell, events, run_ids, runs, contended, relative_series, variant)
    return result


def _true_event(group: dict, events: list[Event], run_ids: list[str]) -> Event | None:
    """The simulated event behind a group (module docstring), the nearest start first (a cell's own before the
    machine's); an outlying run only at the group's start; None if there is none."""
    start = run_ids.index(group["start_run_id"])
    cells = {int(cell["cell"][1:]) for cell in group["cells"]}
    behind = []
    for event in events:
        touches = bool(event.cells & cells) if cells else event.kind == "machine"
        last = (event.end if event.end is not None else event.start) + (0 if event.kind == "outlying" else WITHIN)
        if touches and event.start - 1 <= start <= last:
            behind.append(event)
    return min(behind, key=lambda e: (abs(e.start - start), e.kind == "machine"), default=None)


def _score(by_run, per_cell, events, run_ids, runs, contended, relative_series, variant) -> dict:
    false_groups = listed_groups = true_matters = cause_right = outlying_onsets = 0
    misnamed: dict[str, int] = {}
    for groups in by_run.values():
        for group in groups:
            if group["cause"] == "contention":
                continue
            listed_groups += 1
            truth = _true_event(group, events, run_ids)
            if group["matters"] and truth is None:
                false_groups += 1
            elif group["matters"] and truth.kind == "outlying":
                outlying_onsets += 1  # an outlying run as it happens: listed, then found outlying by the next run
            elif group["matters"]:
                true_matters += 1
                right = group["cause"] == EXPECTED_CAUSE[truth.kind]
                cause_right += right
                if not right:
                    misnamed[f"{truth.kind} as {group['cause']}"] = (
                        misnamed.get(f"{truth.kind} as {group['cause']}", 0) + 1
                    )
    recall = {"machine": [], "upgrade": [], "step": []}
    for event in events:
        if event.kind not in recall or abs(event.size) < SETTINGS.target_change:
            continue
        for cell in event.cells:
            recall[event.kind].append(_found(cell, event, by_run, run_ids, runs))
    quiet_listings = 0
    for cell, listed in enumerate(per_cell):
        roots = {
            (e.start, e.direction_verdict) for e in listed if e.listed_at >= FIRST_SCORED and e.kind != "outlying run"
        }
        quiet_listings += sum(1 for start, _ in roots if not _explained(cell, start, events))
    return {
        "weeks": runs - FIRST_SCORED,
        "false_groups": false_groups,
        "listed_groups": listed_groups,
        "true_matters": true_matters,
        "cause_right": cause_right,
        "outlying_onsets": outlying_onsets,
        "misnamed": misnamed,
        "recall": recall,
        "quiet_listings": quiet_listings,
        "quiet_runs": len(per_cell) * (runs - FIRST_SCORED),
        "unjudged": sum(1 for series in relative_series if series is None or variant == "raw"),
    }


def _explained(cell: int, start: int, events: list[Event]) -> bool:
    """Whether a listing of ``cell`` starting at ``start`` has a simulated event of the cell behind it (an outlying
    run too: its one listing is right)."""
    for event in events:
        last = (event.end if event.end is not None else event.start) + WITHIN
        if cell in event.cells and event.start - 1 <= start <= last:
            return True
    return False


def _found(cell: int, event: Event, by_run, run_ids, runs) -> tuple[int | None, int | None]:
    """(delay of the first listing, of the first listing that matters) of ``event`` at ``cell``; None: not within 3."""
    listed = matters = None
    for run in range(event.start, min(event.start + WITHIN + 1, runs)):
        for group in by_run.get(run, []):
            start = run_ids.index(group["start_run_id"])
            if abs(start - event.start) > 1:
                continue
            names = any(int(c["cell"][1:]) == cell for c in group["cells"] if "cell" in c)
            machine = event.kind == "machine" and group["cause"] == "system change"
            if names or machine:
                listed = run - event.start if listed is None else listed
                if group["matters"] and matters is None:
                    matters = run - event.start
    return listed, matters


def _share(pairs: list, index: int, within: int = WITHIN) -> float:
    return sum(1 for pair in pairs if pair[index] is not None and pair[index] <= within) / max(len(pairs), 1)


def site(systems: int = 4, cells: int = 50, runs: int = 52, years: int = 2, workers: int = 2, seed: int = 31) -> dict:
    """The site simulation's figures (module docstring), seeds fixed."""
    jobs = [(seed * 1000 + number, cells, runs) for number in range(systems * years)]
    began = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        results = pool.map(system_year, jobs)
    figures = {"systems": systems, "cells": cells, "runs": runs, "years": years, "seconds": time.perf_counter() - began}
    site_weeks = years * (runs - FIRST_SCORED)
    figures["chosen_relative"] = sum(r["chosen"] for r in results) / sum(r["cells"] for r in results)
    for variant in ("relative", "raw"):
        scored = [r[variant] for r in results]
        recall = {kind: [pair for s in scored for pair in s["recall"][kind]] for kind in ("machine", "upgrade", "step")}
        every = [pair for pairs in recall.values() for pair in pairs]
        true_matters = sum(s["true_matters"] for s in scored)
        figures[variant] = {
            "false_groups_per_site_week": sum(s["false_groups"] for s in scored) / site_weeks,
            "outlying_onsets_per_site_week": sum(s["outlying_onsets"] for s in scored) / site_weeks,
            "misnamed": {
                name: sum(s["misnamed"].get(name, 0) for s in scored)
                for name in {n for s in scored for n in s["misnamed"]}
            },
            "groups_per_site_week": sum(s["listed_groups"] for s in scored) / site_weeks,
            "recall_listed": _share(every, 0),
            "recall_matters": _share(every, 1),
            "recall_first_run": _share(every, 0, 0),
            "recall_by_kind": {
                kind: (_share(pairs, 0), _share(pairs, 1), len(pairs)) for kind, pairs in recall.items()
            },
            "median_delay": float(np.median([p[0] for p in every if p[0] is not None])) if every else math.nan,
            "cause_right": sum(s["cause_right"] for s in scored) / max(true_matters, 1),
            "true_groups_that_matter": true_matters,
            "quiet_listings_per_cell_run": sum(s["quiet_listings"] for s in scored)
            / max(sum(s["quiet_runs"] for s in scored), 1),
        }
    return figures


def _power_history(job: tuple[int, float, float]) -> dict:
    """One #24-style history (20 runs, 3 trials, CV 3 %, a step of ``step`` at run 10) with week-level noise of
    ``week`` (sd, log) shared by the trials and their canary (1 % CV of its own): listed within 3 runs (a step)
    or listings per analysed run (none), raw and relative (chosen on runs 0-9, as the summary of run 13 does)."""
    seed, step, week = job
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, week, 20)
    values = [
        1000 * np.exp(shared[run]) * (1 - step * (run >= 10)) * (1 + 0.03 * rng.standard_normal(3)) for run in range(20)
    ]
    canary = [1e11 * np.exp(shared[run] + rng.normal(0, CANARY_CV, 3)) for run in range(20)]
    choice = choose(values[:14], {"matmul": (canary[:14], 1.0)}, SETTINGS)
    series = {"raw": values}
    series["relative"] = relative_trials(values, canary, 1.0) if choice.canary else values
    found = {"chosen": choice.canary is not None}
    for name, trials in series.items():
        changes = _scan(trials).changes
        if step:
            found[name] = any(abs(c.start - 10) <= 1 and 10 <= c.listed_at <= 13 for c in changes)
        else:
            found[name] = (
                len({(c.start, c.direction_verdict) for c in changes if c.listed_at >= 3 and c.kind != "outlying run"})
                / 17
            )
    return found


def week_level_power(histories: int = 200, workers: int = 2, week: float = 0.015) -> dict:
    """Power of a 5 % step at CV 3 % within 3 runs under week-level noise the canaries see, and listings per
    cell-run without a step, raw and with relative judging (seeds fixed)."""
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        stepped = pool.map(_power_history, [(seed, 0.05, week) for seed in range(histories)])
        null = pool.map(_power_history, [(10_000 + seed, 0.0, week) for seed in range(histories)])
    return {
        "histories": histories,
        "week_sd": week,
        "chosen": float(np.mean([h["chosen"] for h in stepped + null])),
        "power_raw": float(np.mean([h["raw"] for h in stepped])),
        "power_relative": float(np.mean([h["relative"] for h in stepped])),
        "null_raw": float(np.mean([h["raw"] for h in null])),
        "null_relative": float(np.mean([h["relative"] for h in null])),
    }


def site_table(figures: dict) -> str:
    """The figures as a markdown table."""
    lines = [
        f"Site simulation: {figures['systems']} systems x {figures['cells']} cells x {figures['runs']} runs, "
        f"{figures['years']} simulated year(s), 3 trials a run; {figures['chosen_relative']:.0%} of cells judged "
        f"relative to their canary; {figures['seconds']:.0f} s",
        "",
        "| | with relative judging | raw only |",
        "|---|---|---|",
    ]
    rows = [
        ("false alert groups per site-week (matter, no change behind)", "false_groups_per_site_week", "{:.3f}"),
        (
            "groups that matter at an outlying run as it happens, per site-week",
            "outlying_onsets_per_site_week",
            "{:.3f}",
        ),
        ("all listed groups per site-week (contention left out)", "groups_per_site_week", "{:.2f}"),
        ("changes >= 5 %: listed within 3 runs", "recall_listed", "{:.0%}"),
        ("changes >= 5 %: a group that matters within 3 runs", "recall_matters", "{:.0%}"),
        ("changes >= 5 %: listed at the first changed run", "recall_first_run", "{:.0%}"),
        ("median delay (runs)", "median_delay", "{:.1f}"),
        ("cause named right (true groups that matter)", "cause_right", "{:.0%}"),
        ("cell listings with no simulated event behind, per cell-run", "quiet_listings_per_cell_run", "{:.2%}"),
    ]
    for label, key, text in rows:
        lines.append(f"| {label} | {text.format(figures['relative'][key])} | {text.format(figures['raw'][key])} |")
    for kind in ("machine", "upgrade", "step"):
        cells = []
        for variant in ("relative", "raw"):
            listed, matters, count = figures[variant]["recall_by_kind"][kind]
            cells.append(f"{listed:.0%} / {matters:.0%} of {count}")
        lines.append(f"| {kind} changes >= 5 %: listed / matters within 3 runs | {cells[0]} | {cells[1]} |")
    for variant in ("relative", "raw"):
        lines.append(f"\nmisnamed ({variant}): {figures[variant]['misnamed']}")
    power = figures.get("week_level")
    if power:
        lines.append(
            f"\nWeek-level noise of {power['week_sd']:.1%} (sd) seen by the canaries, CV 3 %, 3 trials, a 5 % step "
            f"({power['histories']} histories each): listed within 3 runs raw {power['power_raw']:.0%}, with "
            f"relative judging {power['power_relative']:.0%} (chosen in {power['chosen']:.0%}); listings per cell-run "
            f"without a step raw {power['null_raw']:.2%}, relative {power['null_relative']:.2%}"
        )
    return "\n".join(lines)
