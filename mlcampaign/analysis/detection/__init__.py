"""Change detection over the runs of one cell and one metric (docs/regression.md).

The run is the unit of a trend: a run's ok trials share its week (nodes, software stack, filesystem
load), so they are summarised into one value per run, on a log scale for positive metrics (changes are
relative): their Huber M-estimate of location, with the cell's pooled within-run spread as its scale
(as efficient as the mean when the trials agree, as robust as the median to one slow trial out of
three). The noise of run values comes from the history itself. Two detectors read the run series, and
both are reported:

- ``scan`` (per run): at each run, the newest run and the runs since a candidate start up to
  ``confirmation`` runs back, against the up to ``window`` preceding runs (the level since the latest
  change, the noise pooled over the window's segments). A two-sample t test on run values, so
  week-level variation shared by a run's trials is noise, not a change. Its per-test level is
  calibrated by simulating the (pivotal) null once per configuration. What it finds is listed once, as
  a CellChange: an alarm (its interval excludes ``min_change``: it matters), a minor shift (kept under
  test), an outlying run (one run off that the next does not confirm), a big drop (a guard that no
  earlier state can silence), or a whole-history change point;
- ``history_changes`` (whole history): apache-otava's E-Divisive with a t test (split and merge,
  Fleming et al., ICPE 2023), re-run at every run, so that a change missed when it happened is found
  later and named by the run in which it started (``scan`` lists it unless it listed it already).

Also: the accepted baseline as a reference run (``reference_test``: the same error term), the smallest
change a cell detects with the configured power and the runs or trials per run that a target change
needs, and epochs to target judged one-sided in the manner of MLPerf's reference convergence points
(``convergence_test``, after mlperf-logging's rcp_checker).

One module per concern: ``settings`` (verdicts, reasons, DetectionSettings), ``run_values`` (the run
series, Huber centres, the noise's parts), ``statistic`` (the per-run test's t test over segments),
``power`` (calibration, smallest detectable change, runs and trials needed), ``steps`` (the verdict at a
run), ``changes`` (the listed changes), ``scan`` (the per-run test as the runs arrive), ``reference``
(the baseline as a reference run), ``history_changes`` (apache-otava) and ``convergence`` (epochs to
target). The names below are the package's interface.
"""

from mlcampaign.analysis.detection.changes import CellChange, ScanResult, change_kind
from mlcampaign.analysis.detection.convergence import ConvergenceResult, convergence_test, olympic_variance_factor
from mlcampaign.analysis.detection.history_changes import HistoryChange, change_points, history_changes
from mlcampaign.analysis.detection.power import detectable_change, per_test_level, runs_needed, trials_needed
from mlcampaign.analysis.detection.reference import reference_centre, reference_test
from mlcampaign.analysis.detection.run_values import (
    Noise,
    RunSeries,
    as_cv,
    centre_variance_factor,
    huber_centres,
    run_series,
    run_values,
    scale_of,
    to_original,
    within_sd,
    within_sds,
)
from mlcampaign.analysis.detection.scan import scan
from mlcampaign.analysis.detection.settings import (
    ALARMS,
    KINDS,
    REASONS,
    SOURCES,
    VERDICTS,
    DetectionSettings,
    Direction,
    Scale,
    verdict_of,
)
from mlcampaign.analysis.detection.steps import StepResult

__all__ = [
    "ALARMS",
    "KINDS",
    "REASONS",
    "SOURCES",
    "VERDICTS",
    "CellChange",
    "ConvergenceResult",
    "DetectionSettings",
    "Direction",
    "HistoryChange",
    "Noise",
    "RunSeries",
    "Scale",
    "ScanResult",
    "StepResult",
    "as_cv",
    "centre_variance_factor",
    "change_kind",
    "change_points",
    "convergence_test",
    "detectable_change",
    "history_changes",
    "huber_centres",
    "olympic_variance_factor",
    "per_test_level",
    "reference_centre",
    "reference_test",
    "run_series",
    "run_values",
    "runs_needed",
    "scale_of",
    "scan",
    "to_original",
    "trials_needed",
    "verdict_of",
    "within_sd",
    "within_sds",
]
