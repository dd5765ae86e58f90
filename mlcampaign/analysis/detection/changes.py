"""The changes a cell's detectors list (``CellChange``), each listed once, and what a scan returns
(``ScanResult``: the verdict at every run and the listed changes). docs/regression.md, "Verdicts"."""

from __future__ import annotations

import dataclasses
import math

from mlcampaign.analysis.detection.settings import DetectionSettings


@dataclasses.dataclass(frozen=True)
class CellChange:
    """A change of one cell and metric as a run's analysis lists it. A change is listed once; a later
    listing of the same change (a minor shift upgraded to an alarm, an alarm found to be an outlying run)
    names the earlier one in ``updates``."""

    start: int  # position of the run in which the change started
    listed_at: int  # position of the run whose analysis lists it (with this status)
    kind: str  # "alarm" | "minor shift" | "outlying run"
    source: str  # "per run" | "history" | "big drop"
    direction_verdict: str  # "regression" | "improvement"
    relative_change: float
    ci_low: float
    ci_high: float
    interval_level: float
    p_value: float
    adjusted_p: float
    matters: bool  # kind == "alarm" and the interval excludes min_change in its direction
    updates: int | None  # listed_at of the earlier listing of the same change it updates, else None
    new_runs: int = 0  # runs since the start that the listing's test used
    reference_runs: int = 0  # runs it was compared with


def excludes_min_change(relative_change: float, ci_low: float, ci_high: float, settings: DetectionSettings) -> bool:
    """Whether an interval excludes the change that matters (``settings.change_that_matters``) in the
    direction of ``relative_change``: the change is at least that large at the interval's level."""
    smallest = settings.change_that_matters
    if math.isnan(relative_change):
        return False
    return ci_low > smallest if relative_change > 0 else ci_high < -smallest


def change_kind(relative_change: float, ci_low: float, ci_high: float, settings: DetectionSettings) -> str:
    """A significant change's kind: an alarm when its interval excludes min_change, else a minor shift."""
    return "alarm" if excludes_min_change(relative_change, ci_low, ci_high, settings) else "minor shift"


@dataclasses.dataclass(frozen=True)
class ScanResult:
    """What ``scan`` finds in a series: the verdict at every run (``steps``: StepResults, one per run),
    the changes it lists (``changes``: CellChanges in the order of their listing), and every whole-history
    change point the analyses named (``history``: HistoryChanges, ``hidden`` where the same change was
    already listed by the per-run test)."""

    steps: list
    changes: list[CellChange]
    history: list
