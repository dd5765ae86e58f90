"""Rule entry point: every analysis table of the campaign from the plan and the trial records."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.outputs import TABLES
from mlcampaign.analysis.tables import build_tables, table_outputs, write_tables
from mlcampaign.job.rule_log import rule_log
from mlcampaign.job.slurm_accounting import killed_trials
from mlcampaign.plan.campaign import TRIAL_KEYS
from mlcampaign.records.files import RecordError, read_record

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    plan = pd.DataFrame(snakemake.params.plan)
    trial_dirs = dict(
        zip(plan[TRIAL_KEYS].itertuples(index=False, name=None), snakemake.params.trial_dirs, strict=True)
    )
    known = None
    if snakemake.input.records:
        # The analysis scope: every planned trial's record; one that cannot be read stops it, named.
        records = [read_record(path) for path in snakemake.input.records]
    else:
        # The partial scope: the records that exist. One that cannot be read shows as a failure of its
        # trial, saying so; a trial without a record may have had its job killed by Slurm.
        existing, records, unreadable = set(snakemake.params.existing), [], {}
        for key, directory in trial_dirs.items():
            if f"{directory}/record.json" in existing:
                try:
                    records.append(read_record(f"{directory}/record.json"))
                except RecordError as error:
                    print(f"skipped: {error}")
                    unreadable[key] = {"failure_reason": "error", "failure_message": f"unreadable record: {error}"}
        recorded = {tuple(record["trial"][key] for key in TRIAL_KEYS) for record in records} | set(unreadable)
        killed = killed_trials({key: path for key, path in trial_dirs.items() if key not in recorded})
        known = pd.DataFrame(
            [dict(zip(TRIAL_KEYS, key, strict=True)) | outcome for key, outcome in unreadable.items()] + killed
        )
    analysis = snakemake.params.analysis
    tables = build_tables(
        records,
        plan,
        snakemake.params.benchmarks,
        confidence=analysis["confidence"],
        bootstrap_resamples=analysis["bootstrap_resamples"],
        seed=snakemake.params.seed,
        unplanned=pd.DataFrame(snakemake.params.unplanned),
        known_outcomes=known,
        exclude_contended=analysis["exclude_contended"],
    )
    write_tables(tables, table_outputs(snakemake.output, TABLES))
    total = tables["summary"].iloc[-1]
    print(
        f"{len(records)} records; planned {total.planned}, executed {total.executed}, ok {total.ok}, "
        f"failed {total.failed}, not run {total.not_run}, valid {total.valid}"
    )
