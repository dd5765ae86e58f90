"""Rule entry point: every analysis table of the campaign from the plan and the trial records."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from mlcampaign.analysis.outputs import TABLES
from mlcampaign.analysis.tables import build_tables, table_outputs, write_tables
from mlcampaign.job.rule_log import rule_log
from mlcampaign.workflow.scopes import scope_records

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    plan, analysis = pd.DataFrame(snakemake.params.plan), snakemake.params.analysis
    scope = scope_records(plan, snakemake.params.trial_dirs, snakemake.input.records, snakemake.params.existing, print)
    tables = build_tables(
        scope.records,
        plan,
        snakemake.params.benchmarks,
        confidence=analysis["confidence"],
        bootstrap_resamples=analysis["bootstrap_resamples"],
        seed=snakemake.params.seed,
        unplanned=pd.DataFrame(snakemake.params.unplanned),
        known_outcomes=scope.known_outcomes,
        exclude_contended=analysis["exclude_contended"],
    )
    write_tables(tables, table_outputs(snakemake.output, TABLES))
    total = tables["summary"].iloc[-1]
    print(
        f"{len(scope.records)} records; planned {total.planned}, executed {total.executed}, ok {total.ok}, "
        f"failed {total.failed}, not run {total.not_run}, valid {total.valid}"
    )
