"""Rule entry point: the run's manifest and records into the results store, and the run's summary
(mlcampaign.history; python -m mlcampaign summary prints the same)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.history.bundle import ingest_run_directory
from mlcampaign.history.store import open_store
from mlcampaign.history.summary import run_summary_of
from mlcampaign.job.rule_log import rule_log
from mlcampaign.records.files import write_json_atomic

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    # The run's own workflow continues it (a re-run trial's record, a re-planned manifest: both kept), with
    # the records of the trials it planned only.
    trials = [Path(record).parent for record in snakemake.input.records]
    with open_store(snakemake.params.store) as store:
        result = ingest_run_directory(Path(snakemake.input.manifest).parent, store, trials)
        summary = run_summary_of(store, result.run_id, None)
    write_json_atomic(result.__dict__ | {"store": store.url}, snakemake.output.ingested)
    write_json_atomic(summary, snakemake.output.summary)
    print(json.dumps(result.__dict__))
    for warning in result.warnings:
        print(f"warning: {warning}")
    print(f"summary: {json.dumps(summary['trials'])}, changes {json.dumps(summary['counts'])}")
