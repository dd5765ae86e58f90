"""The baseline store: the accepted per-trial results of each cell, with their history.

A site keeps the store under version control (``baselines/`` by default, the campaign config's
``regression.baseline_dir``): one CSV file per system, ``<store>/<system>.csv``, one row per
accepted ok trial of a cell (system x benchmark x cell; the cell id names scale, precision,
compression, framework and backend). Each row holds the trial's raw metric values (so tests can be
run against it later, not only means), where it came from (campaign, trial start/finish time, git
commit of the workflow, host, device models, package versions, dataset id) and which promotion put
it there (``baseline_id``, ``promoted_utc``, ``note``). Promoting a cell again does not delete its
earlier rows: they are marked superseded (``superseded_utc``, ``superseded_by``), so the file is
the cell's history. The regression check compares each cell's run with its current rows as a reference
run (mlcampaign.analysis.detection.reference_test, through mlcampaign.history.verdicts).

Command line (one command per promotion, after an accepted upgrade):

    mlcampaign baseline promote --campaign-dir results/<campaign>/runs/<run> [--cells PATTERN ...] [--note TEXT]
    mlcampaign baseline show [--history]
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from mlcampaign.analysis.frame import CELL_COLUMNS, CELL_KEYS
from mlcampaign.plan.campaign import TRIAL_KEYS
from mlcampaign.plan.metrics import COMPARABLE_METRICS
from mlcampaign.plan.runs import utc_now

DEFAULT_STORE = Path("baselines")
# Inside a campaign directory (results/<campaign>/): the analysed trials and the flattened records.
PLANNED_TRIALS = Path("analysis/tables/planned_trials.parquet")
RECORDS_TABLE = Path("trials.csv")

PROMOTION_COLUMNS = ["baseline_id", "campaign", "promoted_utc", "note", "superseded_utc", "superseded_by"]
CELL_DESCRIPTION = ["target_metric", "target_direction", "global_batch_size"]
# trials.csv column: store column.
PROVENANCE_COLUMNS = {
    "provenance.started_utc": "started_utc",
    "provenance.finished_utc": "finished_utc",
    "provenance.workflow_commit": "workflow_commit",
    "provenance.workflow_dirty": "workflow_dirty",
    "provenance.hostname": "hostname",
    "provenance.cpu_model": "cpu_model",
    "provenance.gpu_model": "gpu_model",
    "dataset.dataset_id": "dataset_id",
}
PACKAGES_PREFIX = "provenance.packages."
STORE_COLUMNS = [
    *PROMOTION_COLUMNS,
    *CELL_KEYS,
    *CELL_COLUMNS,
    *CELL_DESCRIPTION,
    "trial",
    "replicate",
    "seed",
    *COMPARABLE_METRICS,
    *PROVENANCE_COLUMNS.values(),
    "packages",
]
NUMERIC_COLUMNS = {"processes", "global_batch_size", "trial", "replicate", "seed", *COMPARABLE_METRICS}


class BaselineError(ValueError):
    """A promotion that cannot be done as asked (missing campaign outputs, unknown cells)."""


def store_path(store: Path, system: str) -> Path:
    return Path(store) / f"{system}.csv"


def read_store(paths: Iterable[Path]) -> pd.DataFrame:
    """Every row (current and superseded) of the given store files."""
    text = {column: "str" for column in STORE_COLUMNS if column not in NUMERIC_COLUMNS}
    frames = [pd.read_csv(path, dtype=text) for path in paths]
    frames = [frame for frame in frames if not frame.empty]
    if not frames:
        return pd.DataFrame(columns=STORE_COLUMNS).astype(text)
    # Files written before a metric was added lack its column: NaN there.
    return pd.concat(frames, ignore_index=True).reindex(columns=STORE_COLUMNS)


def load_store(store: Path) -> pd.DataFrame:
    """Every row of every system file in the store directory (none if it does not exist)."""
    return read_store(sorted(Path(store).glob("*.csv")))


def current(store_rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the accepted baseline: those not superseded."""
    return store_rows.loc[store_rows["superseded_utc"].isna()]


def campaign_samples(planned_trials: pd.DataFrame, records_table: pd.DataFrame) -> pd.DataFrame:
    """The ok trials of a campaign as store rows (without the promotion columns).

    ``planned_trials``: the campaign's planned_trials table (metrics as analysed: time to train
    only for trials that reached the target); ``records_table``: its trials.csv (provenance).
    """
    provenance = records_table.rename(columns={f"trial.{key}": key for key in TRIAL_KEYS})
    packages = [column for column in provenance.columns if column.startswith(PACKAGES_PREFIX)]
    provenance["packages"] = [
        json.dumps({name.removeprefix(PACKAGES_PREFIX): value for name, value in row.items() if pd.notna(value)})
        for row in provenance[packages].to_dict(orient="records")
    ]
    provenance = provenance.reindex(columns=[*TRIAL_KEYS, *PROVENANCE_COLUMNS, "packages"])
    provenance = provenance.rename(columns=PROVENANCE_COLUMNS)
    ok = planned_trials.loc[planned_trials["status"] == "ok"]
    samples = ok.merge(provenance, on=TRIAL_KEYS, how="left", validate="one_to_one")
    return samples[[column for column in STORE_COLUMNS if column not in PROMOTION_COLUMNS]]


def read_campaign(campaign_dir: Path) -> tuple[str, pd.DataFrame, list[str]]:
    """(campaign name, ok trials as store rows, ``system/benchmark/cell`` of the cells without an ok
    trial) of a finished campaign's directory."""
    campaign_dir = Path(campaign_dir)
    paths = {name: campaign_dir / name for name in (PLANNED_TRIALS, RECORDS_TABLE)}
    missing = [str(path) for path in paths.values() if not path.is_file()]
    if missing:
        raise BaselineError(
            f"{', '.join(missing)}: not found; run the whole campaign first "
            "(snakemake --profile <profile> --configfile <campaign>), which writes them"
        )
    records_table = pd.read_csv(paths[RECORDS_TABLE], low_memory=False)
    names = records_table["trial.campaign"].dropna().unique()
    if len(names) != 1:
        raise BaselineError(f"{paths[RECORDS_TABLE]}: key 'trial.campaign': expected one campaign, found {list(names)}")
    planned_trials = pd.read_parquet(paths[PLANNED_TRIALS])
    samples = campaign_samples(planned_trials, records_table)
    without_ok = planned_trials.drop_duplicates(CELL_KEYS).merge(
        samples[CELL_KEYS].drop_duplicates(), on=CELL_KEYS, how="left", indicator=True
    )
    without_ok = without_ok.loc[without_ok["_merge"] == "left_only"]
    return (
        str(names[0]),
        samples,
        sorted(without_ok["system"] + "/" + without_ok["benchmark"] + "/" + without_ok["cell"]),
    )


def select_cells(samples: pd.DataFrame, patterns: Sequence[str] | None) -> pd.DataFrame:
    """The samples whose ``system/benchmark/cell`` matches one of the shell ``patterns`` (all if
    none). A pattern that matches no cell is an error naming it and the cells there are."""
    if not patterns:
        return samples
    names = samples["system"] + "/" + samples["benchmark"] + "/" + samples["cell"]
    unmatched = [pattern for pattern in patterns if not any(fnmatch.fnmatchcase(n, pattern) for n in names.unique())]
    if unmatched:
        raise BaselineError(
            f"--cells {unmatched} match no cell with an ok trial; cells: {', '.join(sorted(names.unique()))}"
        )
    return samples.loc[names.map(lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns))]


def promote(
    store: Path, samples: pd.DataFrame, campaign: str, *, note: str = "", now: str | None = None
) -> pd.DataFrame:
    """Make ``samples`` (store rows of one campaign) the accepted baseline of their cells.

    The cells' current rows are marked superseded by this promotion; every other row is kept as
    it is. Each system file is rewritten atomically. Returns the promoted cells with their number
    of trials and how many earlier rows each superseded.
    """
    if samples.empty:
        raise BaselineError(f"campaign {campaign!r} has no ok trial to promote")
    now = now or utc_now()
    baseline_id = f"{campaign}@{now}"
    promoted = samples.assign(baseline_id=baseline_id, campaign=campaign, promoted_utc=now, note=note)
    promoted_cells = []
    for system, rows in promoted.groupby("system", sort=True):
        path = store_path(store, system)
        existing = read_store([path] if path.is_file() else [])
        cells = rows[CELL_KEYS].drop_duplicates().itertuples(index=False, name=None)
        replaced = pd.MultiIndex.from_frame(existing[CELL_KEYS]).isin(list(cells)) & existing["superseded_utc"].isna()
        existing.loc[replaced, ["superseded_utc", "superseded_by"]] = [now, baseline_id]
        _write_csv_atomic(pd.concat([existing, rows.reindex(columns=STORE_COLUMNS)], ignore_index=True), path)
        superseded = existing.loc[replaced].groupby(CELL_KEYS).size().rename("superseded_rows")
        counts = rows.groupby(CELL_KEYS).size().rename("trials").to_frame().join(superseded)
        promoted_cells.append(counts.fillna({"superseded_rows": 0}).astype({"superseded_rows": int}))
    return pd.concat(promoted_cells).reset_index().assign(baseline_id=baseline_id)


def _write_csv_atomic(table: pd.DataFrame, path: Path) -> None:
    """Write the CSV so that ``path`` is either the old or the complete new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    table.to_csv(temporary, index=False)
    os.replace(temporary, path)


def summary(store_rows: pd.DataFrame, history: bool) -> pd.DataFrame:
    """One row per cell and baseline (current ones only unless ``history``): trials, dates, and
    the median throughput and time to train."""
    rows = store_rows if history else current(store_rows)
    keys = [*CELL_KEYS, "baseline_id"]
    grouped = rows.groupby(keys, sort=True, dropna=False)
    table = grouped.agg(
        trials=("trial", "size"),
        promoted_utc=("promoted_utc", "first"),
        superseded_utc=("superseded_utc", "first"),
        note=("note", "first"),
    )
    medians = grouped[["throughput_samples_per_s", "time_to_train_s"]].median().add_prefix("median_")
    return table.join(medians).reset_index()
