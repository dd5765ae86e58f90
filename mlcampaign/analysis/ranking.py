"""Valid FLOPS ranking per benchmark, with the uncertainty of every row and of the order itself.

An entry is one cell (system at one scale and precision), as HPC AI500 lists each configuration
separately. Entries are ranked by their mean Valid FLOPS over ok trials (rank 1 = highest), and
by Valid FLOPS per watt (``rank_per_watt``) where the energy was measured. The
trials of every entry are resampled independently (the CellBootstrap of the cells); in each
resample the entries are ranked again, and ``p_rank`` is the fraction of resamples in which an
entry holds the rank it has in the table. Planned cells without an ok trial are listed after the
ranked entries with an empty rank and their capability status, so no cell is dropped.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.stats

from mlcampaign.analysis.frame import CELL_COLUMNS, CELL_KEYS
from mlcampaign.analysis.stats import CellBootstrap

METRIC = "valid_flops_per_s"


def ranking_table(
    ok_trials: pd.DataFrame,
    capability: pd.DataFrame,
    bootstrap: CellBootstrap,
    confidence: float,
    published: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Rows ordered by benchmark, then rank; ``bootstrap`` must cover METRIC per cell. ``published``:
    entries ranked with the cells, whose trials are among ``ok_trials`` (mlcampaign.analysis.mlperf_results:
    published MLPerf HPC runs, status "published", with its ORIGIN_COLUMNS; the cells' origin is "measured")."""
    entries = (
        ok_trials.dropna(subset=[METRIC])
        .groupby(CELL_KEYS, sort=True)
        .agg(
            n=(METRIC, "size"),
            valid_flops_per_s=(METRIC, "mean"),
            flops_per_s=("flops_per_s", "mean"),
            penalty=("penalty", "mean"),
            achieved_quality=("achieved_quality", "mean"),
            flops_counting=("flops_counting", "first"),
            valid_flops_per_watt=("valid_flops_per_watt", "mean"),
            energy_to_train_j=("energy_to_train_j", "mean"),
        )
    )
    entries["rank_per_watt"] = entries.groupby(level="benchmark")["valid_flops_per_watt"].rank(
        ascending=False, method="min"
    )
    entries = entries.join(bootstrap.interval(METRIC, confidence).reindex(entries.index))
    entries["rank"] = entries.groupby(level="benchmark")[METRIC].rank(ascending=False, method="min")
    entries["p_rank"] = np.nan
    samples = pd.DataFrame(bootstrap.samples(METRIC), index=bootstrap.keys).reindex(entries.index)
    for _, rows in entries.groupby(level="benchmark", sort=True):
        resampled = scipy.stats.rankdata(-samples.loc[rows.index].to_numpy(), axis=0, method="min", nan_policy="omit")
        entries.loc[rows.index, "p_rank"] = np.mean(resampled == rows["rank"].to_numpy()[:, None], axis=1)
    cells = capability[[*CELL_KEYS, *CELL_COLUMNS, "status"]]
    if published is not None:
        cells = pd.concat([cells.assign(origin="measured"), published], ignore_index=True)
    table = cells.merge(entries.reset_index(), on=CELL_KEYS, how="left")
    table["rank"] = table["rank"].astype("Int64")
    table["rank_per_watt"] = table["rank_per_watt"].astype("Int64")
    table["n"] = table["n"].fillna(0).astype(int)
    table = table.sort_values(["benchmark", "rank", "system", "cell"], na_position="last")
    order = ["benchmark", "rank", "system", *CELL_COLUMNS, "cell", "status", "n"]
    return table[order + [c for c in table.columns if c not in order]].reset_index(drop=True)
