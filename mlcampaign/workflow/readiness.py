"""Planning's view of change detection: which cells of a run cannot yet detect the campaign's target
change (docs/regression.md), so that a site learns it before the run, not from a silent summary.

Read from the summary of the site's latest earlier run (``summary.json`` beside its manifest, written
by the ingest rule: mlcampaign.history.summary.run_summary's ``cells``), never from the results store:
planning works without the store, and reads one file per earlier run, within the bounds of a run's files
(mlcampaign.plan.runs.read_run_json); a summary it cannot read is named and left out. A cell is named
when its history is too short (the per-run test needs ``DetectionSettings.min_reference_runs`` earlier
runs), when the smallest change it could detect is larger than the target change and its planned trials
per run are fewer than it needs (or no number suffices), or when it has no history at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from mlcampaign.plan.config_files import ConfigError
from mlcampaign.plan.runs import read_run_json

SUMMARY_FILE = "summary.json"
SHOWN_CELLS = 10


def latest_summary(runs_dir: Path, site: str, run_id: str, say: Callable[[str], None]) -> dict | None:
    """The summary of the site's latest run in ``runs_dir`` other than ``run_id`` (None if none); ``say`` is
    told of each summary that cannot be read, which is left out."""
    found = []
    for path in Path(runs_dir).glob(f"*/{SUMMARY_FILE}"):
        if path.parent.name == run_id:
            continue
        try:
            summary = read_run_json(path, runs_dir)
        except FileNotFoundError:
            continue  # gone meanwhile
        except ConfigError as error:
            say(f"regression: {error}: left out of this warning's history (docs/history.md, Trust and bounds)")
            continue
        if isinstance(summary, dict) and (summary.get("site") != site or "cells" not in summary):
            continue  # another site's, or a run's without cells
        if not _is_summary(summary):
            say(f"regression: {path}: not a run summary (its run_id and cells): left out of this warning's history")
            continue
        found.append((str(summary.get("started_utc", "")), path.parent.name, summary))
    return max(found, key=lambda entry: entry[:2])[2] if found else None


def _is_summary(summary) -> bool:
    """Whether ``summary`` has what detection_warnings reads: a run id and cells naming their metric."""
    if not isinstance(summary, dict) or "run_id" not in summary or not isinstance(summary.get("cells"), list):
        return False
    keys = {"system", "benchmark", "cell", "metric"}
    return all(isinstance(entry, dict) and keys <= entry.keys() for entry in summary["cells"])


def _why(entries: list[dict], trials: int, target: float) -> str | None:
    """Why a cell cannot detect ``target`` with ``trials`` per run, from its summary entries (one per
    judged metric); None if it can."""
    reasons = []
    for entry in entries:
        if entry.get("verdict") != "cannot tell yet":
            continue
        metric = entry["metric"]
        if entry.get("reason") == "insufficient history" and entry.get("runs_needed"):
            # The run being planned adds one run to the history.
            more = max(0, int(entry["runs_needed"]) - 1)
            if more:
                reasons.append(f"{metric}: needs {more} more run(s) of history")
            continue
        smallest = entry.get("smallest_detectable")
        if smallest is None or smallest <= target:
            continue
        needed = entry.get("trials_needed")
        if needed is None:
            reasons.append(
                f"{metric}: smallest detectable change {smallest:.1%}, and no number of trials per run suffices"
            )
        elif trials < needed:
            reasons.append(f"{metric}: smallest detectable change {smallest:.1%}, needs {int(needed)} trials per run")
        elif entry.get("runs_needed"):
            reasons.append(f"{metric}: smallest detectable change {smallest:.1%}, needs more runs of history")
    return "; ".join(reasons) or None


def detection_warnings(
    cells: Mapping[tuple[str, str, str], int],
    regression: Mapping,
    summary: dict | None,
    where: str,
) -> list[str]:
    """Warnings for planning: the cells (system, benchmark, cell -> planned trials per run) that cannot
    yet detect the campaign's ``regression.target_change``, named, from ``summary`` (the site's latest
    earlier run's; None without one: ``where`` says where none was found); ``regression``: as loaded (the
    campaign schema's defaults filled in)."""
    target = regression["target_change"]
    if not cells:
        return []
    if summary is None:
        # Imported here, not at planning's start: only a site's first run loads the detectors (scipy).
        from mlcampaign.analysis.detection import DetectionSettings

        names = _names(cells)
        return [
            f"regression: no earlier run of this campaign at this site ({where}): none of its {len(cells)} cell(s) "
            f"can detect a change yet; the per-run test needs {DetectionSettings.min_reference_runs} earlier runs "
            f"(docs/regression.md). Cells: {names}"
        ]
    entries: dict[tuple, list[dict]] = {}
    for entry in summary["cells"]:
        entries.setdefault((entry["system"], entry["benchmark"], entry["cell"]), []).append(entry)
    problems = {}
    for key, trials in sorted(cells.items()):
        if key not in entries:
            problems[key] = "no history yet"
            continue
        why = _why(entries[key], trials, target)
        if why:
            problems[key] = why
    if not problems:
        return []
    listed = "; ".join(f"{'/'.join(key)} ({why})" for key, why in list(problems.items())[:SHOWN_CELLS])
    more = f"; and {len(problems) - SHOWN_CELLS} more" if len(problems) > SHOWN_CELLS else ""
    return [
        f"regression: {len(problems)} of {len(cells)} cell(s) cannot detect a {target:.0%} change "
        f"(regression.target_change) with their trials and history, as of run {summary['run_id']}: {listed}{more}. "
        "Add trials per run, wait for more runs, or raise the target (docs/regression.md)."
    ]


def _names(cells: Iterable[tuple]) -> str:
    names = ["/".join(key) for key in sorted(cells)]
    return ", ".join(names[:SHOWN_CELLS]) + (
        f", and {len(names) - SHOWN_CELLS} more" if len(names) > SHOWN_CELLS else ""
    )
