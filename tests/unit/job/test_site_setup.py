"""Site set-up as system data (config/systems/*.yaml, docs/sites.md): a new system at an existing site
is one file, planned with the site's profile; its container runs the trial and is named in the record.
"""

import copy
import json
import os
import stat
import sys
import textwrap

import pytest
import yaml

from mlcampaign.data.manifest import ID_FILE
from mlcampaign.data.staging import stage_into
from mlcampaign.job import supervisor
from mlcampaign.job.launch import launch_argv
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.config_files import ConfigError
from mlcampaign.records.files import read_record
from mlcampaign.records.provenance import SOURCE_TREE

from conftest import REPO, run_snakemake, trial_resources, workflow_copy

# A system at ARCHER2 that the checkout does not have: the high-memory CPU nodes (partition and QoS
# highmem in the ARCHER2 user guide), with every kind of site set-up a system file can hold. The
# image path and the venv are made up: a dry run submits nothing and starts nothing.
HIGHMEM = {
    "site": "archer2",
    "description": "ARCHER2 high-memory CPU nodes (test system)",
    "executor": "slurm",
    "slurm": {
        "partition": "highmem",
        "qos": "highmem",
        "account_variable": "ARCHER2_ACCOUNT",
        "constraint": "HighMem",
        "sbatch_flags": ["--exclusive", "--cpu-freq=2250000"],
        "memory_per_node_mb": 500000,
    },
    "launcher": "srun",
    "launcher_flags": ["--hint=nomultithread", "--distribution=block:block"],
    "environment": {
        "modules": ["PrgEnv-gnu"],
        "setup": ["source /work/z01/z01/auser/venv/bin/activate"],
        "variables": {"OMP_NUM_THREADS": "$MLCAMPAIGN_THREADS", "SRUN_CPUS_PER_TASK": "$SLURM_CPUS_PER_TASK"},
    },
    "container": {"image": "/work/z01/shared/mlcampaign.sif", "bind": ["/work"]},
    "device": "cpu",
    "accelerator": "2x AMD EPYC 7742 (128 cores)",
    "nodes_max": 584,
    "cores_per_node": 128,
    "devices_per_node": 1,
    "memory_per_node_mb": 512000,
    "peak_flops_per_device": {"fp32": 9.216e12},
    "peak_source": "as config/systems/archer2-cpu.yaml",
}

CAMPAIGN = {
    "campaign": "archer2-highmem",
    "seed": 1,
    "trials": 2,
    "systems": ["archer2-highmem"],
    "benchmarks": ["resnet50-synthetic"],
    "matrix": {"scales": ["2x16"], "precisions": ["fp32"]},
}


@pytest.mark.integration
def test_a_new_system_at_an_existing_site_is_one_file(tmp_path, monkeypatch):
    """The file alone (no profile, no Python): the ARCHER2 profile plans its trials with its partition,
    QoS, account, constraint, sbatch flags and memory, and each runs the site set-up and container."""
    snakefile = workflow_copy(tmp_path / "workflow", {"archer2-highmem": HIGHMEM})
    configfile = tmp_path / "campaign.yaml"
    configfile.write_text(yaml.safe_dump(CAMPAIGN))
    result = run_snakemake(
        tmp_path / "work",
        configfile,
        "--dry-run",
        "--snakefile",
        str(snakefile),
        profile="archer2",
        timeout=300,
        env={"ARCHER2_ACCOUNT": "z01"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(result.stdout)
    resources = trial_resources(result.stdout)
    assert len(resources) == 2
    for job in resources:
        assert (job["slurm_partition"], job["qos"], job["slurm_account"]) == ("highmem", "highmem", "z01")
        assert (job["constraint"], job["slurm_extra"], job["mem_mb"]) == (
            "HighMem",
            "--exclusive --cpu-freq=2250000",
            "500000",
        )
        assert (job["nodes"], job["tasks"], job["cpus_per_task"], job["mpi"]) == ("2", "32", "8", "srun")
    # The profile packs the cell's two trials into one allocation.
    assert result.stdout.count("Group job cell_archer2-highmem_resnet50-synthetic_2x16-fp32 ") == 1

    # The command each trial's supervisor runs, from the spec the job is planned with (the rule's
    # params: Campaign.trial_spec): the set-up shell, srun with the site's flags, the container per rank.
    monkeypatch.setenv("ARCHER2_ACCOUNT", "z01")
    campaign = load_campaign(yaml.safe_load(configfile.read_text()), tmp_path / "workflow" / "config")
    spec = campaign.trial_spec(next(campaign.trials()), "run", "archer2")
    argv = launch_argv(spec["system"], spec["trial"], "/work/z01/z01/auser/venv/bin/python")
    print(argv)
    assert argv[:2] == ["/bin/bash", "-c"]
    assert argv[2].splitlines() == [
        "set -e",
        "export MLCAMPAIGN_THREADS=8",
        "module load PrgEnv-gnu",
        "source /work/z01/z01/auser/venv/bin/activate",
        'export OMP_NUM_THREADS="$MLCAMPAIGN_THREADS"',
        'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"',
        "export MLCAMPAIGN_CONTAINER_IMAGE=/work/z01/shared/mlcampaign.sif",
        'exec "$@"',
    ]
    assert argv[4:] == [
        *("srun", "--nodes=2", "--ntasks=32", "--ntasks-per-node=16", "--cpus-per-task=8", "--kill-on-bad-exit=1"),
        *("--hint=nomultithread", "--distribution=block:block"),
        *("apptainer", "exec", "--bind", str(SOURCE_TREE), "--bind", "/work", "/work/z01/shared/mlcampaign.sif"),
        "python3",
    ]


def test_where_a_job_queues_is_not_part_of_the_trial_spec_but_what_runs_is(tmp_path, monkeypatch):
    """Scheduler placement (the slurm block) changes no trial's spec, so it re-runs nothing (params
    trigger); the set-up, the launcher flags and the container change what runs, and so the spec."""
    monkeypatch.setenv("ARCHER2_ACCOUNT", "z01")

    def spec_with(**changes):
        workflow_dir = tmp_path / f"w{len(list(tmp_path.iterdir()))}"
        workflow_copy(workflow_dir, {"archer2-highmem": copy.deepcopy(HIGHMEM) | changes})
        campaign = load_campaign(copy.deepcopy(CAMPAIGN), workflow_dir / "config")
        return campaign.trial_spec(next(campaign.trials()), "run", "archer2")

    base = spec_with()
    assert "slurm" not in base["system"] and "site" not in base["system"]
    queued_elsewhere = {"partition": "standard", "qos": "long", "constraint": "x", "sbatch_flags": ["--exclusive"]}
    assert spec_with(slurm=HIGHMEM["slurm"] | queued_elsewhere) == base
    assert spec_with(slurm=HIGHMEM["slurm"] | {"memory_per_node_mb": 0}) == base
    assert spec_with(launcher_flags=["--hint=nomultithread"]) != base
    assert spec_with(container={"image": "/work/z01/shared/other.sif"}) != base
    assert spec_with(environment={"modules": ["PrgEnv-cray"]}) != base


def test_an_sbatch_flag_the_plugin_sets_itself_stops_planning_naming_file_and_key(tmp_path):
    flags = {"slurm": HIGHMEM["slurm"] | {"sbatch_flags": ["--exclusive", "--partition=standard"]}}
    workflow_copy(tmp_path / "w", {"archer2-highmem": HIGHMEM | flags})
    with pytest.raises(ConfigError) as error:
        load_campaign(copy.deepcopy(CAMPAIGN), tmp_path / "w" / "config")
    message = str(error.value)
    assert "archer2-highmem.yaml: key 'slurm.sbatch_flags.1': value '--partition=standard'" in message
    assert "slurm.partition" in message


# -- the container path, through a real trial launch -----------------------------------------------
# A STAND-IN for `apptainer` (Apptainer cannot be installed here): it records its arguments, then runs
# the command after the image on the host, as `apptainer exec [options] <image> <command>` runs it in
# the image. It sets none of the variables the real runtime sets (APPTAINER_CONTAINER): the record
# names the image through MLCAMPAIGN_CONTAINER_IMAGE, which the launch exports for that reason.
STAND_IN_APPTAINER = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    with open(os.environ["STAND_IN_APPTAINER_LOG"], "a") as log:
        log.write(json.dumps(sys.argv[1:]) + "\\n")
    args = sys.argv[1:]
    assert args.pop(0) == "exec", args
    with_value = {{"--bind", "-B", "--env", "--home", "--pwd"}}
    while args[0].startswith("-"):
        args.pop(0) if args[0] not in with_value else (args.pop(0), args.pop(0))
    image = args.pop(0)
    os.execvp(args[0], args)
    """
)


@pytest.fixture(scope="module")
def tiny_trial(tmp_path_factory):
    """The spec of a tiny local 1x1 ResNet-50 trial on synthetic images and its staged dataset's id file."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config |= {"benchmarks": ["resnet50-synthetic"], "trials": 1}
    config["benchmark_overrides"] = {
        "resnet50-synthetic": {
            "dataset": {
                "name": "synthetic-container",
                "source": {"options": {"num_classes": 2, "train_per_class": 4, "val_per_class": 2, "image_size": 8}},
            },
            "model": {"options": {"image_size": 8}},
            "training": {"epochs_max": 1, "global_batch_size": 4, "warmup_steps": 0},
        }
    }
    campaign = load_campaign(config, REPO / "config")
    spec = campaign.trial_spec(next(campaign.trials()), "container-run", "local")
    staged = tmp_path_factory.mktemp("dataset")
    stage_into(spec["benchmark"]["dataset"], staged)
    return spec, staged / ID_FILE


@pytest.mark.integration
def test_a_trial_in_a_container_names_its_image_in_the_record(tmp_path, monkeypatch, tiny_trial):
    """A real trial launched by the supervisor through the system's container, with a STAND-IN for
    apptainer (see STAND_IN_APPTAINER): the launch runs the set-up, then `apptainer exec`, and the
    record's provenance.software.container names the image."""
    spec, dataset_id = tiny_trial
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    apptainer = bin_dir / "apptainer"
    apptainer.write_text(STAND_IN_APPTAINER.format(python=sys.executable))
    apptainer.chmod(apptainer.stat().st_mode | stat.S_IXUSR)
    image = "/images/mlcampaign-2026.12.sif"
    spec = copy.deepcopy(spec)
    # The interpreter "inside the image" is this environment's (the stand-in runs on the host).
    spec["system"] |= {
        "container": {"image": image, "bind": [str(tmp_path)], "python": sys.executable},
        "environment": {"variables": {"OMP_NUM_THREADS": "$MLCAMPAIGN_THREADS"}},
    }
    monkeypatch.setattr(supervisor, "LOCAL_LOCK", tmp_path / "local-trials.lock")
    trial_dir = tmp_path / "trial"
    environ = dict(os.environ) | {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "STAND_IN_APPTAINER_LOG": str(tmp_path / "apptainer.log"),
    }
    status = supervisor.supervise(
        spec,
        dataset_id,
        trial_dir / "record.json",
        trial_dir / "mllog.txt",
        tmp_path / "trial.log",
        None,
        environ=environ,
    )
    log = (tmp_path / "trial.log").read_text()
    assert status == 0, log
    record = read_record(trial_dir / "record.json")
    assert record["status"] == "ok", log
    container = record["provenance"]["software"]["container"]
    assert container["image"] == image
    assert "MLCAMPAIGN_CONTAINER_IMAGE" in container["runtime"]
    (call,) = [json.loads(line) for line in (tmp_path / "apptainer.log").read_text().splitlines()]
    assert call[:5] == ["exec", "--bind", str(SOURCE_TREE), "--bind", str(tmp_path)]
    assert call[5:7] == [image, sys.executable]
    assert call[7:9] == ["-m", "mlcampaign.trial"]
