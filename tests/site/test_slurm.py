"""A campaign through the Slurm profile on a real single-node Slurm (../shared/tools/slurm-localhost).

Needs root (the tool installs and starts slurmctld, slurmd, munge, slurmdbd and MariaDB).
"""

import json
import re
import subprocess
import time

import pandas as pd
import pytest

from mlcampaign.records.files import read_record

from conftest import latest_run, run_snakemake

pytestmark = pytest.mark.integration


def sacct_jobs(job_ids):
    result = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "--format=JobID,State,Comment,NTasks,AllocCPUS"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line.split("|") for line in result.stdout.strip().splitlines()]
    return {row[0]: row[1:] for row in rows}


def test_campaign_runs_under_slurm_with_a_two_rank_srun_trial(slurm, tmp_path):
    config = {
        "campaign": "slurm-it",
        "seed": 3,
        "trials": 1,
        "systems": ["slurm-localhost"],
        "benchmarks": ["resnet50-synthetic"],
        "matrix": {"scales": ["1x1", "1x2"], "precisions": ["fp32"]},
        "benchmark_overrides": {
            "resnet50-synthetic": {
                "dataset": {
                    "name": "synthetic-slurm",
                    "source": {"options": {"train_per_class": 8, "val_per_class": 4, "image_size": 16}},
                },
                "model": {"options": {"image_size": 16}},
                "training": {"epochs_max": 2, "global_batch_size": 16, "warmup_steps": 2},
            }
        },
    }
    configfile = tmp_path / "campaign.yaml"
    configfile.write_text(json.dumps(config))
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = run_snakemake(tmp_path, configfile, profile="slurm-localhost", timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    # Only staging and trials are batch jobs: reading records and building tables run beside Snakemake.
    # This campaign's jobs only (their working directory): other jobs may have run meanwhile.
    submitted = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-S", started, "--format=Comment,WorkDir"],
        capture_output=True,
        text=True,
        check=True,
    )
    comments = [line.split("|")[0] for line in submitted.stdout.splitlines() if line.endswith(f"|{tmp_path}")]
    rules = {re.match(r"rule_(\w+?)(_wildcards_|$)", comment).group(1) for comment in comments}
    assert rules == {"stage_dataset", "trial"}

    results = latest_run(tmp_path, "slurm-it")
    table = pd.read_csv(results / "trials.csv")
    assert len(table) == 2
    assert (table["status"] == "ok").all(), table[["trial.cell", "failure.message"]].to_string()

    records = {path.parent.parent.name: read_record(path) for path in results.glob("trials/*/*/*/*/record.json")}
    assert set(records) == {"1x1-fp32", "1x2-fp32"}
    two_ranks = records["1x2-fp32"]
    assert two_ranks["distributed"]["world_size"] == 2
    assert two_ranks["distributed"]["launcher"] == "srun"
    assert two_ranks["distributed"]["weights_consistent"] is True

    # Every trial ran as a Slurm job that accounting knows, started by the Snakemake plugin.
    job_ids = [record["provenance"]["scheduler_job_id"] for record in records.values()]
    assert all(job_ids)
    accounting = sacct_jobs(job_ids)
    assert set(accounting) == set(job_ids)
    for state, comment, _, _ in accounting.values():
        assert state == "COMPLETED"
        assert "trial" in comment
    # The 2-rank trial's allocation held both ranks.
    assert accounting[two_ranks["provenance"]["scheduler_job_id"]][3] == "2"
