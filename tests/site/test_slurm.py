"""A campaign through the Slurm profile on a real single-node Slurm (../shared/tools/slurm-localhost).

Needs root (the tool installs and starts slurmctld, slurmd, munge, slurmdbd and MariaDB).
"""

import re
import subprocess

import pandas as pd
import pytest

from mlcampaign.records.files import read_record

from conftest import latest_run

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


def test_campaign_runs_under_slurm_with_a_two_rank_srun_trial(slurm_campaign):
    """The session's campaign on Slurm (conftest.slurm_campaign): two trials each of a 1-rank and a 2-rank cell."""
    workdir, started = slurm_campaign
    # Only staging and trials are batch jobs: reading records and building tables run beside Snakemake.
    # This campaign's jobs only (their working directory): other jobs may have run meanwhile.
    submitted = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-S", started, "--format=Comment,WorkDir"],
        capture_output=True,
        text=True,
        check=True,
    )
    comments = [line.split("|")[0] for line in submitted.stdout.splitlines() if line.endswith(f"|{workdir}")]
    rules = {re.match(r"rule_(\w+?)(_wildcards_|$)", comment).group(1) for comment in comments}
    assert rules == {"stage_dataset", "trial"}

    results = latest_run(workdir, "slurm-it")
    table = pd.read_csv(results / "trials.csv")
    assert len(table) == 4
    assert (table["status"] == "ok").all(), table[["trial.cell", "failure.message"]].to_string()

    records = {
        str(path.parent.relative_to(results)): read_record(path) for path in results.glob("trials/*/*/*/*/record.json")
    }
    assert sorted(path.split("/")[-2] for path in records) == ["1x1-fp32"] * 2 + ["1x2-fp32"] * 2
    two_ranks = [record for path, record in records.items() if "/1x2-fp32/" in path]
    for record in two_ranks:
        assert record["distributed"]["world_size"] == 2
        assert record["distributed"]["launcher"] == "srun"
        assert record["distributed"]["weights_consistent"] is True

    # Every trial ran as a Slurm job that accounting knows, started by the Snakemake plugin.
    job_ids = [record["provenance"]["scheduler_job_id"] for record in records.values()]
    assert all(job_ids)
    accounting = sacct_jobs(job_ids)
    assert set(accounting) == set(job_ids)
    for state, comment, _, _ in accounting.values():
        assert state == "COMPLETED"
        assert "trial" in comment
    # Each 2-rank trial's allocation held both ranks.
    for record in two_ranks:
        assert accounting[record["provenance"]["scheduler_job_id"]][3] == "2"
