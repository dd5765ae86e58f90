"""The campaign tables over a selection of runs: one site's run, or the latest run at every site.

A run (one execution of a campaign at one site, docs in HISTORY: ``run.json`` manifest + records)
plans every trial of its campaign, also those of other sites' systems (``at_site`` false). The
merged plan is the union of the selected runs' plans: each trial is taken from the run whose site
ran it, or kept from any run's plan when no selected run ran it, so that a system whose site has
not reported yet is in the capability matrix as "not run". The tables are those of
mlcampaign.analysis.tables.build_tables, computed over that plan and the selected runs' records.

Records come as a flat iterable whose records name their run (``record["run"]["id"]``), or as a
mapping run id -> records (the records then need no ``run`` block). Records of runs that are not
among the given manifests are ignored: a caller may pass every record of a store with a selection
of its runs. Records come in attempt order, as the results store returns them: within a run, a
trial's current outcome is its last record, its run folder's ``record.json`` (a failed trial re-run
keeps its failure record in the history, superseded). Never the latest ``provenance.finished_utc``:
the clocks of the nodes that wrote the attempts may disagree.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from mlcampaign.analysis.detection import DetectionSettings
from mlcampaign.analysis.frame import campaign_frame, planned_frame, trial_frame
from mlcampaign.analysis.mlperf_results import PublishedResults
from mlcampaign.analysis.tables import build_tables
from mlcampaign.analysis.valid_flops import counting_of
from mlcampaign.plan.campaign import TRIAL_KEYS, UNPLANNED_COLUMNS
from mlcampaign.plan.config_files import schema_default
from mlcampaign.plan.names import name_problem, shown

MANIFEST_KEYS = ("run_id", "campaign", "site", "started_utc", "plan", "benchmarks")
PLAN_KEYS = (
    *TRIAL_KEYS,
    *("seed", "nodes", "tasks_per_node", "processes", "precision", "compression", "framework", "backend", "at_site"),
)
_PLAN_KEY_SET = frozenset(PLAN_KEYS)
# Columns the trial frames of several runs gain: which run each planned trial belongs to.
RUN_COLUMNS = ["run_id", "site", "started_utc"]
# What a cell's trends judge where a run's config has no regression.metrics: the campaign schema's default.
DEFAULT_METRICS = tuple(schema_default("campaign", "regression", "metrics"))


class HistoryError(ValueError):
    """Runs or records that cannot be analysed together; the message names the run, key and value."""


@dataclasses.dataclass(frozen=True)
class AnalysisSettings:
    """How the tables and trends are computed: the campaign config's ``analysis``, ``seed`` and
    ``regression`` blocks (as validated, defaults filled in; keys that older runs' configs lack take
    their defaults)."""

    confidence: float
    bootstrap_resamples: int
    seed: int
    detection: DetectionSettings = dataclasses.field(default_factory=DetectionSettings)
    # The metrics whose trends are judged (regression.metrics).
    metrics: tuple[str, ...] = DEFAULT_METRICS
    exclude_contended: bool = False
    # Contended trials in the trends and change detection (regression.keep_contended): left out by default.
    keep_contended: bool = False

    @classmethod
    def from_manifest(cls, manifest: Mapping) -> AnalysisSettings:
        config = manifest.get("campaign_config")
        try:
            analysis, regression = config["analysis"], config["regression"]
            return cls(
                confidence=analysis["confidence"],
                bootstrap_resamples=analysis["bootstrap_resamples"],
                seed=config["seed"],
                detection=DetectionSettings.from_config(regression),
                metrics=tuple(regression.get("metrics", DEFAULT_METRICS)),
                exclude_contended=analysis.get("exclude_contended", False),
                keep_contended=regression.get("keep_contended", False),
            )
        except (KeyError, TypeError) as error:
            raise HistoryError(
                f"run {manifest.get('run_id')!r}: campaign_config lacks {error} (analysis.confidence, "
                "analysis.bootstrap_resamples, seed and the regression block are needed)"
            ) from error


def parse_utc(text: str, where: str) -> datetime.datetime:
    """An ISO 8601 time as an aware datetime (naive times are taken as UTC); ``where`` names the
    field for the error."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError) as error:
        raise HistoryError(f"{where}: {text!r} is not an ISO 8601 time") from error
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def run_started(manifest: Mapping) -> datetime.datetime:
    """The run's ``started_utc`` as an aware datetime."""
    return parse_utc(manifest["started_utc"], f"run {manifest['run_id']!r}: started_utc")


def runs_in_order(manifests: Iterable[Mapping]) -> list[Mapping]:
    """The manifests checked (keys, run id, unique ids, start time, plan rows) and sorted by start
    time, then run id."""
    manifests = list(manifests)
    seen = set()
    for manifest in manifests:
        missing = [key for key in MANIFEST_KEYS if key not in manifest]
        if missing:
            raise HistoryError(f"run manifest {manifest.get('run_id', '<without run_id>')!r} lacks keys {missing}")
        run_id = manifest["run_id"]
        problem = name_problem(run_id)
        if problem is not None:
            raise HistoryError(f"run_id {shown(run_id)} does not match the rule of names: {problem}")
        if run_id in seen:
            raise HistoryError(f"run_id {run_id!r} appears in two manifests")
        seen.add(run_id)
        for position, row in enumerate(manifest["plan"]):
            if not row.keys() >= _PLAN_KEY_SET:
                lacking = [key for key in PLAN_KEYS if key not in row]
                raise HistoryError(f"run {run_id!r}: plan row {position} lacks keys {lacking}")
    return sorted(manifests, key=lambda manifest: (run_started(manifest), manifest["run_id"]))


def latest_runs(manifests: Iterable[Mapping], campaign: str) -> list[Mapping]:
    """The latest run of ``campaign`` at every site, in start order."""
    runs = [manifest for manifest in runs_in_order(manifests) if manifest["campaign"] == campaign]
    if not runs:
        campaigns = sorted({manifest["campaign"] for manifest in manifests})
        raise HistoryError(f"campaign {campaign!r} has no run; campaigns with runs: {campaigns}")
    latest = {manifest["site"]: manifest for manifest in runs}  # later runs overwrite earlier ones
    return runs_in_order(latest.values())


def runs_by_id(manifests: Iterable[Mapping], run_ids: Sequence[str]) -> list[Mapping]:
    """The runs named by ``run_ids``, in start order."""
    by_id = {manifest["run_id"]: manifest for manifest in runs_in_order(manifests)}
    unknown = [run_id for run_id in run_ids if run_id not in by_id]
    if unknown:
        raise HistoryError(f"unknown run id(s) {unknown}; runs: {sorted(by_id)}")
    return runs_in_order(by_id[run_id] for run_id in dict.fromkeys(run_ids))


def _trial_key(record: Mapping) -> tuple:
    trial = record["trial"]
    return tuple(trial[key] for key in TRIAL_KEYS)


def current_records(records: Iterable[Mapping]) -> list[Mapping]:
    """The current record of each trial key: its last one in ``records``, which are in attempt order
    (mlcampaign.history.store.ResultsStore.records)."""
    return list({_trial_key(record): record for record in records}.values())


def records_by_run(
    manifests: Iterable[Mapping], records: Iterable[Mapping] | Mapping[str, Iterable[Mapping]]
) -> dict[str, list[Mapping]]:
    """The current records (``current_records``) of each run of ``manifests``, by run id.

    ``records``: a flat iterable of records that carry ``run.id``, or a mapping run id -> records.
    """
    # In the manifests' order (a set's order changes with each process' string hashing).
    grouped: dict[str, list[Mapping]] = {manifest["run_id"]: [] for manifest in manifests}
    if isinstance(records, Mapping):
        for run_id, run_records in records.items():
            for record in run_records:
                named = (record.get("run") or {}).get("id", run_id)
                if named != run_id:
                    where = f"record of trial {_trial_key(record)} under run {run_id!r}"
                    raise HistoryError(f"{where} has run.id {named!r}")
                if run_id in grouped:
                    grouped[run_id].append(record)
    else:
        for record in records:
            run_id = (record.get("run") or {}).get("id")
            if run_id is None:
                raise HistoryError(
                    f"record of trial {_trial_key(record)} has no run.id; pass a mapping run id -> records instead"
                )
            if run_id in grouped:
                grouped[run_id].append(record)
    return {run_id: current_records(run_records) for run_id, run_records in grouped.items()}


def merged_plan(manifests: Sequence[Mapping]) -> pd.DataFrame:
    """The union of the runs' plans, one row per trial key, with ``run_id``: the run that ran the
    trial (missing where no selected run did). Two runs that both ran a trial are an error."""
    frames = []
    for manifest in manifests:
        plan = pd.DataFrame(manifest["plan"], columns=list(PLAN_KEYS))
        frames.append(plan.assign(run_id=manifest["run_id"], started=run_started(manifest)))
    plan = pd.concat(frames, ignore_index=True)
    plan["at_site"] = plan["at_site"].astype(bool)
    ran = plan.loc[plan["at_site"]]
    twice = ran.loc[ran.duplicated(TRIAL_KEYS, keep=False)]
    if len(twice):
        first = twice.iloc[0]
        runs = sorted(twice.loc[(twice[TRIAL_KEYS] == first[TRIAL_KEYS]).all(axis=1), "run_id"])
        raise HistoryError(
            f"runs {runs} all ran trial {tuple(first[TRIAL_KEYS])} ({len(twice)} trial rows in all): a merged "
            "analysis takes one run per trial; select one run per site (latest_runs) or runs of different sites"
        )
    # Trials no selected run ran: the latest run's plan row stands for them.
    others = plan.loc[~plan["at_site"]].sort_values("started").drop_duplicates(TRIAL_KEYS, keep="last")
    others = others.merge(ran[TRIAL_KEYS], on=TRIAL_KEYS, how="left", indicator=True)
    others = others.loc[others["_merge"] == "left_only"].drop(columns="_merge").assign(run_id=None)
    merged = pd.concat([ran, others], ignore_index=True).drop(columns=["at_site", "started"])
    return merged.sort_values(TRIAL_KEYS).reset_index(drop=True)


def merged_benchmarks(manifests: Sequence[Mapping]) -> dict[str, Mapping]:
    """The benchmark configs of the runs; runs that disagree on a benchmark's Valid FLOPS penalty
    (``valid_flops.exponent`` or ``cap``) or on what it counts (``valid_flops.counting``) cannot be
    ranked together and are an error."""
    benchmarks: dict[str, Mapping] = {}
    sources: dict[str, str] = {}
    for manifest in manifests:
        for name, config in manifest["benchmarks"].items():
            if "valid_flops" not in config:
                raise HistoryError(f"run {manifest['run_id']!r}: benchmarks.{name} lacks valid_flops")
            if name in benchmarks:
                before, after = benchmarks[name]["valid_flops"], config["valid_flops"]
                for key in ("exponent", "cap"):
                    if before.get(key) != after.get(key):
                        raise HistoryError(
                            f"benchmarks.{name}.valid_flops.{key}: {before.get(key)!r} in run {sources[name]!r}, "
                            f"{after.get(key)!r} in run {manifest['run_id']!r}"
                        )
                if counting_of(before) != counting_of(after):
                    raise HistoryError(
                        f"benchmarks.{name}.valid_flops.counting: {counting_of(before)!r} in run {sources[name]!r}, "
                        f"{counting_of(after)!r} in run {manifest['run_id']!r}"
                    )
            benchmarks[name], sources[name] = config, manifest["run_id"]
    return benchmarks


def merged_unplanned(manifests: Sequence[Mapping]) -> pd.DataFrame | None:
    """The (system, benchmark) pairs the runs' campaign does not plan, once each (None if none)."""
    rows = [row for manifest in manifests for row in manifest.get("unplanned", [])]
    if not rows:
        return None
    return pd.DataFrame(rows, columns=UNPLANNED_COLUMNS).drop_duplicates(["system", "benchmark", "cell"])


def check_one_campaign(manifests: Sequence[Mapping]) -> str:
    """The one campaign of the runs (their tables are only comparable within one campaign)."""
    campaigns = sorted({manifest["campaign"] for manifest in manifests})
    if len(campaigns) != 1:
        raise HistoryError(f"the runs belong to campaigns {campaigns}: select runs of one campaign")
    return campaigns[0]


def merged_tables(
    runs: Sequence[Mapping],
    records: Iterable[Mapping] | Mapping[str, Iterable[Mapping]],
    settings: AnalysisSettings,
    published: Sequence[Mapping] | None = None,
) -> dict[str, pd.DataFrame]:
    """Every table of build_tables over the selected ``runs`` (one campaign; e.g. ``latest_runs``
    or ``runs_by_id``) and their current records: an ARCHER2 + Cirrus + EIDF ranking from three
    sites' runs. Trials no selected run ran are "not run". ``published``: published MLPerf HPC runs
    (ResultsStore.published_results) ranked beside the cells and listed in the ``mlperf_results`` table
    (mlcampaign.analysis.mlperf_results); None or empty: none."""
    runs = runs_in_order(runs)
    if not runs:
        raise HistoryError("no run selected")
    check_one_campaign(runs)
    plan = merged_plan(runs)
    by_run = records_by_run(runs, records)
    # Only each trial's own run's record: a stray record of another run must not stand in for it.
    keys = plan[TRIAL_KEYS].itertuples(index=False, name=None)
    responsible = dict(zip(keys, plan["run_id"], strict=True))
    selected = [
        record
        for run_id, run_records in by_run.items()
        for record in run_records
        if responsible.get(_trial_key(record)) == run_id
    ]
    return build_tables(
        selected,
        plan.drop(columns="run_id"),
        merged_benchmarks(runs),
        confidence=settings.confidence,
        bootstrap_resamples=settings.bootstrap_resamples,
        seed=settings.seed,
        unplanned=merged_unplanned(runs),
        exclude_contended=settings.exclude_contended,
        published=PublishedResults(published, merged_system_devices(runs)) if published else None,
    )


def merged_system_devices(manifests: Sequence[Mapping]) -> dict[str, str]:
    """The device of each system of the runs' configs ("cpu", "cuda", "rocm", ...)."""
    return {
        name: config.get("device") for manifest in manifests for name, config in manifest.get("systems", {}).items()
    }


def system_sources(runs: Sequence[Mapping]) -> pd.DataFrame:
    """Which selected run each planned system's results come from (run_id, site, started_utc;
    missing for a system no selected run ran), one row per system."""
    plan = merged_plan(runs_in_order(runs))
    sources = plan.groupby("system", sort=True)["run_id"].first().reset_index()
    runs_table = pd.DataFrame([{key: manifest[key] for key in RUN_COLUMNS} for manifest in runs])
    return sources.merge(runs_table, on="run_id", how="left")


def trials_by_run(
    runs: Sequence[Mapping], records: Iterable[Mapping] | Mapping[str, Iterable[Mapping]]
) -> pd.DataFrame:
    """The planned_trials table (mlcampaign.analysis.frame.campaign_frame) of each run's own trials
    (``at_site``) with its current records, all runs stacked, with RUN_COLUMNS and ``run_order``
    (0 for the earliest run). What the trends and the run summaries are computed from. The runs
    must agree on each benchmark's Valid FLOPS penalty (merged_benchmarks)."""
    runs = runs_in_order(runs)
    if not runs:
        raise HistoryError("no run given")
    by_run = records_by_run(runs, records)
    plan_rows, plan_orders, run_records, record_orders = [], [], [], []
    for order, manifest in enumerate(runs):
        rows = [row for row in manifest["plan"] if row["at_site"]]
        plan_rows += rows
        plan_orders += [order] * len(rows)
        run_records += by_run[manifest["run_id"]]
        record_orders += [order] * len(by_run[manifest["run_id"]])
    planned = planned_frame(pd.DataFrame(plan_rows, columns=list(PLAN_KEYS)))
    trials = trial_frame(run_records)
    # campaign_frame joins plan and records on the trial keys: shifting each run's trial numbers by
    # its own offset keeps the runs apart, so that one call serves every run (one call per run
    # costs ~40 ms of pandas overhead, 4 s for a year of weekly runs at two sites).
    stride = 1 + max(
        [row["trial"] for row in plan_rows] + [record["trial"]["trial"] for record in run_records], default=0
    )
    planned["trial"] += stride * pd.Series(plan_orders, dtype="int64", index=planned.index)
    trials["trial"] += stride * pd.Series(record_orders, dtype="int64", index=trials.index)
    frame = campaign_frame(planned, trials, merged_benchmarks(runs))
    frame["run_order"] = frame["trial"] // stride
    frame["trial"] = frame["trial"] % stride
    labels = pd.DataFrame([{key: manifest[key] for key in RUN_COLUMNS} for manifest in runs])
    return frame.join(labels, on="run_order")
