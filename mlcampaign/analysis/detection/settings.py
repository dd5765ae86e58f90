"""What the detectors decide and how: the verdicts and their reasons, and the settings (the campaign's
``regression`` block, whose defaults its schema declares, and the detectors' own constants)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from mlcampaign.plan.config_files import load_schema

Direction = Literal["higher", "lower"]
Scale = Literal["log", "linear"]

# A run's verdict, and what it means.
VERDICTS = {
    "regression": "worse by a change that matters: beyond the run-to-run noise at the stated false-alarm rate, and "
    "its interval excludes min_change",
    "improvement": "better by a change that matters: beyond the run-to-run noise at the stated false-alarm rate, and "
    "its interval excludes min_change",
    "minor shift": "beyond the run-to-run noise, but its interval does not exclude min_change: listed, not failed on",
    "outlying run": "the run before was off and this one does not confirm it: one outlying run, set aside, no change",
    "unchanged": "tested, nothing found, and a change of the target size would have been found (90 % power)",
    "cannot tell yet": "the history cannot decide (the reason says why and what it needs)",
    "not measured": "no ok trial of the cell in this run",
    "no value": "the cell has ok trials in this run but none with a value of the metric (e.g. none reached the target)",
}
# Why a run "cannot tell yet".
REASONS = {
    "insufficient history": "too few runs since the start of the series or of the last change to test",
    "underpowered": "tested and nothing found, but a change of the target size could have been missed",
    "awaiting confirmation": "the newest run looks off, not enough to alarm alone: the next runs decide",
    "inconsistent trials": "the newest run alone would alarm, but its trials disagree (or are fewer than usual)",
}
# The verdicts of alarms that matter.
ALARMS = ("regression", "improvement")
# What a listed change is (CellChange.kind), and which detector listed it (CellChange.source).
KINDS = ("alarm", "minor shift", "outlying run")
SOURCES = ("per run", "history", "big drop")

# The settings a campaign may set (its ``regression`` block): their defaults are the campaign schema's,
# which a loaded campaign carries filled in.
CAMPAIGN_SETTINGS = ("false_alarm_rate", "target_change", "min_change", "window", "confirmation")
_CAMPAIGN_DEFAULTS = {
    name: spec["default"]
    for name, spec in load_schema("campaign")["properties"]["regression"]["properties"].items()
    if name in CAMPAIGN_SETTINGS
}


@dataclasses.dataclass(frozen=True)
class DetectionSettings:
    """How the detectors decide (the campaign's ``regression`` block; defaults: weekly runs of about
    three trials, changes of 5 % and more)."""

    # Chance that a run of one cell lists a change where there is none (every detector, both directions,
    # all candidate starts together).
    false_alarm_rate: float = _CAMPAIGN_DEFAULTS["false_alarm_rate"]
    # The change a cell should detect within the confirmation window, with ``power``.
    target_change: float = _CAMPAIGN_DEFAULTS["target_change"]
    # An alarm matters when its interval excludes this change in its direction (None: target_change / 2);
    # a significant but smaller shift is a minor shift.
    min_change: float | None = _CAMPAIGN_DEFAULTS["min_change"]
    # At most this many preceding runs form the reference (12 weekly runs: a quarter).
    window: int = _CAMPAIGN_DEFAULTS["window"]
    # A change may take this many following runs to be confirmed (candidate starts: the last 1 + this).
    confirmation: int = _CAMPAIGN_DEFAULTS["confirmation"]
    power: float = 0.9
    # The two-sided level of the interval that decides whether a listed change matters (None: the per-test
    # level, the interval reported). A proposal under measurement (bench/detection.py --settings).
    matters_level: float | None = None
    # The per-run test is calibrated to this share of false_alarm_rate: its gates, restarts and outlying
    # runs keep its listings below it, and the whole-history detector adds its own (bench/detection.py).
    per_run_share: float = 0.6
    # No test with fewer reference runs (the t test needs a spread of run values).
    min_reference_runs: int = 3
    # The most extreme reference run is left out when its studentized deleted residual is significant
    # at this level (Bonferroni; from 5 reference runs on): one run with two slow trials out of three
    # must not mask a change for a whole window. 0: keep every run.
    reference_outlier_alpha: float = 0.01
    # Per-test p below which a newest run that does not alarm is "awaiting confirmation"; a run that
    # follows a run that was off confirms it when it is off by this p in the same direction.
    suspect_p: float = 0.05
    # A drop of at least this many target changes (worse direction) over the newest 2 .. confirmation + 1
    # runs, significant at the per-test level against the window before them, is always listed.
    big_drop: float = 2.0
    # Huber's tuning constant (in within-run sds): 95 % efficiency at normal trials.
    huber_k: float = 1.345
    # "log": positive metrics, relative changes; "linear": any sign, absolute changes.
    scale: Scale = "log"
    # apache-otava's settings for the whole-history detector: its window (its default), and a p stricter
    # than its default of 0.001, which under slow outlying trials alone lists 0.3-0.8 % of cell-runs.
    history_max_pvalue: float = 0.0002
    history_window: int = 50
    # Each run's whole-history analysis looks at this many runs up to it: a change first named more than
    # that after it started (over half a year of weekly runs) is no longer actionable, and otava's small
    # old level differences would be listed late (the public long series: 4 of them at 100 runs).
    history_lookback: int = 30
    # A whole-history change point is the change the per-run test listed when their directions agree and
    # their starts are at most this many runs apart (then it is not listed again).
    history_same_start: int = 1
    # A history change point needs this many runs on each side: the newest runs are the per-run test's
    # (with its gates and outlying runs), and two runs, one of them outlying, are no level.
    history_min_segment: int = 3
    # Calibration of the per-test level: simulated null draws (Monte-Carlo SE of the rate ~0.05 %).
    calibration_draws: int = 40_000
    seed: int = 24
    # Largest trials per run that trials_needed considers.
    max_trials: int = 30

    @property
    def per_run_rate(self) -> float:
        """The per-run test's share of ``false_alarm_rate`` (the rest is the whole-history detector's)."""
        return self.false_alarm_rate * self.per_run_share

    @property
    def change_that_matters(self) -> float:
        """``min_change``, or half of ``target_change`` when it is not set."""
        return self.target_change / 2 if self.min_change is None else self.min_change

    @classmethod
    def from_config(cls, regression: Mapping) -> DetectionSettings:
        """The settings of a campaign's ``regression`` block (keys absent in older runs' configs: defaults)."""
        return cls(**{name: regression[name] for name in CAMPAIGN_SETTINGS if name in regression})


def verdict_of(change: float, direction: Direction) -> str:
    """An alarm's verdict: a change of the run value (sign) in the better ``direction`` or not."""
    return "improvement" if (change > 0) == (direction == "higher") else "regression"


# The settings that a campaign without a regression block gets (the functions' default).
DEFAULT_SETTINGS = DetectionSettings()
