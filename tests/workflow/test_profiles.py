"""Site profiles: a dry run shows the scheduler resources each trial job will ask for."""

import pytest

from conftest import run_snakemake, trial_resources

pytestmark = pytest.mark.integration


def dry_run(tmp_path, write_config, profile, system, scale, env, **extra):
    config = {
        "campaign": f"dry-{profile}",
        "seed": 1,
        "trials": 1,
        "systems": [system],
        "benchmarks": ["resnet50-digits"],
        "matrix": {"scales": [scale], "precisions": ["fp32"]},
    } | extra
    result = run_snakemake(tmp_path, write_config(config), "--dry-run", profile=profile, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    resources = trial_resources(result.stdout)
    return (resources if extra else resources[0]), result.stdout


def test_archer2_cpu_epcc_layout(tmp_path, write_config):
    resources, _ = dry_run(tmp_path, write_config, "archer2", "archer2-cpu", "2x16", {"ARCHER2_ACCOUNT": "e123"})
    assert resources["nodes"] == "2"
    assert resources["tasks"] == "32"
    assert resources["cpus_per_task"] == "8"  # 128 cores / 16 ranks per node
    assert resources["mpi"] == "srun"
    assert resources["gpu"] == "0"
    assert resources["slurm_partition"] == "standard"
    assert resources["qos"] == "standard"
    assert resources["slurm_account"] == "e123"
    assert resources["runtime"] == "60"


def test_archer2_gpu_trials_share_the_site_profile_with_their_own_partition(tmp_path, write_config):
    resources, _ = dry_run(tmp_path, write_config, "archer2", "archer2-mi210", "1x4", {"ARCHER2_ACCOUNT": "e123"})
    # The GPU nodes refuse task counts in sbatch (slurm.tasks_in_sbatch false): tasks_per_gpu 0 names none,
    # cpus_per_task -1 neither; srun starts the 4 ranks inside the job.
    assert (resources["nodes"], resources["tasks"], resources["gpu"], resources["tasks_per_gpu"]) == (
        "1",
        "4",
        "4",
        "0",
    )
    assert (resources["cpus_per_task"], resources["mpi"]) == ("-1", "")
    # From the system file: a whole node's 4 GPUs need QoS gpu-exc and --exclusive.
    assert (resources["slurm_partition"], resources["qos"]) == ("gpu", "gpu-exc")
    assert resources["slurm_extra"] == "--exclusive"
    assert resources["slurm_account"] == "e123"


def test_cirrus_two_nodes_of_four_v100(tmp_path, write_config):
    resources, _ = dry_run(tmp_path, write_config, "cirrus", "cirrus-v100", "2x4", {"CIRRUS_ACCOUNT": "ec42"})
    # GPUs per node as --gres=gpu:4 (slurm.gpu_option gres), no task counts in sbatch (tasks_in_sbatch
    # false: tasks_per_gpu 0, cpus_per_task -1); the launcher's srun starts the 8 ranks in the job.
    assert (resources["nodes"], resources["tasks"], resources["gres"], resources["tasks_per_gpu"]) == (
        "2",
        "8",
        "gpu:4",
        "0",
    )
    assert (resources["gpu"], resources["cpus_per_task"]) == ("0", "-1")
    assert resources["slurm_partition"] == "gpu"
    assert resources["qos"] == "gpu"
    assert resources["slurm_account"] == "ec42"
    assert (resources["mem_mb"], resources["slurm_extra"]) == ("0", "--exclusive")  # the whole nodes, no --mem


def test_archer2_epcc_layouts_in_one_campaign(tmp_path, write_config):
    resources, _ = dry_run(
        tmp_path,
        write_config,
        "archer2",
        "archer2-cpu",
        "2x16",
        {"ARCHER2_ACCOUNT": "e123"},
        benchmarks=["resnet50-digits", "deepcam"],
        matrix_overrides={"deepcam": {"scales": ["4x8"]}},
    )
    layouts = sorted((r["nodes"], r["tasks"], r["cpus_per_task"]) for r in resources)
    assert layouts == [("2", "32", "8"), ("4", "32", "16")]


def test_an_unset_budget_variable_stops_planning_naming_it(tmp_path, write_config):
    config = {
        "campaign": "dry-no-account",
        "seed": 1,
        "trials": 1,
        "systems": ["archer2-cpu"],
        "benchmarks": ["resnet50-digits"],
        "matrix": {"scales": ["1x16"], "precisions": ["fp32"]},
    }
    result = run_snakemake(
        tmp_path, write_config(config), "--dry-run", profile="archer2", timeout=300, env={"ARCHER2_ACCOUNT": ""}
    )
    assert result.returncode != 0
    assert (
        "config/systems/archer2-cpu.yaml: key 'slurm.account_variable': value 'ARCHER2_ACCOUNT': the environment "
        "variable is not set; export ARCHER2_ACCOUNT=<budget code>" in result.stdout + result.stderr
    )


def _rule_resources(output: str, rule: str) -> list[dict]:
    blocks = output.split(f"rule {rule}:")[1:]
    return [
        dict(item.split("=", 1) for item in block.split("resources: ", 1)[1].splitlines()[0].split(", "))
        for block in blocks
    ]


def test_staging_is_sized_from_its_work(tmp_path, write_config):
    """A full-size CosmoFlow split (2048 + 512 universes of 4 x 128^3) gets hours, the 1797 digits
    the minimum (the trials table is a local rule: tests/site/test_slurm.py sees no batch job of it)."""
    config = {
        "campaign": "dry-staging",
        "seed": 1,
        "trials": 1,
        "systems": ["cirrus-v100"],
        "benchmarks": ["resnet50-digits", "cosmoflow"],
        "matrix": {"scales": ["1x4"], "precisions": ["fp32"]},
    }
    result = run_snakemake(
        tmp_path, write_config(config), "--dry-run", profile="cirrus", timeout=300, env={"CIRRUS_ACCOUNT": "ec1"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    staging = {int(r["runtime"]): int(r["mem_mb"]) for r in _rule_resources(result.stdout, "stage_dataset")}
    digits_min, cosmoflow_min = sorted(staging)
    assert digits_min == 10 and cosmoflow_min > 120  # ~2560 x 8.4 M values at ~0.75 us, x 2
    assert staging[cosmoflow_min] > staging[digits_min]  # a 128^3 x 4 cube in memory, not an 8 x 8 image
