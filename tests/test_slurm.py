"""A campaign through the Slurm profile on a real single-node Slurm (../shared/tools/slurm-localhost).

Needs root (the tool installs and starts slurmctld, slurmd, munge, slurmdbd and MariaDB).
"""

import json
import os
import subprocess

import pandas as pd
import pytest

from mlcampaign.record import read_record

from conftest import REPO, run_snakemake

pytestmark = pytest.mark.integration

TOOL = REPO.parent / "shared" / "tools" / "slurm-localhost"
SLURM_BASE = "/var/tmp/slurm-localhost"


@pytest.fixture(scope="module")
def slurm():
    if not (TOOL / "start-slurm.sh").is_file():
        pytest.skip(f"{TOOL}/start-slurm.sh not found (the shared test tools are not beside the checkout)")
    if os.geteuid() != 0:
        pytest.skip("starting a real Slurm needs root")
    # The tool writes its install log there before creating it.
    os.makedirs(SLURM_BASE, exist_ok=True)
    started = subprocess.run(
        ["bash", str(TOOL / "start-slurm.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"SLURM_BASE": SLURM_BASE},
    )
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]


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
    result = run_snakemake(tmp_path, configfile, profile="slurm-localhost", timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    results = tmp_path / "results" / "slurm-it"
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
