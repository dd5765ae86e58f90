"""The per-run test (``scan``): at each run, as it runs each week (each run sees only the runs up to it),
the newest run and the runs since a candidate start up to ``confirmation`` runs back against the up to
``window`` runs before them (mlcampaign.analysis.detection.statistic: a two-sample t test on run values,
so week-level variation shared by a run's trials is noise, not a change), at the calibrated per-test
level (mlcampaign.analysis.detection.power). What it lists, each change once (docs/regression.md):

- a change beyond the noise is an alarm when its interval excludes ``min_change`` in its direction (it
  matters), else a *minor shift*. An alarm starts a new segment at the change: the runs since it are the
  new level, the noise is pooled over the window's segments, so the next run is tested at once. A minor
  shift stays under test against the runs before it as runs arrive (the runs since it are the level of
  the other candidates meanwhile): upgraded to an alarm once its interval excludes ``min_change``,
  dropped once it is no longer significant, accepted as the new level after ``window`` runs;
- a run that was off (listed, or significant but held back because its trials disagree) and that the
  next run does not confirm is an *outlying run*: set aside, the segment not restarted there, so that
  the return to the earlier level is no second change;
- a drop of ``big_drop`` target changes or more over 2 .. confirmation + 1 runs, significant one-sided at
  the per-run rate against the level since the latest change or against the window whatever the
  segments (there each of its runs ``WINDOW_DROP_SHARE`` of it down or more, the noise pooled over the
  listed segments or over the window split at one unlisted level change), is listed ("big drop") unless
  already listed (a minor shift of it is upgraded);
- the whole-history change points (``history_changes``) first named at a run are listed there unless
  the per-run test listed the same change (same direction, start within ``history_same_start`` runs),
  and start a segment.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from mlcampaign.analysis.detection.analyses import Row, Spans, Tests
from mlcampaign.analysis.detection.changes import CellChange, ScanResult, change_kind
from mlcampaign.analysis.detection.history_changes import HistoryChange, history_changes
from mlcampaign.analysis.detection.power import (
    detectable_change,
    detectable_shift_per_sd,
    null_of,
    per_test_level,
)
from mlcampaign.analysis.detection.run_values import (
    Noise,
    RunSeries,
    as_relative,
    noise_of,
)
from mlcampaign.analysis.detection.settings import DEFAULT_SETTINGS, DetectionSettings, Direction, verdict_of
from mlcampaign.analysis.detection.statistic import candidate_tests, p_two_sided
from mlcampaign.analysis.detection.steps import StepResult, change_text, interval, step_result, undecided

# The big-drop guard lists a drop against the window's level where each of its runs is this share of a big drop
# down or more: a big drop right after an unlisted rise (or with a slow run in the window) reads smaller
# against the window's mean, and a drop exactly that big reads smaller half the time (bench/README.md "Big
# drops": with the drop's mean at a whole big drop, 36 of 2 000 four-fold drops of two runs were missed).
WINDOW_DROP_SHARE = 0.75
# The order in which a run's listings head its verdict.
_HEADLINE = ("regression", "improvement", "minor shift", "outlying run")


def scan(series: RunSeries, direction: Direction, settings: DetectionSettings = DEFAULT_SETTINGS) -> ScanResult:
    """The per-run test at every run in order, as it runs each week: one StepResult per run (the verdict
    at that run), the changes it lists (CellChanges), and the whole-history change points (module
    docstring)."""
    settings = dataclasses.replace(settings, scale=series.scale)
    return _Scan(series, direction, settings).run()


@dataclasses.dataclass
class _Pending:
    """A minor shift under test: the run it started in, its sign and its listing."""

    start: int
    sign: float
    listing: CellChange


@dataclasses.dataclass
class _Watch:
    """The previous run, off: listed with its start there (``listing``) or held back by its trials (None)."""

    run: int
    sign: float
    level: float
    listing: CellChange | None


class _Scan:
    """The state of the per-run test as the runs arrive (``scan``): the segment bounds (positions of the
    runs that start a segment), the minor shift under test, the previous run if it was off, the runs set
    aside as outlying, and what it listed."""

    def __init__(self, series: RunSeries, direction: Direction, settings: DetectionSettings):
        self.series, self.direction, self.settings = series, direction, settings
        self.measured = np.flatnonzero(series.n > 0)
        self.positions = self.measured
        self.spans = Spans(series, self.positions, settings)
        self.bounds: set[int] = set()
        self.pending: _Pending | None = None
        self.watch: _Watch | None = None
        self.changes: list[CellChange] = []
        self.history = history_changes(series, direction, settings)
        self.shown: list[HistoryChange] = []
        self._plans: dict = {}

    def run(self) -> ScanResult:
        steps = {int(position): self._analyse(int(position)) for position in self.measured}
        missing = "no value of the cell in this run"
        return ScanResult(
            [
                steps.get(position) or undecided(position, "not measured", None, missing, self.settings)
                for position in range(len(self.series.values))
            ],
            self.changes,
            self.shown,
        )

    # -- one run ------------------------------------------------------------------------------------

    def _analyse(self, position: int) -> StepResult:
        """The analysis of the run at ``position``: the previous run checked for an outlying run, the
        candidate starts, the minor shift under test, the big-drop guard, the whole-history changes."""
        notes: list[str] = []
        listings = [change for change in [self._check_watch(position, notes)] if change is not None]
        analysis = int(np.searchsorted(self.positions, position))
        regular, pending, rows, tests = self._planned(analysis)
        if not regular or regular[0].reference_df < self.settings.min_reference_runs - 1:
            step = self._insufficient(position, regular[0] if regular else None)
            self._history_at(position)
            return self._headline(step, listings, notes)
        structure = tuple(row.segments for row in regular)
        context = self._context(position, analysis, regular, tests, structure, per_test_level(structure, self.settings))
        step, listing = self._decide(regular, tests, context)
        listings += [listing] if listing else []
        if listing is None and pending and step.reason not in ("awaiting confirmation", "inconsistent trials"):
            # (a run that is off the level since the minor shift may start another change: it waits)
            listings += self._test_pending(self._test(tests, rows, len(regular)), context, notes)
        listings += self._guard(rows, pending, tests, context)
        self._history_at(position)
        return self._headline(step, listings, notes)

    def _planned(self, analysis: int) -> tuple[list[Row], list[Row], list[Row], Tests]:
        """The rows of an analysis (regular, pending, all) and their tests. The tests of every analysis from
        this one on are computed at once with the scan's state as it is, and reused until it changes."""
        if analysis not in self._plans:
            plans = {}
            for later in range(analysis, len(self.positions)):
                regular, pending = self._regular_rows(later), self._pending_rows(later)
                rows = [*regular, *pending, *self._guard_rows(later)] if regular else []
                plans[later] = (regular, pending, rows)
            widest = max((row.new[1] - row.new[0] for plan in plans.values() for row in plan[2]), default=1)
            parts = [self._matrices(later, plan[2], widest) for later, plan in plans.items() if plan[2]]
            stacked = [np.concatenate(arrays) for arrays in zip(*parts, strict=True)] if parts else None
            tests = candidate_tests(*stacked[:3], self.settings.reference_outlier_alpha, stacked[3]) if parts else None
            offset = 0
            for later, (regular, pending, rows) in plans.items():
                self._plans[later] = (regular, pending, rows, Tests(tests, offset))
                offset += len(rows)
        return self._plans[analysis]

    def _changed(self) -> None:
        """The state changed: the planned tests of later analyses no longer hold."""
        self._plans = {}

    def _regular_rows(self, analysis: int) -> list[Row]:
        """The candidate starts of an analysis, newest run first, while they start after the last segment
        bound and their reference gives the degrees of freedom of ``min_reference_runs`` runs (the first
        one, even without: it says what the history lacks)."""
        bounds = self._bounds(with_pending=True)
        last = bounds[bounds <= analysis].max(initial=0)
        rows = []
        for k in range(1, self.settings.confirmation + 2):
            start = analysis - k + 1
            if start < 1 or start <= last:
                break
            row = Row((max(0, start - self.settings.window), start), (start, analysis + 1), bounds)
            if rows and row.reference_df < self.settings.min_reference_runs - 1:
                break
            rows.append(row)
        return rows

    def _pending_rows(self, analysis: int) -> list[Row]:
        """The minor shift under test: the runs since its start against the window before it."""
        if self.pending is None:
            return []
        start = int(np.searchsorted(self.positions, self.pending.start))
        reference = (max(0, start - self.settings.window), start)
        return [Row(reference, (start, analysis + 1), self._bounds(with_pending=False))]

    def _guard_rows(self, analysis: int) -> list[Row]:
        """The big-drop guard's own tests: the newest 2 .. confirmation + 1 runs against the window before
        them, the level of every run there (segments ignored), the noise pooled over the segments; where
        nothing was listed in the window, also with the noise pooled over its two parts either side of an
        unlisted level change (_unlisted_level_change)."""
        bounds = self._bounds(with_pending=True)
        rows = []
        for k in range(2, self.settings.confirmation + 2):
            start = analysis - k + 1
            row = Row((max(0, start - self.settings.window), start), (start, analysis + 1), bounds, True)
            if start >= self.settings.min_reference_runs and row.reference_df >= self.settings.min_reference_runs - 1:
                rows.append(row)
                split = self._unlisted_level_change(analysis, row)
                if split is not None:
                    rows.append(Row(row.reference, row.new, np.union1d(bounds, [split]), True))
        return rows

    def _unlisted_level_change(self, analysis: int, row: Row) -> int | None:
        """Where a reference window without a listed change splits into two levels of 2+ runs each with the
        least pooled spread (None: a change listed in the window, or too few runs to leave 3 degrees of freedom):
        an unlisted rise or drop in the window would otherwise count as noise against a big drop after it."""
        low, high = row.reference
        if len(row.segments) != 1 or high - low < 5:
            return None
        values = self.spans.run_values(analysis, low)[: high - low]
        cuts = np.arange(2, len(values) - 1)
        sums, squares = np.cumsum(values)[cuts - 1], np.cumsum(values**2)[cuts - 1]
        before = squares - sums**2 / cuts
        after = (values**2).sum() - squares - (values.sum() - sums) ** 2 / (len(values) - cuts)
        return low + int(cuts[np.argmin(before + after)])

    def _bounds(self, with_pending: bool) -> np.ndarray:
        """The segment bounds as indices of the runs in play."""
        bounds = set(self.bounds) | ({self.pending.start} if with_pending and self.pending else set())
        return np.searchsorted(self.positions, sorted(bounds))

    def _tests(self, analysis: int, rows: list[Row]) -> Tests:
        """Every test of ``rows`` at once (statistic.candidate_tests)."""
        widest = max(row.new[1] - row.new[0] for row in rows)
        reference, labels, new, level_of_all = self._matrices(analysis, rows, widest)
        return Tests(candidate_tests(reference, labels, new, self.settings.reference_outlier_alpha, level_of_all), 0)

    def _matrices(self, analysis: int, rows: list[Row], widest: int) -> tuple[np.ndarray, ...]:
        """The reference runs, their segments, the new runs (up to ``widest``) and whether the level is every
        reference run's, of each row of an analysis (statistic.candidate_tests' arguments)."""
        window = self.settings.window
        first = min(row.reference[0] for row in rows)
        values = self.spans.run_values(analysis, first)
        reference = np.full((len(rows), window), np.nan)
        labels = np.zeros((len(rows), window), dtype=int)
        new = np.full((len(rows), widest), np.nan)
        for number, row in enumerate(rows):
            low, high = row.reference
            if high > low:
                reference[number, window - (high - low) :] = values[low - first : high - first]
                labels[number, window - (high - low) :] = row.labels
            new[number, : row.new[1] - row.new[0]] = values[row.new[0] - first : row.new[1] - first]
        return reference, labels, new, np.array([row.level_of_all for row in rows])

    def _test(self, tests: Tests, rows: list[Row], number: int) -> dict:
        """A test as plain numbers with its start (position) and reference runs in reach (size)."""
        row = rows[number]
        start = int(self.positions[row.new[0]])
        return tests.row(number) | {"start": start, "size": row.reference[1] - row.reference[0]}

    def _context(
        self, position: int, analysis: int, regular: list[Row], tests: Tests, structure: tuple, level: float
    ) -> dict:
        """What every StepResult of the analysis shares: the noise of the newest run's reference window,
        the smallest detectable changes, the per-test level and structure."""
        settings, spans = self.settings, self.spans
        newest = self._test(tests, regular, 0)
        run_sd = math.sqrt(newest["reference_squares"] / newest["reference_df"]) if newest["reference_df"] else math.nan
        noise = noise_of(
            newest["size"],
            spans.typical[analysis],
            spans.within[analysis],
            int(spans.within_dof[analysis]),
            run_sd,
            newest["reference_df"],
            newest["used"],
            spans.factor[analysis],
        )
        context = {"structure": structure, "level": level, "noise": noise, "run": position, "tests": tests}
        if len(structure[0]) == 1:
            context["reference_runs"] = newest["size"]
            for key, new_runs in (("mde_first", 1), ("mde_confirmed", settings.confirmation + 1)):
                context[key] = detectable_change(run_sd, newest["size"], new_runs, settings)
        else:  # pooled over segments: the level of the runs since the latest change, this run's level
            level_runs, reference_df = structure[0][-1], regular[0].reference_df
            context["reference_runs"] = level_runs
            for key, new_runs in (("mde_first", 1), ("mde_confirmed", settings.confirmation + 1)):
                shift = detectable_shift_per_sd(level_runs, reference_df, new_runs, level, settings.power) * run_sd
                context[key] = math.expm1(shift) if settings.scale == "log" else shift
        context["gate"] = self._newest_run_gate(analysis, newest, noise)
        return context

    def _newest_run_gate(self, analysis: int, newest: dict, noise: Noise) -> str:
        """Why the newest run alone cannot decide ('' if it can): it has fewer trials than usual, or its
        trial that moved least is not past halfway from the earlier level to the run's value (e.g. two
        slow trials out of three: the third still sits at the earlier level)."""
        n = int(self.spans.newest_n[analysis])
        if n < noise.trials_per_run:
            return f"{n} trial value(s), fewer than the usual {noise.trials_per_run:g}"
        halfway = newest["level"] + newest["diff"] / 2
        high, low = self.spans.high[analysis], self.spans.low[analysis]
        disagree = high > halfway if newest["diff"] < 0 else low < halfway
        if n >= 2 and disagree:
            return "its trials disagree: one is nearer the earlier level than the run's value"
        return ""

    def _decide(self, regular: list[Row], tests: Tests, context: dict) -> tuple[StepResult, CellChange | None]:
        """The verdict of the candidate starts, and the change it lists (if any)."""
        settings, level, gate = self.settings, context["level"], context["gate"]
        candidates = [self._test(tests, regular, number) for number in range(len(regular))]
        newest = candidates[0]
        rejected = [test for test in candidates if test["p"] <= level and not (test["k"] == 1 and gate)]
        if rejected:
            best = min(rejected, key=lambda test: test["p"])
            listing = self._list(best, level, "per run", context)
            verdict = listing.direction_verdict if listing.kind == "alarm" else "minor shift"
            if best["k"] == 1:
                self.watch = _Watch(listing.start, math.copysign(1, best["diff"]), level, listing)
            step = step_result(
                best, verdict, None, settings, context | {"source": "per run", "updates": listing.updates}
            )
            return step, listing
        if newest["p"] <= level:
            self.watch = _Watch(newest["start"], math.copysign(1, newest["diff"]), level, None)
            step = step_result(newest, "cannot tell yet", "inconsistent trials", settings, context)
            return dataclasses.replace(step, detail=f"the newest run alone cannot decide: {gate}; {step.detail}"), None
        if newest["p"] <= settings.suspect_p:
            return step_result(newest, "cannot tell yet", "awaiting confirmation", settings, context), None
        if not context["mde_confirmed"] <= settings.target_change:
            return step_result(newest, "cannot tell yet", "underpowered", settings, context), None
        return step_result(newest, "unchanged", None, settings, context), None

    def _list(self, test: dict, level: float, source: str, context: dict, updates: int | None = None) -> CellChange:
        """List the change of ``test`` at this run, and let it restart the segment (an alarm) or be tested
        on (a minor shift)."""
        relative, low, high = interval(test, level, self.settings)
        direction_verdict = verdict_of(test["diff"], self.direction)
        kind = self._kind(test, level)
        null = null_of(context["structure"], self.settings)
        change = CellChange(
            start=int(test["start"]),
            listed_at=context["run"],
            kind=kind,
            source=source,
            direction_verdict=direction_verdict,
            relative_change=relative,
            ci_low=low,
            ci_high=high,
            interval_level=1 - level,
            p_value=float(test["p"]),
            adjusted_p=float(np.searchsorted(null, test["p"], side="right") / len(null)),
            matters=kind == "alarm",
            updates=updates if updates is not None else self._earlier(int(test["start"]), direction_verdict),
            new_runs=int(test["k"]),
            reference_runs=int(test["used"]),
        )
        self.changes.append(change)
        self._segment_at(change.start, minor=kind == "minor shift", sign=math.copysign(1, test["diff"]), listing=change)
        return change

    def _kind(self, test: dict, level: float) -> str:
        """A listed change's kind: an alarm when its interval at the per-test ``level`` (or at
        ``matters_level``, where set) excludes min_change, else a minor shift."""
        return change_kind(*interval(test, self.settings.matters_level or level, self.settings), self.settings)

    def _segment_at(self, start: int, minor: bool = False, sign: float = 0.0, listing: CellChange | None = None):
        """A change listed at ``start``: a minor shift goes under test (one under test before it is accepted
        as a level), anything else starts a segment there (a minor shift under test at or after it ends)."""
        self._changed()
        if self.pending is not None:
            if self.pending.start < start:
                self.bounds.add(self.pending.start)
            self.pending = None
        if minor:
            self.pending = _Pending(start, sign, listing)
        else:
            self.bounds.add(start)

    def _earlier(self, start: int, direction_verdict: str) -> int | None:
        """The run that listed the same change earlier, if any: the same start and direction, or an
        outlying run in the same direction one or two runs before the start (the outlying run was the
        start of a change after all: its candidate starts begin after it)."""
        same = [
            change.listed_at
            for change in self.changes
            if change.direction_verdict == direction_verdict
            and (
                (change.start == start and change.kind != "outlying run")
                or (change.kind == "outlying run" and change.start < start <= change.listed_at + 1)
            )
        ]
        return same[-1] if same else None

    # -- the previous run, the minor shift under test, big drops, the whole history ------------------

    def _check_watch(self, position: int, notes: list[str]) -> CellChange | None:
        """The previous run, if it was off: confirmed by this run, or an outlying run. This run confirms it
        when it is not significantly back from it (at the previous run's per-test level), and is itself
        off the level before it in the same direction (p <= suspect_p) or the two runs together are (at
        that level). An outlying run is set aside (its segment start undone) and, if it was listed,
        listed as an outlying run."""
        watch, self.watch = self.watch, None
        analysis = int(np.searchsorted(self.positions, position))
        if watch is None or analysis == 0 or self.positions[analysis - 1] != watch.run:
            return None
        run = analysis - 1
        bounds = np.array([bound for bound in self._bounds(with_pending=True) if bound != run], dtype=int)
        reference = (max(0, run - self.settings.window), run)
        rows = [Row(reference, (run, analysis + 1), bounds), Row(reference, (analysis, analysis + 1), bounds)]
        tests = self._tests(analysis, rows)
        together, alone = tests.row(0), tests.row(1)
        off, this = self.spans.run_values(analysis, run)
        run_sd = math.sqrt(together["reference_squares"] / together["reference_df"])
        back = float(p_two_sided((this - off) / (run_sd * math.sqrt(2)), together["reference_df"]))
        if not (back <= watch.level and math.copysign(1, this - off) == -watch.sign) and (
            (alone["p"] <= self.settings.suspect_p and math.copysign(1, alone["diff"]) == watch.sign)
            or (together["p"] <= watch.level and math.copysign(1, together["diff"]) == watch.sign)
        ):
            return None
        self._set_aside(watch.run)
        notes.append("the run before this one was an outlying run (this run does not confirm it): set aside")
        if watch.listing is None:
            return None
        listing = dataclasses.replace(
            watch.listing, listed_at=position, kind="outlying run", matters=False, updates=watch.listing.listed_at
        )
        self.changes.append(listing)
        return listing

    def _set_aside(self, position: int) -> None:
        """Leave the run at ``position`` out of every later analysis (an outlying run)."""
        self._changed()
        self.positions = self.positions[self.positions != position]
        self.spans = Spans(self.series, self.positions, self.settings)
        self.bounds.discard(position)
        if self.pending is not None and self.pending.start == position:
            self.pending = None

    def _test_pending(self, test: dict, context: dict, notes: list[str]) -> list[CellChange]:
        """The minor shift under test at this run: upgraded, dropped, accepted, or still under test."""
        pending, level, settings = self.pending, context["level"], self.settings
        relative, low, high = interval(test, level, settings)
        since = f"the minor shift that started {context['run'] - pending.start} run(s) back"
        if not (test["p"] <= level and math.copysign(1, test["diff"]) == pending.sign):
            self.pending = None
            self._changed()
            notes.append(
                f"{since} is no longer beyond the noise ({change_text(relative, low, high, settings)}): dropped"
            )
            return []
        if self._kind(test, level) == "alarm":
            return [self._list(test | {"newest": False}, level, "per run", context, updates=pending.listing.listed_at)]
        if test["k"] >= settings.window:
            self._segment_at(pending.start)
            notes.append(f"{since} is accepted as the new level after {test['k']} runs")
            return []
        notes.append(f"{since} is under test: {change_text(relative, low, high, settings)}")
        return []

    def _guard(self, rows: list[Row], pending: list[Row], tests: Tests, context: dict) -> list[CellChange]:
        """The big-drop guard: a drop of ``big_drop`` target changes or more over 2 .. confirmation + 1
        runs, one-sided at the per-run rate (its size, not the family of candidate starts, keeps it from
        listing what is not there): against the window's mean whatever the segments (where no regression listed
        within the window still holds) when each of its runs is ``WINDOW_DROP_SHARE`` of a big drop down or
        more, or against the level since a change within the window (the candidate starts' tests, where that
        level rests on few runs) where such a drop is 3 standard errors or more. Listed, or, where a regression
        starting at most a run before it or listed since it started is listed already as a minor shift,
        upgrading that listing to an alarm when its interval excludes min_change; nothing where it is listed as
        an alarm."""
        settings, loose = self.settings, 2 * self.settings.per_run_rate
        big = settings.big_drop * settings.target_change
        drops = []
        for number, row in enumerate(rows):
            if row in pending:
                continue
            test = self._test(tests, rows, number) | {"newest": False}
            if row.level_of_all:  # every run of the drop that far down: a drop, not a slow run beside a normal one
                least = WINDOW_DROP_SHARE * big
                usable = not self._regression_in_force(row)
                usable = usable and self._each_run_worse_by(row, test["level"], least)
            else:  # the smaller of a big drop's sizes on the analysis scale (log: a rise's)
                shift = math.log1p(big) if settings.scale == "log" else big * abs(test["level"])
                usable = len(row.segments) > 1 and shift >= 3 * test["se"]
                least = big
            size = abs(as_relative(test["diff"], test["level"], settings.scale))
            worse = verdict_of(test["diff"], self.direction) == "regression"
            if usable and test["k"] >= 2 and test["p"] <= loose and worse and size >= least:
                drops.append(test | {"guard_level": loose})
        if not drops:
            return []
        drop = min(drops, key=lambda test: test["p"])
        start = int(np.searchsorted(self.positions, drop["start"]))
        listed = [
            change
            for change in self.changes
            if change.direction_verdict == "regression"
            and change.kind != "outlying run"
            and (change.start >= int(self.positions[max(start - 1, 0)]) or change.listed_at >= drop["start"])
        ]
        level = drop["guard_level"]
        if not listed:
            return [self._list(drop, level, "big drop", context)]
        if listed[-1].kind == "minor shift" and self._kind(drop, level) == "alarm":
            return [self._list(drop, level, "big drop", context, updates=listed[-1].listed_at)]
        return []

    def _each_run_worse_by(self, row: Row, level: float, least: float) -> bool:
        """Whether each new run of ``row`` is worse than ``level`` by ``least`` (relative) or more."""
        values = self.spans.run_values(row.new[1] - 1, row.new[0])
        changes = [as_relative(value - level, level, self.settings.scale) for value in values]
        return all(verdict_of(change, self.direction) == "regression" and abs(change) >= least for change in changes)

    def _regression_in_force(self, row: Row) -> bool:
        """Whether a regression listed within ``row``'s reference window (an alarm or a minor shift, its start run
        not set aside as outlying) still holds at the row's new runs: fewer than 2 runs in the window on either
        side of its start (before it: since the change before it), or the runs since it still down by half its
        listed change or more from the level it was listed against (a drop listed and then undone is no longer
        the level a later drop would repeat)."""
        low, high = row.reference
        values = self.spans.run_values(row.new[1] - 1, low)[: high - low]
        bounds = self._bounds(with_pending=True)
        for change in self.changes:
            if change.direction_verdict != "regression" or change.kind == "outlying run":
                continue
            if change.start < self.positions[low] or change.start not in self.positions:
                continue
            at = int(np.searchsorted(self.positions, change.start))
            level_start = max([low, *bounds[bounds < at]])
            before, since = values[level_start - low : at - low], values[at - low :]
            if len(before) < 2 or len(since) < 2:
                return True
            moved = as_relative(since.mean() - before.mean(), before.mean(), self.settings.scale)
            if moved * change.relative_change >= 0.5 * change.relative_change**2:
                return True
        return False

    def _history_at(self, position: int) -> None:
        """The whole-history change points first named by this run's analysis: listed unless the per-run
        test listed the same change (same direction, start at most ``history_same_start`` runs apart);
        a listed one starts a segment."""
        for change in self.history:
            if change.first_found != position:
                continue
            start = int(np.searchsorted(self.measured, change.run))
            hidden = any(
                listed.source != "history"
                and listed.kind != "outlying run"
                and listed.direction_verdict == change.verdict
                and abs(int(np.searchsorted(self.measured, listed.start)) - start) <= self.settings.history_same_start
                for listed in self.changes
            )
            self.shown.append(dataclasses.replace(change, hidden=hidden))
            if hidden:
                continue
            kind = change_kind(change.relative_change, change.ci_low, change.ci_high, self.settings)
            self.changes.append(
                CellChange(
                    start=change.run,
                    listed_at=position,
                    kind=kind,
                    source="history",
                    direction_verdict=change.verdict,
                    relative_change=change.relative_change,
                    ci_low=change.ci_low,
                    ci_high=change.ci_high,
                    interval_level=change.interval_level,
                    p_value=change.p_value,
                    adjusted_p=change.p_value,
                    matters=kind == "alarm",
                    updates=self._earlier(change.run, change.verdict),
                )
            )
            in_play = self.positions[self.positions >= change.run]
            if len(in_play):
                self._segment_at(int(in_play[0]))

    def _insufficient(self, position: int, row: Row | None) -> StepResult:
        """A run whose reference is too short to test."""
        settings = self.settings
        runs = row.reference[1] - row.reference[0] if row else 0
        segments = len(row.segments) if row else 0
        if segments <= 1:
            more = settings.min_reference_runs - runs
            detail = (
                f"insufficient history: {runs} earlier run(s) in this segment; the test needs "
                f"{settings.min_reference_runs} (needs {more} more run(s))"
            )
        else:
            more = settings.min_reference_runs - 1 - row.reference_df
            detail = (
                f"insufficient history: {runs} earlier run(s) in {segments} segments give {row.reference_df} "
                f"degree(s) of freedom of noise; the test needs {settings.min_reference_runs - 1} "
                f"(needs {more} more run(s))"
            )
        return undecided(position, "cannot tell yet", "insufficient history", detail, settings, more)

    def _headline(self, step: StepResult, listings: list[CellChange], notes: list[str]) -> StepResult:
        """The run's verdict: the first of its per-run listings in _HEADLINE order (the run's own test's
        verdict when it lists none), with the notes of the analysis."""
        if notes:
            step = dataclasses.replace(step, detail=f"{step.detail}; {'; '.join(notes)}")
        listed = [change for change in listings if change.source != "history"]
        if not listed:
            return step

        def verdict(change: CellChange) -> str:
            return change.direction_verdict if change.kind == "alarm" else change.kind

        head = min(listed, key=lambda change: _HEADLINE.index(verdict(change)))
        if step.change_start == head.start and step.verdict == verdict(head) and step.source == head.source:
            return step
        back = step.run - head.start
        text = (
            f"{verdict(head)} ({head.source}) started {back} run(s) back: "
            f"{change_text(head.relative_change, head.ci_low, head.ci_high, self.settings)}, p = {head.p_value:.2g}"
        )
        return dataclasses.replace(
            step,
            verdict=verdict(head),
            reason=None,
            change_start=head.start,
            new_runs=head.new_runs,
            reference_runs=head.reference_runs,
            relative_change=head.relative_change,
            ci_low=head.ci_low,
            ci_high=head.ci_high,
            interval_level=head.interval_level,
            p_value=head.p_value,
            adjusted_p=head.adjusted_p,
            source=head.source,
            updates=head.updates,
            detail=f"{text}; {step.detail}",
        )
