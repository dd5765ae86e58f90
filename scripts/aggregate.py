"""Rule entry point: every analysis table of the campaign from the plan and the trial records."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.outputs import TABLE_FORMATS, TABLES
from mlcampaign.analysis.tables import build_tables, write_tables
from mlcampaign.config import TRIAL_KEYS
from mlcampaign.record import read_record
from mlcampaign.scheduler import killed_trials

snakemake = globals()["snakemake"]
with open(snakemake.log[0], "w") as log:
    sys.stderr = log  # tracebacks into the log too
    # The analysis scope lists every planned record as input; the partial scope the existing ones.
    paths = list(snakemake.input.records) or list(snakemake.params.existing)
    records = [read_record(path) for path in paths]
    plan = pd.DataFrame(snakemake.params.plan)
    killed = None
    if not snakemake.input.records:
        # Partial scope: a planned trial without a record may have had its job killed by Slurm.
        recorded = {tuple(record["trial"][key] for key in TRIAL_KEYS) for record in records}
        planned = plan[TRIAL_KEYS].itertuples(index=False, name=None)
        killed = pd.DataFrame(killed_trials([key for key in planned if key not in recorded]))
    analysis = snakemake.params.analysis
    tables = build_tables(
        records,
        plan,
        snakemake.params.benchmarks,
        confidence=analysis["confidence"],
        bootstrap_resamples=analysis["bootstrap_resamples"],
        seed=snakemake.params.seed,
        unplanned=pd.DataFrame(snakemake.params.unplanned),
        killed=killed,
    )
    write_tables(tables, {name: {fmt: snakemake.output[f"{name}_{fmt}"] for fmt in TABLE_FORMATS} for name in TABLES})
    total = tables["summary"].iloc[-1]
    print(
        f"{len(paths)} records; planned {total.planned}, executed {total.executed}, ok {total.ok}, "
        f"failed {total.failed}, not run {total.not_run}, valid {total.valid}",
        file=log,
    )
