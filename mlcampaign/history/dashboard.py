"""The campaign-history dashboard: a static, self-contained HTML site of one campaign's runs.

Pages, all in one folder (open index.html from a file:// URL or any web server; nothing is loaded
from the network):

- ``index.html``: the latest run at every site, merged (merge.merged_tables): its alert groups (one per
  cause, mlcampaign.history.alerts; each cell linked to its trend page), the changes detected
  at those runs (mlcampaign.history.trends: the run is the unit), the changes the whole-history
  detector found since, the cells that cannot tell yet whether they changed by the campaign's target
  change (with the smallest change each can detect and the trials per run it would need), the changes
  against the baseline if given, the Valid FLOPS ranking per benchmark with intervals, rank
  probabilities and a contention badge per cell, and the capability matrix; where the store holds
  published MLPerf HPC runs, they are ranked beside the cells (rows marked published, with round,
  submitter and source) and listed with time to train, resource-minutes and scaling;
- ``system-<system>.html``: one per system: its cells' status and ranks, every change in its history,
  the median throughput of its cells relative to their first run, links to its trend pages, and the
  machine: its canaries over runs, per cell and for the machine, with units and run-to-run CV
  (mlcampaign.history.machine);
- ``trends-<system>--<benchmark>.html``: one plot per cell of the chosen metric over runs: mean
  with its t interval as a band, the run's value (what the detectors read), the runs in which a
  change started (hover: its size and what changed in the stack), and per cell what its history can
  detect and its contended trials;
- ``runs.html``: every run with its outcome counts, and the stack differences of any two runs.

Plots are drawn by plotly.js (the plotly package's own bundle, written once to
``assets/plotly.min.js``). Each page's data is inlined as JSON (fetch() of local files is blocked on
file://); ``assets/dashboard.js`` builds the figures, the filters and the run diff from it, and sets
``window.dashboardReadyMs`` (performance.now(), ms since navigation start) once every plot of the
page is drawn. Trend data is split per (system, benchmark) page so that no page carries a year of
every cell.

The site is built in a temporary folder and replaces ``out_dir`` once complete, only where a dashboard is
(mlcampaign.history.dashboard_folder).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import jinja2
import pandas as pd
import plotly.offline

from mlcampaign.analysis.baseline import current, load_store
from mlcampaign.analysis.frame import CELL_KEYS
from mlcampaign.analysis.mlperf_results import ORIGIN_COLUMNS
from mlcampaign.analysis.units import metric_quantity, quantity
from mlcampaign.history.dashboard_folder import ASSETS, MARKER, refuse_unless_dashboard, replace_directory
from mlcampaign.history.machine import machine_page
from mlcampaign.history.merge import (
    AnalysisSettings,
    HistoryError,
    check_one_campaign,
    latest_runs,
    merged_tables,
    records_by_run,
    runs_in_order,
    system_sources,
)
from mlcampaign.history.store import open_store
from mlcampaign.history.summary import run_summary
from mlcampaign.history.trends import Trends, compute_trends
from mlcampaign.history.verdicts import CHANGE_VERDICTS
from mlcampaign.plan.metrics import METRICS

HERE = Path(__file__).resolve().parent
RANKING_COLUMNS = ["rank", "system", "cell", "status", "n", "valid_flops_per_s", "ci_boot_low", "ci_boot_high"]
RANKING_COLUMNS += ["p_rank", "flops_per_s", "penalty", "achieved_quality"]
CHANGE_COLUMNS = ["run_id", "change_start_run_id", "previous_run_id", *CELL_KEYS, "metric", "kind", "verdict"]
CHANGE_COLUMNS += ["relative_change", "ci_low", "ci_high", "interval_level", "p_value", "false_alarm_rate", "n"]
CHANGE_COLUMNS += ["contended", "detail", "stack_changes", "stack_changes_run_id"]
HISTORY_CHANGE_COLUMNS = [*CELL_KEYS, "metric", "run_id", "previous_run_id", "first_found_run_id", "verdict"]
HISTORY_CHANGE_COLUMNS += ["relative_change", "p_value", "alarmed", "stack_changes", "stack_changes_run_id"]
BASELINE_CHANGE_COLUMNS = ["run_id", "since_run_id", *CELL_KEYS, "metric", "verdict", "relative_change", "ci_low"]
BASELINE_CHANGE_COLUMNS += ["ci_high", "p_value", "n", "detail"]
DETECTABILITY_COLUMNS = ["run_id", *CELL_KEYS, "metric", "kind", "verdict", "reason", "run_cv"]
DETECTABILITY_COLUMNS += ["smallest_detectable_first", "smallest_detectable", "trials_needed", "runs_needed", "detail"]
DETECTABILITY_COLUMNS += ["relative_detail"]
FIRST_METRIC = "throughput_samples_per_s"
POINT_COLUMNS = ["run_id", "n", "ok_trials", "contended", "mean", "median", "ci_low", "ci_high"]
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def metric_label(metric: str) -> str:
    """Axis and column label of a metric: its description (mlcampaign.plan.metrics) up to its unit, or
    with its unit appended. The quality metric's unit is the benchmark's target metric: the trend
    page names it per cell."""
    described = METRICS[metric]
    unit = f"({described.unit})"
    if described.unit in ("", "target metric"):
        return described.description
    if unit in described.description:
        return described.description[: described.description.index(unit) + len(unit)]
    return f"{described.description} {unit}"


def _json_rows(frame: pd.DataFrame, columns: Sequence[str] | None = None) -> list[dict]:
    """Rows as JSON-ready dicts (NaN -> None, numpy -> Python) through pandas' own JSON writer."""
    frame = frame if columns is None else frame[list(columns)]
    return json.loads(frame.to_json(orient="records"))


def _slug(name: str) -> str:
    return _UNSAFE.sub("_", name)


class _PageNames:
    """File names of the system and trend pages; two names that map to one file are an error."""

    def __init__(self):
        self._owners: dict[str, tuple] = {}

    def _claim(self, file_name: str, owner: tuple) -> str:
        if self._owners.setdefault(file_name, owner) != owner:
            raise HistoryError(f"{owner} and {self._owners[file_name]} would both be page {file_name}: rename one")
        return file_name

    def system(self, system: str) -> str:
        return self._claim(f"system-{_slug(system)}.html", (system,))

    def trends(self, system: str, benchmark: str) -> str:
        return self._claim(f"trends-{_slug(system)}--{_slug(benchmark)}.html", (system, benchmark))


def _number(value, digits: int = 4) -> str:
    """A number to ``digits`` significant digits ("" for a missing one)."""
    return "" if value is None or pd.isna(value) else f"{value:.{digits}g}"


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # Page data goes to JSON.parse in the browser, which rejects NaN: fail here instead.
    environment.policies["json.dumps_kwargs"] = {"sort_keys": False, "allow_nan": False}
    environment.filters["number"] = _number
    environment.filters["percent"] = _percent
    environment.filters["quantity"] = quantity
    environment.filters["metric_quantity"] = metric_quantity
    return environment


def _percent(value, signed: bool = True) -> str:
    """A relative change or fraction as a percentage ("" for a missing one)."""
    if value is None or pd.isna(value):
        return ""
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _changes(changes: pd.DataFrame) -> list[dict]:
    """The changes (CHANGE_VERDICTS) among ``changes`` rows of the trends: each with the run in which it
    started, the measured run before it and the stack changes between the two."""
    return _json_rows(changes.loc[changes["verdict"].isin(CHANGE_VERDICTS)], CHANGE_COLUMNS)


def _history_changes(history: pd.DataFrame, run_ids: Iterable[str] | None = None) -> list[dict]:
    """The whole-history change points among ``history`` rows of the trends (first found by one of
    ``run_ids``' analyses, if given) that the per-run test had not named: changes found later."""
    found = history.loc[~history["alarmed"]]
    if run_ids is not None:
        found = found.loc[found["first_found_run_id"].isin(list(run_ids))]
    return _json_rows(found, HISTORY_CHANGE_COLUMNS)


def _baseline_changes(trends: Trends, run_ids: Iterable[str]) -> list[dict] | None:
    if trends.baseline is None:
        return None
    against = trends.baseline.loc[trends.baseline["run_id"].isin(list(run_ids))]
    return _json_rows(against.loc[against["verdict"].isin(CHANGE_VERDICTS)], BASELINE_CHANGE_COLUMNS)


def _detectability(trends: Trends, run_ids: Iterable[str]) -> list[dict]:
    """Per cell and judged metric at its run among ``run_ids``: the verdict, and what the history can
    detect (run-to-run CV, smallest change detectable with 90 % power, trials per run and runs needed)."""
    rows = trends.changes.loc[trends.changes["run_id"].isin(list(run_ids))]
    return _json_rows(rows.sort_values([*CELL_KEYS, "metric"]), DETECTABILITY_COLUMNS)


def _contention(trends: Trends, run_ids: Iterable[str]) -> dict[tuple, str]:
    """(system, benchmark, cell) -> its contention badge in its run among ``run_ids``, e.g. "2 of 3
    trials contended" (cells without a contended trial are absent)."""
    points = trends.points.loc[trends.points["run_id"].isin(list(run_ids))].drop_duplicates(CELL_KEYS)
    points = points.loc[points["contended"] > 0]
    left_out = "" if trends.settings.keep_contended else " (left out of the trends)"
    return {
        tuple(getattr(row, key) for key in CELL_KEYS): f"{row.contended} of {row.ok_trials} trials contended{left_out}"
        for row in points.itertuples()
    }


def _rankings(ranking: pd.DataFrame, columns: Sequence[str], contention: Mapping[tuple, str]) -> list[dict]:
    """The ranking per benchmark: ``columns`` (RANKING_COLUMNS, with a published row's origin where the
    ranking has published runs), the FLOP/s in human units for the plot's hover, and each cell's
    contention badge ("" without a contended trial)."""
    rankings = []
    for benchmark, rows in ranking.groupby("benchmark", sort=True):
        listed = _json_rows(rows, ["benchmark", *columns])
        for row in listed:
            row["contended_badge"] = contention.get((row["system"], benchmark, row["cell"]), "")
            row["valid_flops_text"] = quantity(row["valid_flops_per_s"], "FLOP/s")
        rankings.append({"benchmark": benchmark, "rows": listed})
    return rankings


def _capability_matrix(capability: pd.DataFrame) -> dict:
    """The capability table as rows (system, cell) x columns (benchmarks) of {status, outcome}."""
    benchmarks = sorted(capability["benchmark"].unique())
    rows = []
    for (system, cell), cells in capability.groupby(["system", "cell"], sort=True):
        by_benchmark = {row.benchmark: {"status": row.status, "outcome": row.outcome} for row in cells.itertuples()}
        rows.append({"system": system, "cell": cell, "benchmarks": by_benchmark})
    return {"benchmarks": benchmarks, "rows": rows}


def _trend_page_data(
    system: str,
    benchmark: str,
    points: pd.DataFrame,
    changes: pd.DataFrame,
    history: pd.DataFrame,
    target_metrics: Mapping[str, str],
    baseline_values: Mapping[tuple, float],
    metrics: Sequence[str],
) -> dict:
    """What one trend page draws, from the (system, benchmark) rows of the trends: per cell and metric
    the series (lists of POINT_COLUMNS, the run value and its text in human units), the runs' verdicts,
    the changes (per run and whole history) and the baseline's value; per cell what its history can
    detect at its latest run, and its contended trials."""
    series: dict[tuple, dict] = {}
    for point in _json_rows(points, ["cell", "metric", *POINT_COLUMNS]):
        empty = {column: [] for column in [*POINT_COLUMNS, "value", "text", "verdict", "changes", "history"]}
        entry = series.setdefault((point["cell"], point["metric"]), empty)
        for column in POINT_COLUMNS:
            entry[column].append(point[column])
        entry["text"].append(metric_quantity(point["mean"], point["metric"]))
    keys = zip(changes["cell"], changes["metric"], changes["run_id"], strict=True)
    judged = dict(zip(keys, zip(changes["value"], changes["verdict"], strict=True), strict=True))
    for (cell, metric), entry in series.items():
        for run_id in entry["run_id"]:
            value, verdict = judged.get((cell, metric, run_id), (None, None))
            entry["value"].append(_plain_number(value))
            entry["verdict"].append(verdict)
    for change in _changes(changes):
        series[(change["cell"], change["metric"])]["changes"].append(change)
    for found in _json_rows(history, HISTORY_CHANGE_COLUMNS):
        series[(found["cell"], found["metric"])]["history"].append(found)
    latest = changes.sort_values("run_order").drop_duplicates(["cell", "metric"], keep="last")
    status = {cell: rows for cell, rows in latest.groupby("cell")}
    contended = points.sort_values("run_order").drop_duplicates("cell", keep="last").set_index("cell")
    cells: dict[str, dict] = {}
    for (cell, metric), entry in series.items():
        entry["baseline_value"] = _plain_number(baseline_values.get((cell, metric)))
        described = cells.setdefault(
            cell,
            {
                "cell": cell,
                "target_metric": target_metrics.get(cell),
                "series": {},
                "detectability": _json_rows(status[cell], DETECTABILITY_COLUMNS) if cell in status else [],
                "contended": int(contended.loc[cell, "contended"]),
                "ok_trials": int(contended.loc[cell, "ok_trials"]),
            },
        )
        described["series"][metric] = entry
    labels = {metric: metric_label(metric) for metric in metrics}
    units = {metric: METRICS[metric].unit for metric in metrics}
    return {
        "system": system,
        "benchmark": benchmark,
        "metric_labels": labels,
        "units": units,
        "cells": list(cells.values()),
    }


def _trend_pages(trends: Trends, pages: Mapping[str, Mapping[str, str]], metrics: Sequence[str]):
    """(page name, system, benchmark, page data) of every trend page; the trends' rows grouped by
    (system, benchmark) once."""
    pair = ["system", "benchmark"]
    points = dict(list(trends.points.groupby(pair, sort=False)))
    changes = dict(list(trends.changes.groupby(pair, sort=False)))
    history = dict(list(trends.history.groupby(pair, sort=False)))
    targets = trends.trials.dropna(subset=["target_metric"]).groupby([*pair, "cell"])["target_metric"].first()
    baseline = {}
    if trends.baseline is not None:
        baseline = trends.baseline.groupby([*pair, "cell", "metric"])["baseline_value"].last().to_dict()
    for system, by_benchmark in pages.items():
        for benchmark, name in by_benchmark.items():
            key = (system, benchmark)
            data = _trend_page_data(
                system,
                benchmark,
                points.get(key, trends.points.iloc[:0]),
                changes.get(key, trends.changes.iloc[:0]),
                history.get(key, trends.history.iloc[:0]),
                {cell: target for (*other, cell), target in targets.items() if tuple(other) == key},
                {(cell, metric): value for (*other, cell, metric), value in baseline.items() if tuple(other) == key},
                metrics,
            )
            yield name, system, benchmark, data


def _plain_number(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _relative_throughput(trends: Trends, system: str) -> list[dict]:
    """Per benchmark, the median over the system's cells of each run's median throughput divided
    by the cell's first measured median: a system-wide change shows in every benchmark at once."""
    metric = "throughput_samples_per_s"
    points = trends.points.loc[(trends.points["system"] == system) & (trends.points["metric"] == metric)]
    points = points.dropna(subset=["median"]).sort_values("run_order")
    first = points.groupby(CELL_KEYS)["median"].transform("first")
    relative = points.assign(relative=points["median"] / first)
    per_run = relative.groupby(["benchmark", "run_order", "run_id"], sort=True)["relative"].median().reset_index()
    return [
        {"benchmark": benchmark, "run_id": rows["run_id"].tolist(), "relative": rows["relative"].tolist()}
        for benchmark, rows in per_run.groupby("benchmark", sort=True)
    ]


def _install_assets(site: Path) -> None:
    """plotly.js from the plotly package, and the dashboard's own script and style."""
    assets = site / "assets"
    assets.mkdir(parents=True)
    (assets / "plotly.min.js").write_text(plotly.offline.get_plotlyjs(), encoding="utf-8")
    for name in ("dashboard.js", "dashboard.css"):
        shutil.copyfile(HERE / "static" / name, assets / name)


def _runs_page_data(runs: Sequence[Mapping], trends: Trends) -> dict:
    """The runs (start order), each run's stack fingerprints per system, and the pair shown first:
    the latest run and the run before it at the same site."""
    latest = runs[-1]
    same_site = [run["run_id"] for run in runs[:-1] if run["site"] == latest["site"]]
    first_pair = [same_site[-1] if same_site else latest["run_id"], latest["run_id"]]
    listed = [{key: run[key] for key in ("run_id", "site", "started_utc")} for run in runs]
    return {"runs": listed, "fingerprints": trends.fingerprints, "first_pair": first_pair}


@dataclasses.dataclass
class _Site:
    """What the pages of a dashboard show: the campaign's runs (start order), their trends, the merged
    tables of the latest run at every site, the pages' names and the context every page shares."""

    runs: list[Mapping]
    trends: Trends
    latest_ids: list[str]
    tables: dict[str, pd.DataFrame]
    ranking_columns: list[str]
    systems: list[str]
    sources: list[dict]
    names: _PageNames
    trend_pages: dict[str, dict[str, str]]
    metrics: list[str]
    common: dict


def _site(
    manifests: Iterable[Mapping],
    records: Iterable[Mapping] | Mapping[str, Iterable[Mapping]],
    campaign: str | None,
    settings: AnalysisSettings | None,
    baseline: pd.DataFrame | None,
    published: Sequence[Mapping] | None,
) -> _Site:
    """The _Site of ``campaign``'s runs among ``manifests`` (build_site's arguments)."""
    runs = runs_in_order(manifests)
    campaign = campaign or check_one_campaign(runs)
    runs = [run for run in runs if run["campaign"] == campaign]
    if not runs:
        raise HistoryError(f"campaign {campaign!r} has no run")
    settings = settings or AnalysisSettings.from_manifest(runs[-1])
    by_run = records_by_run(runs, records)
    trends = compute_trends(runs, by_run, settings, baseline=baseline)
    metrics = list(dict.fromkeys(trends.points["metric"])) or list(settings.metrics)
    latest = latest_runs(runs, campaign)
    tables = merged_tables(latest, by_run, settings, published)
    capability, ranking = tables["capability"], tables["ranking"]
    ranking_columns = RANKING_COLUMNS + (ORIGIN_COLUMNS if "origin" in ranking else [])
    names = _PageNames()
    planned = capability.loc[capability["planned"] > 0]
    trend_pages: dict[str, dict[str, str]] = {}
    for system, benchmark in planned[["system", "benchmark"]].drop_duplicates().itertuples(index=False):
        trend_pages.setdefault(system, {})[benchmark] = names.trends(system, benchmark)
    systems = sorted(capability["system"].unique())
    common = {
        "campaign": campaign,
        "systems": [{"name": system, "page": names.system(system)} for system in systems],
        "benchmarks": sorted(capability["benchmark"].unique()),
        "metric_labels": {metric: metric_label(metric) for metric in metrics},
        # What a trend page shows first: speed is what an upgrade changes most often.
        "first_metric": FIRST_METRIC if FIRST_METRIC in metrics else metrics[0],
        "confidence": settings.confidence,
        "trend_pages": trend_pages,
        "detection": settings.detection,
    }
    latest_ids = [run["run_id"] for run in latest]
    sources = _json_rows(system_sources(latest))
    return _Site(
        runs, trends, latest_ids, tables, ranking_columns, systems, sources, names, trend_pages, metrics, common
    )


def _pages(site: _Site) -> Iterator[tuple[str, str, dict, dict]]:
    """(file name, template, page data, template context) of every page, index.html first."""
    trends, capability, latest_ids = site.trends, site.tables["capability"], site.latest_ids
    rankings = _rankings(site.tables["ranking"], site.ranking_columns, _contention(trends, latest_ids))
    mlperf_results = site.tables.get("mlperf_results")
    detectability = _detectability(trends, latest_ids)
    cannot_tell = [row for row in detectability if row["verdict"] == "cannot tell yet"]
    summaries = [run_summary(trends, run["run_id"]) for run in site.runs]
    alert_groups = [
        group for summary in summaries if summary["run_id"] in latest_ids for group in summary["alert_groups"]
    ]
    yield (
        "index.html",
        "index.html",
        {"rankings": rankings},
        {
            "sources": site.sources,
            "rankings": rankings,
            "matrix": _capability_matrix(capability),
            "alert_groups": alert_groups,
            "changes": _changes(trends.changes.loc[trends.changes["run_id"].isin(latest_ids)]),
            "history_changes": _history_changes(trends.history, latest_ids),
            "cannot_tell": cannot_tell,
            "judged_cells": len({tuple(row[key] for key in CELL_KEYS) for row in detectability}),
            "cannot_tell_cells": len({tuple(row[key] for key in CELL_KEYS) for row in cannot_tell}),
            "baseline_changes": _baseline_changes(trends, latest_ids),
            "mlperf_results": None if mlperf_results is None else _json_rows(mlperf_results),
        },
    )
    latest_first = trends.changes.sort_values("run_order", ascending=False, kind="stable")
    for system in site.systems:
        machine = machine_page(trends.canaries, trends.machine, system)
        yield (
            site.names.system(system),
            "system.html",
            {"relative_throughput": _relative_throughput(trends, system), "machine": machine},
            {
                "system": system,
                "machine": machine,
                "capability": _json_rows(capability.loc[capability["system"] == system]),
                "ranking": [row for entry in rankings for row in entry["rows"] if row["system"] == system],
                "changes": _changes(latest_first.loc[latest_first["system"] == system]),
                "history_changes": _history_changes(trends.history.loc[trends.history["system"] == system]),
            },
        )
    for name, system, benchmark, data in _trend_pages(trends, site.trend_pages, site.metrics):
        yield name, "trends.html", data, {"system": system, "benchmark": benchmark, "cells": data["cells"]}
    yield "runs.html", "runs.html", _runs_page_data(site.runs, trends), {"summaries": list(reversed(summaries))}


def build_site(
    out_dir: Path,
    manifests: Iterable[Mapping],
    records: Iterable[Mapping] | Mapping[str, Iterable[Mapping]],
    *,
    campaign: str | None = None,
    settings: AnalysisSettings | None = None,
    baseline: pd.DataFrame | None = None,
    published: Sequence[Mapping] | None = None,
) -> list[Path]:
    """Write the dashboard of ``campaign``'s runs into ``out_dir`` (replaced as a whole once the new
    site is complete) and return its pages (index.html first).

    ``manifests``: run manifests (runs of other campaigns are left out; ``campaign`` may be omitted
    when there is one); ``records``: flat with ``run.id``, or a mapping run id -> records;
    ``settings``: default from the latest run's campaign config (its metrics are the trend pages');
    ``baseline``: the current rows of the baseline store (mlcampaign.analysis.baseline.current), optional;
    ``published``: published MLPerf HPC runs (ResultsStore.published_results) shown beside the latest runs,
    marked as published.
    """
    site = _site(manifests, records, campaign, settings, baseline, published)
    environment = _environment()
    out_dir = Path(out_dir).resolve()
    if out_dir.parent == out_dir:
        raise HistoryError(f"{out_dir}: the root folder cannot be a dashboard's")
    refuse_unless_dashboard(out_dir)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        built = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=out_dir.parent))
    except OSError as error:
        raise HistoryError(f"{out_dir}: the dashboard cannot be written there ({error})") from None
    try:
        _install_assets(built)
        pages = []
        for name, template, data, context in _pages(site):
            html = environment.get_template(template).render(**site.common, **context, data=data)
            (built / name).write_text(html, encoding="utf-8")
            pages.append(out_dir / name)
        built_utc = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        files = [*ASSETS, *(page.name for page in pages)]
        marker = {"campaign": site.common["campaign"], "built_utc": built_utc, "files": files}
        (built / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
        refuse_unless_dashboard(out_dir)  # again: something may have been put there during the build
        replace_directory(built, out_dir)
    except OSError as error:
        raise HistoryError(
            f"{out_dir}: the dashboard cannot be written ({error}); the previous one, if any, is left as it was"
        ) from None
    finally:
        shutil.rmtree(built, ignore_errors=True)
    return pages


def build_from_store(
    store_url: str, campaign: str | None, out_dir: Path, baseline_dir: str | None = None
) -> list[Path]:
    """The static dashboard of ``campaign``'s runs in the store (all of them) in ``out_dir``; its pages."""
    with open_store(store_url, create=False) as store:
        runs = store.list_runs(campaign=campaign)
        if not runs:
            raise HistoryError(f"results store {store.url} holds no run{' of ' + campaign if campaign else ''}")
        run_ids = [run.run_id for run in runs]
        manifests = [store.manifest(run_id) for run_id in run_ids]
        records = store.records(run_ids)
        published = store.published_results()
    baseline = current(load_store(Path(baseline_dir))) if baseline_dir else None
    return build_site(Path(out_dir), manifests, records, campaign=campaign, baseline=baseline, published=published)
