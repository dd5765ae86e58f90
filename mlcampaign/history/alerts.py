"""Alert groups: what a run's listed changes come to, one group per cause (docs/regression.md, "Alert groups").

A pure function (``alert_groups``) over what the detectors listed: the cells' changes (``CellEvent``: per run,
whole history, big drop, convergence), the changes listed on the machine's own series (``SeriesChange``: each
cell's canaries, and per system with 3 cells or more the canaries and the cells' metric combined over the
system's cells, its *common mode*), the cells whose trials were contended and the cells that could not be
judged. ``mlcampaign summary``, the workflow's summary.json, the dashboard and the site simulation
(bench/detection.py --site) all call it. The causes:

- ``system change``: the machine moved, and with it the cells. A system with 3 cells or more: the common-mode
  series of a metric lists a change (an alarm or a minor shift), one of the system's combined canary series
  lists one in the same direction (better / worse) starting at the same run or one run apart, and the cells'
  own listings of that metric in that direction starting there are its cells. Where the common mode has not
  listed it yet (its per-run test may wait a run for confirmation where the cells' and canaries' did not), a
  combined canary's listing of at least ``min_change`` stands for it, for the cells without a stack difference.
  A system with fewer cells (no common mode to speak of): a cell's listing and one of its own canaries' listings
  in the same direction one run apart at most, both at least ``min_change``; where no canary listed one (yet: a
  noisy canary's per-run test may wait for confirmation), a canary that moved from the cell's start by
  ``min_change`` or more, one-sided at CORROBORATION_LEVEL, stands for it. One group per machine and start,
  however many cells and systems it moved (systems whose trials ran on the same hosts in that run are one
  machine). A canary that moved by ``min_change`` or more while no cell did is a system change too (its cells may
  be judged relative to the machine), unless a system change of its system is listed in the same run and starts
  with it (or, in its direction, up to ``confirmation`` runs after it): then it is part of that one; it matters
  where the common mode's alarm says the cells' raw values moved, and where that alarm comes a run after the
  canary's listing, the system change is listed again then.
- ``software-stack change``: cells that share the same non-empty stack difference at or next to their change's
  start (one group per distinct difference). It matters also where 2 or more of its cells' changes of one metric
  and direction, pooled, clear ``min_change``.
- ``benchmark change``: a cell that moved alone, with no stack difference.
- ``convergence change``: epochs to target, judged one-sided.
- ``outlying run``: per system and run, the cells with an outlying run there.
- ``contention``: per system and run, the cells with contended trials: how many, judged relative to their
  canaries, kept, or left out.

A group matters when one of its cells' listings is an alarm that matters (a system change also where the common
mode's alarm, the cells' raw values beyond min_change, is listed in the run); minor shifts, outlying runs and
contention never matter. Scanning the machine's series (``series_changes``) is here too: the same per-run test as a
cell's, over each run's cells as its trials.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import scipy.stats

from mlcampaign.analysis import detection
from mlcampaign.history.stack_changes import stack_near

CAUSES = (
    "system change",
    "software-stack change",
    "benchmark change",
    "convergence change",
    "outlying run",
    "contention",
)
# Series of a system's cells combined: fewer cells are no common mode (the single-cell rule applies).
COMMON_MODE_CELLS = 3
COMMON_MODE = "common mode"
# A change of the machine and a cell's "start together" when their starts are at most this many runs apart.
SAME_START = 1
# A system of few cells: the level at which a cell's canary, not listed (yet), corroborates its listed change (one
# sided, from the change's start, Bonferroni over the cell's canaries): the start and direction are the cell's,
# not searched for, so a plain test at a looser level than the per-run test's holds. Chosen on one-cell systems
# with noisy canaries (bench/detection.py --small-systems): steps of the cell alone named a system change, against
# machine shifts named a benchmark change.
CORROBORATION_LEVEL = 0.025


@dataclasses.dataclass(frozen=True)
class CellEvent:
    """A change a cell's detector listed (CellChange, with its cell, metric and stack difference); ``start``
    and ``listed_at`` are run positions (the site's runs in order)."""

    system: str
    benchmark: str
    cell: str
    metric: str
    kind: str  # "alarm" | "minor shift" | "outlying run" | "convergence"
    direction_verdict: str  # "regression" | "improvement"
    start: int
    listed_at: int
    relative_change: float
    ci_low: float
    ci_high: float
    matters: bool
    stack_changes: tuple = ()  # ((key, before, after), ...)
    source: str = "per run"

    @property
    def key(self) -> tuple:
        return self.system, self.benchmark, self.cell


@dataclasses.dataclass(frozen=True)
class SeriesChange:
    """A change listed on a series of the machine: a cell's canary (``benchmark`` and ``cell`` set), a
    system's canary combined over its cells, or its common mode of ``metric`` (``series``: COMMON_MODE)."""

    system: str
    series: str  # a canary's name, or COMMON_MODE
    kind: str
    direction_verdict: str
    start: int
    listed_at: int
    relative_change: float
    ci_low: float
    ci_high: float
    benchmark: str | None = None
    cell: str | None = None
    metric: str | None = None

    @classmethod
    def of(
        cls, change: detection.CellChange, system: str, series: str, orders: Sequence[int] | None = None, **where
    ) -> SeriesChange:
        """The SeriesChange of a change that the per-run test listed on the series; ``orders``: the run order of
        each of the series' positions (default: the positions are the runs' orders)."""
        order = (lambda position: int(orders[position])) if orders is not None else int
        return cls(
            system,
            series,
            change.kind,
            change.direction_verdict,
            order(change.start),
            order(change.listed_at),
            change.relative_change,
            change.ci_low,
            change.ci_high,
            **where,
        )


@dataclasses.dataclass(frozen=True)
class CanaryRuns:
    """A cell's canary over the runs it was measured in: their positions (ascending) and the log of its trials'
    median in each."""

    better: str  # "higher" | "lower"
    positions: np.ndarray
    centres: np.ndarray


@dataclasses.dataclass(frozen=True)
class Contended:
    """A cell's contended trials in a run, and how they were judged: "relative" (against canaries measured
    under the same contention), "kept" (regression.keep_contended) or "left out"."""

    system: str
    benchmark: str
    cell: str
    trials: int
    judged: str


def series_changes(table: np.ndarray, better: str, settings: detection.DetectionSettings) -> list[detection.CellChange]:
    """The per-run test's listings on a system's combined series: ``table`` is runs x cells of log values
    (NaN where a cell has none), each cell taken relative to its own median (cells run in different layouts:
    each normalised by its own history), the runs' cells as the run's trials (their Huber centre the run
    value, the cell-to-cell spread the within-run part)."""
    table = np.asarray(table, dtype=float)
    table = table[:, np.isfinite(table).any(axis=0)]  # cells without a value in these runs say nothing
    if not table.size:
        return []
    deviations = table - np.nanmedian(table, axis=0, keepdims=True)
    return detection.scan(detection.RunSeries(deviations, "log"), better, settings).changes


def cell_events(
    changes: Iterable[detection.CellChange],
    key: tuple[str, str, str],
    metric: str,
    stacks: Mapping[int, tuple] | None = None,
) -> list[CellEvent]:
    """A cell's listings (``changes`` of detection.scan, its positions the site's run positions) as CellEvents;
    ``key``: (system, benchmark, cell); ``stacks``: run position -> the stack difference from the run before it
    (none elsewhere), a change's the one at its start or next to it (stack_changes.stack_near, as verdicts
    finds it)."""
    stacks = stacks or {}
    return [
        CellEvent(
            *key,
            metric,
            change.kind,
            change.direction_verdict,
            change.start,
            change.listed_at,
            change.relative_change,
            change.ci_low,
            change.ci_high,
            change.matters,
            tuple(stack_near(change.start, change.listed_at, lambda position: stacks.get(position, ()))[1]),
            change.source,
        )
        for change in changes
    ]


def _together(a_start: int, b_start: int) -> bool:
    return abs(a_start - b_start) <= SAME_START


def _beyond(change, smallest: float) -> bool:
    return abs(change.relative_change) >= smallest


def _machine_near(
    machine: Iterable[SeriesChange], system: str, direction_verdict: str, start: int
) -> list[SeriesChange]:
    """The machine's listings of ``system`` in that direction starting together with ``start`` (outlying runs aside)."""
    return [
        m
        for m in machine
        if m.system == system
        and m.direction_verdict == direction_verdict
        and m.kind != "outlying run"
        and _together(m.start, start)
    ]


def _cell_entry(event: CellEvent, run_ids: Sequence[str]) -> dict:
    return {
        "system": event.system,
        "benchmark": event.benchmark,
        "cell": event.cell,
        "metric": event.metric,
        "kind": event.kind,
        "verdict": event.direction_verdict,
        "matters": event.matters,
        "relative_change": event.relative_change,
        "ci_low": event.ci_low,
        "ci_high": event.ci_high,
        "start_run_id": run_ids[event.start],
        "source": event.source,
    }


def _size(events: Sequence[CellEvent]) -> tuple[float, float, float]:
    """A group's size and interval from its cells': the median change, and the median of the bounds."""
    return tuple(
        float(np.median([getattr(e, name) for e in events])) for name in ("relative_change", "ci_low", "ci_high")
    )


def _percent(value: float) -> str:
    return f"{value:+.1%}" if not math.isnan(value) else "n/a"


def _group(cause: str, events: Sequence[CellEvent], run: int, run_ids: Sequence[str], **fields) -> dict:
    size, low, high = fields.pop("size", None) or _size(events)
    start = fields.pop("start", None)
    start = min(e.start for e in events) if start is None else start
    return {
        "cause": cause,
        "matters": fields.pop("matters", any(e.matters for e in events)),
        "systems": fields.pop("systems", sorted({e.system for e in events})),
        "cells": [_cell_entry(e, run_ids) for e in events],
        "relative_change": size,
        "ci_low": low,
        "ci_high": high,
        "start_run_id": run_ids[start],
        "listed_at_run_id": run_ids[run],
        "stack_changes": fields.pop("stack_changes", []),
        "detail": fields.pop("detail"),
        **fields,
    }


def alert_groups(
    run: int,
    run_ids: Sequence[str],
    events: Iterable[CellEvent],
    machine: Iterable[SeriesChange],
    cells_per_system: Mapping[str, int],
    settings: detection.DetectionSettings,
    *,
    contended: Iterable[Contended] = (),
    hosts: Mapping[tuple[str, int], frozenset] | None = None,
    canary_runs: Mapping[tuple[str, str, str], Mapping[str, CanaryRuns]] | None = None,
) -> list[dict]:
    """The alert groups of the run at position ``run`` (module docstring): ``events`` and ``machine`` may hold
    every run's listings (those listed at ``run`` make its groups, earlier ones of the machine still tell the
    cells' changes at this run what moved them); ``cells_per_system``: the judged cells of each system;
    ``hosts``: (system, run position) -> the hosts its trials ran on (systems on shared hosts are one
    machine); ``canary_runs``: (system, benchmark, cell) -> its canaries' runs, for the cells of systems of fewer
    than COMMON_MODE_CELLS cells (a canary not listed yet may corroborate a cell's change). Groups in CAUSES
    order, those that matter first within a cause."""
    events = [e for e in events if e.listed_at == run]
    machine = [m for m in machine if m.listed_at <= run]
    smallest = settings.change_that_matters
    moved = [e for e in events if e.kind in ("alarm", "minor shift")]
    system_changes, by_machine = _system_changes(run, moved, machine, cells_per_system, settings, canary_runs or {})
    groups = _merge_machines(system_changes, by_machine, run, run_ids, hosts or {})
    alone = _canaries_alone(run, events, machine, cells_per_system, settings, by_machine)
    groups += _join_machines(groups, alone, machine, run, run_ids, hosts or {}, cells_per_system)
    claimed = {id(e) for changes in system_changes.values() for e in changes}
    alone = [e for e in moved if id(e) not in claimed]
    groups += _stack_and_benchmark(alone, run, run_ids, smallest)
    for event in (e for e in events if e.kind == "convergence"):
        text = f"{event.system} {event.benchmark} {event.cell}: epochs to target {_percent(event.relative_change)}"
        groups.append(_group("convergence change", [event], run, run_ids, detail=f"convergence change: {text}"))
    outlying: dict[str, list[CellEvent]] = {}
    for event in (e for e in events if e.kind == "outlying run"):
        outlying.setdefault(event.system, []).append(event)
    for system, cells in sorted(outlying.items()):
        start = min(e.start for e in cells)
        detail = f"{system}: {len(cells)} cell(s) had one outlying run in {run_ids[start]} (set aside, no change)"
        groups.append(_group("outlying run", cells, run, run_ids, matters=False, start=start, detail=detail))
    groups += _contention(contended, run, run_ids)
    return sorted(groups, key=lambda g: (CAUSES.index(g["cause"]), not g["matters"], g["start_run_id"]))


def _system_changes(
    run: int,
    moved: Sequence[CellEvent],
    machine: Sequence[SeriesChange],
    cells_per_system: Mapping[str, int],
    settings: detection.DetectionSettings,
    canary_runs: Mapping[tuple[str, str, str], Mapping[str, CanaryRuns]],
) -> tuple[dict[tuple, list[CellEvent]], dict[tuple, dict]]:
    """The cells' listings a machine change explains, per (system, start, direction), and per key the machine
    change's common mode (where there is one), its canaries, and whether the common mode's alarm is listed at
    ``run``."""
    smallest = settings.change_that_matters
    groups: dict[tuple, list[CellEvent]] = {}
    sizes: dict[tuple, dict] = {}
    for event in moved:
        same = _machine_near(machine, event.system, event.direction_verdict, event.start)
        if cells_per_system.get(event.system, 0) >= COMMON_MODE_CELLS:
            common = [m for m in same if m.series == COMMON_MODE and m.metric == event.metric]
            canaries = [m for m in same if m.series != COMMON_MODE and m.cell is None]
            if not common:
                # The common mode may list a run after the cells and canaries (its per-run test waiting for
                # confirmation where theirs did not): meanwhile a canary beyond min_change stands in, for a cell
                # without a stack difference (cells that moved with one are its group).
                canaries = [m for m in canaries if _beyond(m, smallest)] if not event.stack_changes else []
        else:
            common = []
            canaries = [
                m
                for m in same
                if (m.benchmark, m.cell) == (event.benchmark, event.cell)
                and m.series != COMMON_MODE
                and _beyond(m, smallest)
            ]
            if not _beyond(event, smallest):
                canaries = []
            elif not canaries:
                # A canary's per-run test may list a run after the cell's (a noisy canary waits for confirmation).
                canaries = _corroborating(event, run, canary_runs.get(event.key, {}), settings)
        if not canaries:
            continue
        # The machine change that starts with the cell's (a noisy canary may have moved a run before it): the
        # group's start, which systems on the same hosts share.
        anchor = common[0] if common else min(canaries, key=lambda m: (abs(m.start - event.start), m.start))
        key = (event.system, anchor.start, event.direction_verdict)
        groups.setdefault(key, []).append(event)
        sizes.setdefault(key, {"common": None, "canaries": set(), "common_alarm_now": False})
        sizes[key]["common"] = sizes[key]["common"] or (common[0] if common else None)
        sizes[key]["canaries"] |= {m.series for m in canaries}
        sizes[key]["common_alarm_now"] |= any(m.kind == "alarm" and m.listed_at == run for m in common)
    return groups, sizes


def _corroborating(
    event: CellEvent, run: int, canaries: Mapping[str, CanaryRuns], settings: detection.DetectionSettings
) -> list[SeriesChange]:
    """The cell's canaries that moved with its change though none listed it: the runs from the change's start to
    ``run`` against up to ``window`` runs before it (their run centres; pooled t test, one-sided in the change's
    direction at CORROBORATION_LEVEL over the canaries), by ``change_that_matters`` or more."""
    found = []
    for name, series in sorted(canaries.items()):
        before = series.centres[series.positions < event.start][-settings.window :]
        since = series.centres[(series.positions >= event.start) & (series.positions <= run)]
        if len(before) < settings.min_reference_runs or not len(since):
            continue
        lower = (series.better == "higher") == (event.direction_verdict == "regression")
        test = scipy.stats.ttest_ind(since, before, alternative="less" if lower else "greater")
        change = math.expm1(float(np.mean(since) - np.mean(before)))
        if test.pvalue < CORROBORATION_LEVEL / len(canaries) and abs(change) >= settings.change_that_matters:
            found.append(
                SeriesChange(
                    event.system,
                    name,
                    "corroboration",
                    event.direction_verdict,
                    event.start,
                    run,
                    change,
                    math.nan,
                    math.nan,
                    event.benchmark,
                    event.cell,
                )
            )
    return found


def _merge_machines(
    changes: Mapping[tuple, list[CellEvent]], sizes: Mapping[tuple, dict], run: int, run_ids, hosts: Mapping
) -> list[dict]:
    """One system-change group per machine, start and direction: systems whose trials shared hosts in the
    start run are one machine."""
    merged: list[list[tuple]] = []
    for key in sorted(changes):
        system, start, direction = key
        mine = hosts.get((system, start), frozenset())
        for keys in merged:
            other_system, other_start, other_direction = keys[0]
            if (other_start, other_direction) == (start, direction) and mine & hosts.get((other_system, start), set()):
                keys.append(key)
                break
        else:
            merged.append([key])
    groups = []
    for keys in merged:
        events = [e for key in keys for e in changes[key]]
        systems = [key[0] for key in keys]
        common = [sizes[key]["common"] for key in keys if sizes[key]["common"] is not None]
        canaries = sorted({name for key in keys for name in sizes[key]["canaries"]})
        # It matters where a cell's alarm does, or where the common mode's alarm (the cells' raw values beyond
        # min_change) is listed in this run.
        matters = any(e.matters for e in events) or any(sizes[key]["common_alarm_now"] for key in keys)
        size = (common[0].relative_change, common[0].ci_low, common[0].ci_high) if common else _size(events)
        cells = ", ".join(f"{e.system} {e.benchmark} {e.cell} {_percent(e.relative_change)}" for e in events)
        detail = (
            f"system change of {' and '.join(systems)} from {run_ids[keys[0][1]]}: the machine's "
            f"{', '.join(canaries)} and {len(events)} cell(s) moved together ({cells})"
        )
        groups.append(
            _group(
                "system change",
                events,
                run,
                run_ids,
                matters=matters,
                systems=systems,
                size=size,
                start=keys[0][1],
                detail=detail,
                canaries=canaries,
                common_mode=bool(common),
            )
        )
    return groups


def _canaries_alone(
    run: int,
    events: Sequence[CellEvent],
    machine: Sequence[SeriesChange],
    cells_per_system: Mapping[str, int],
    settings: detection.DetectionSettings,
    explained: Mapping[tuple, dict],
) -> list[list[SeriesChange]]:
    """The canaries listed at ``run`` that moved by min_change or more while no cell of their system did (where the
    common mode's alarm comes a run after a canary's listing, that canary again as it comes to matter), and that are
    no part of a system change of their system listed at ``run`` (``_part_of``): per system and direction, those
    whose starts are together one machine change (a noisy canary's change point may land a run before the
    others')."""
    smallest = settings.change_that_matters
    clusters: list[list[SeriesChange]] = []
    for listed in machine:
        if listed.listed_at != run or listed.kind == "outlying run":
            continue
        combined = cells_per_system.get(listed.system, 0) >= COMMON_MODE_CELLS
        change = listed
        if listed.series == COMMON_MODE:
            near = _machine_near(machine, listed.system, listed.direction_verdict, listed.start)
            change = next(
                (m for m in near if m.series != COMMON_MODE and m.cell is None and _beyond(m, smallest)), None
            )
            if listed.kind != "alarm" or change is None:
                continue
        elif combined != (change.cell is None) or not _beyond(change, smallest):
            continue
        if any(
            e.system == change.system
            and e.direction_verdict == change.direction_verdict
            and _together(e.start, change.start)
            for e in events
            if e.kind in ("alarm", "minor shift")
        ) or any(_part_of(change, key, settings.confirmation) for key in explained):
            continue
        cluster = next(
            (
                cluster
                for cluster in clusters
                if (cluster[0].system, cluster[0].direction_verdict) == (change.system, change.direction_verdict)
                and any(_together(m.start, change.start) for m in cluster)
            ),
            None,
        )
        if cluster is None:
            clusters.append([change])
        elif change not in cluster:
            cluster.append(change)
    return clusters


def _part_of(change: SeriesChange, key: tuple, confirmation: int) -> bool:
    """Whether a machine listing of this run is part of the system change ``key`` (system, start, direction) listed
    in it: starting together with it, or in its direction up to ``confirmation`` runs before it. The per-run test's
    candidate starts reach that far back, and a noisy canary's change point, found with the runs of this change,
    may land there (the weekly-flow test's busy run: local-a's triad, a little low in the two runs before it, listed
    from two runs before the machine was made slower)."""
    system, start, direction = key
    if system != change.system:
        return False
    return _together(start, change.start) or (
        direction == change.direction_verdict and 0 <= start - change.start <= confirmation
    )


def _start_of(changes: Sequence[SeriesChange]) -> int:
    """A machine change's start from its canaries': the one most of them share, the latest where they tie (a
    noisy canary's change point lands early rather than late)."""
    starts = [m.start for m in changes]
    return max(set(starts), key=lambda start: (starts.count(start), start))


def _join_machines(
    moved: list[dict],
    alone: Sequence[list[SeriesChange]],
    machine: Sequence[SeriesChange],
    run: int,
    run_ids: Sequence[str],
    hosts: Mapping,
    cells_per_system: Mapping[str, int],
) -> list[dict]:
    """The canary-only machine changes (per system, ``_canaries_alone``), joined to the system change of the same
    machine (starts together, same direction, shared hosts) where there is one: one that moved cells, or another
    canary-only one (a system whose cells are judged relative to the machine moved none); the others, one system
    change each."""
    kept: list[list[list[SeriesChange]]] = []  # per machine change: its systems' canaries
    for changes in alone:
        system, start, direction = changes[0].system, _start_of(changes), changes[0].direction_verdict
        mine = hosts.get((system, start), frozenset())
        same = [
            group
            for group in moved
            if _together(run_ids.index(group["start_run_id"]), start)
            and (group["relative_change"] < 0) == (changes[0].relative_change < 0)
            and any(mine & hosts.get((name, start), frozenset()) for name in group["systems"])
        ]
        if same:
            same[0]["systems"].append(system)
            same[0]["canaries"] = sorted({*same[0]["canaries"], *(m.series for m in changes)})
            same[0]["detail"] += f"; {system}: {_alone_detail(changes, machine, run_ids, cells_per_system)[0]}"
            continue
        other = next(
            (
                systems
                for systems in kept
                if systems[0][0].direction_verdict == direction
                and _together(_start_of([m for each in systems for m in each]), start)
                and any(mine & hosts.get((each[0].system, _start_of(each)), frozenset()) for each in systems)
            ),
            None,
        )
        if other is None:
            kept.append([changes])
        else:
            other.append(changes)
    return [_alone_group(systems, machine, run, run_ids, cells_per_system) for systems in kept]


def _alone_detail(
    changes: Sequence[SeriesChange], machine: Sequence[SeriesChange], run_ids: Sequence[str], cells_per_system
) -> tuple[str, SeriesChange | None]:
    """What a system's canary-only change says, and its cells' common-mode alarm where they are judged relative to
    the machine (their raw values moved with it: the change matters)."""
    system, start = changes[0].system, _start_of(changes)
    names = ", ".join(sorted({m.series for m in changes}))
    sizes = ", ".join(_percent(m.relative_change) for m in changes)
    common = None
    if cells_per_system.get(system, 0) >= COMMON_MODE_CELLS:
        common = next(
            (
                m
                for change in changes
                for m in _machine_near(machine, system, change.direction_verdict, change.start)
                if m.series == COMMON_MODE and m.kind == "alarm"
            ),
            None,
        )
    if common is None:
        return f"the machine's {names} moved, no cell moved ({system} {sizes})", None
    detail = (
        f"system change of {system} from {run_ids[start]}: the machine's {names} and the common mode of its cells "
        f"moved together ({_percent(common.relative_change)}; its cells are judged relative to the machine, so none "
        "moved relative to it)"
    )
    return detail, common


def _alone_group(
    systems: Sequence[Sequence[SeriesChange]],
    machine: Sequence[SeriesChange],
    run: int,
    run_ids: Sequence[str],
    cells_per_system: Mapping[str, int],
) -> dict:
    """One system change of the canary-only changes of systems on one machine: its size the first system's
    common mode where its cells are judged relative to the machine, else the median of its canaries'."""
    said = [_alone_detail(changes, machine, run_ids, cells_per_system) for changes in systems]
    first, common = systems[0], said[0][1]
    if common is not None:
        size = (common.relative_change, common.ci_low, common.ci_high)
    else:
        size = tuple(
            float(np.median([getattr(m, name) for m in first])) for name in ("relative_change", "ci_low", "ci_high")
        )
    detail = "; ".join(
        [
            said[0][0],
            *(f"{changes[0].system}: {text}" for changes, (text, _) in zip(systems[1:], said[1:], strict=True)),
        ]
    )
    common_mode = any(found is not None for _, found in said)
    return _group(
        "system change",
        [],
        run,
        run_ids,
        matters=common_mode,
        systems=[changes[0].system for changes in systems],
        size=size,
        start=_start_of([m for changes in systems for m in changes]),
        detail=detail,
        canaries=sorted({m.series for changes in systems for m in changes}),
        common_mode=common_mode,
    )


def _stack_and_benchmark(alone: Sequence[CellEvent], run: int, run_ids: Sequence[str], smallest: float) -> list[dict]:
    """Cells that moved alone: one software-stack group per distinct stack difference (its cells' starts, estimates,
    may differ by a run), one benchmark-change group per cell without one."""
    stacks: dict[str, list[CellEvent]] = {}
    groups = []
    for event in alone:
        if event.stack_changes:
            stacks.setdefault(repr(event.stack_changes), []).append(event)
            continue
        text = f"{event.system} {event.benchmark} {event.cell} {event.metric}"
        detail = f"benchmark change: {text} {event.kind} {_percent(event.relative_change)} from {run_ids[event.start]}"
        groups.append(_group("benchmark change", [event], run, run_ids, detail=detail))
    for cells in stacks.values():
        diff, start = cells[0].stack_changes, min(e.start for e in cells)
        keys = ", ".join(key for key, _, _ in diff[:3]) + (f" and {len(diff) - 3} more" if len(diff) > 3 else "")
        detail = (
            f"software-stack change in {run_ids[start]} ({keys}): {len(cells)} cell(s) moved, "
            f"median {_percent(_size(cells)[0])}"
        )
        stack = [{"key": key, "before": before, "after": after} for key, before, after in diff]
        matters = any(e.matters for e in cells) or _pooled_beyond(cells, smallest)
        groups.append(
            _group("software-stack change", cells, run, run_ids, matters=matters, stack_changes=stack, detail=detail)
        )
    return groups


def _pooled_beyond(cells: Sequence[CellEvent], smallest: float) -> bool:
    """Whether the changes of 2 or more cells of one metric and direction, pooled (inverse-variance weights on the log
    scale, their intervals' level kept), clear ``smallest``: an upgrade that moved several cells, each less surely
    than an alarm."""
    by_kind: dict[tuple, list[CellEvent]] = {}
    for event in cells:
        if 0 < 1 + event.ci_low < 1 + event.ci_high and math.isfinite(event.relative_change):
            by_kind.setdefault((event.metric, event.direction_verdict), []).append(event)
    for same in by_kind.values():
        if len(same) < 2:
            continue
        halves = np.array([(math.log1p(e.ci_high) - math.log1p(e.ci_low)) / 2 for e in same])
        weights = 1 / halves**2
        centre = float(np.sum(weights * np.log1p([e.relative_change for e in same])) / np.sum(weights))
        half = float(1 / math.sqrt(np.sum(weights)))
        if math.expm1(centre + half) < -smallest or math.expm1(centre - half) > smallest:
            return True
    return False


def _contention(contended: Iterable[Contended], run: int, run_ids: Sequence[str]) -> list[dict]:
    by_system: dict[str, list[Contended]] = {}
    for entry in contended:
        by_system.setdefault(entry.system, []).append(entry)
    groups = []
    for system, entries in sorted(by_system.items()):
        judged = {how: sum(1 for e in entries if e.judged == how) for how in ("relative", "kept", "left out")}
        said = ", ".join(f"{count} {how}" for how, count in judged.items() if count)
        detail = f"{system}: {len(entries)} cell(s) with contended trials in {run_ids[run]} ({said})"
        cells = [
            {"system": e.system, "benchmark": e.benchmark, "cell": e.cell, "trials": e.trials, "judged": e.judged}
            for e in entries
        ]
        groups.append(
            {
                "cause": "contention",
                "matters": False,
                "systems": [system],
                "cells": cells,
                "relative_change": None,
                "ci_low": None,
                "ci_high": None,
                "start_run_id": run_ids[run],
                "listed_at_run_id": run_ids[run],
                "stack_changes": [],
                "detail": detail,
            }
        )
    return groups
