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
    result = run_snakemake(
        tmp_path, write_config(config), "--dry-run", "--printshellcmds", profile=profile, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    resources = trial_resources(result.stdout)
    return (resources if extra else resources[0]), result.stdout


def test_archer2_cpu_epcc_layout(tmp_path, write_config):
    resources, output = dry_run(tmp_path, write_config, "archer2", "archer2-cpu", "2x16", {"ARCHER2_ACCOUNT": "e123"})
    assert resources["nodes"] == "2"
    assert resources["tasks"] == "32"
    assert resources["cpus_per_task"] == "8"  # 128 cores / 16 ranks per node
    assert resources["mpi"] == "srun"
    assert resources["gpu"] == "0"
    assert resources["slurm_partition"] == "standard"
    assert resources["qos"] == "standard"
    assert resources["slurm_account"] == "e123"
    assert resources["runtime"] == "60"
    assert "srun --nodes=2 --ntasks=32 --ntasks-per-node=16 --cpus-per-task=8" in output


def test_archer2_gpu_four_mi210_per_trial(tmp_path, write_config):
    resources, output = dry_run(
        tmp_path, write_config, "archer2-gpu", "archer2-mi210", "1x4", {"ARCHER2_ACCOUNT": "e123"}
    )
    assert (resources["nodes"], resources["tasks"], resources["gpu"], resources["tasks_per_gpu"]) == (
        "1",
        "4",
        "4",
        "1",
    )
    assert resources["slurm_partition"] == "gpu"
    assert resources["slurm_account"] == "e123"
    assert "torch.distributed.run --standalone --nnodes=1 --nproc-per-node=4" in output


def test_cirrus_two_nodes_of_four_v100(tmp_path, write_config):
    resources, output = dry_run(tmp_path, write_config, "cirrus", "cirrus-v100", "2x4", {"CIRRUS_ACCOUNT": "ec42"})
    assert (resources["nodes"], resources["tasks"], resources["gpu"], resources["tasks_per_gpu"]) == (
        "2",
        "8",
        "8",
        "1",
    )
    assert resources["cpus_per_task"] == "10"  # 40 cores / 4 GPU processes per node
    assert resources["slurm_partition"] == "gpu"
    assert resources["qos"] == "gpu"
    assert resources["slurm_account"] == "ec42"
    assert resources["mem_mb"] == "384000"
    assert "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=10" in output


def test_archer2_epcc_layouts_in_one_campaign(tmp_path, write_config):
    resources, output = dry_run(
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
    assert "srun --nodes=4 --ntasks=32 --ntasks-per-node=8 --cpus-per-task=16" in output
