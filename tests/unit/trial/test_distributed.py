"""Data-parallel training: launcher environments, the campaign's parallel dimensions, and a real 2-process run."""

import copy
import json

import pytest

from mlcampaign.data.manifest import ID_FILE
from mlcampaign.data.staging import stage_into
from mlcampaign.job.launch import launch_argv
from mlcampaign.job.supervisor import supervise
from mlcampaign.plan.campaign import Scale, cell_id
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.config_files import ConfigError
from mlcampaign.plan.hyperparameters import batch_sizes, scaled_lr
from mlcampaign.records.files import read_record
from mlcampaign.trial import distributed
from mlcampaign.trial.distributed import (
    DistributedSetupError,
    MissingModuleError,
    check_world_size,
    detect_layout,
    expand_hostlist,
    require_module,
)
from mlcampaign.trial.torch.collectives import AllreduceTimer

from conftest import REPO


# -- launcher environments ------------------------------------------------------------------------
def test_torchrun_environment():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    env |= {"MASTER_ADDR": "node7", "MASTER_PORT": "29611", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4"}
    layout = detect_layout(env)
    assert (layout.rank, layout.world_size, layout.local_rank, layout.local_world_size) == (3, 8, 1, 2)
    assert (layout.master_addr, layout.master_port, layout.source) == ("node7", 29611, "torchrun")


def test_srun_environment_takes_rank_0_from_the_step_node_list(monkeypatch):
    monkeypatch.setattr(distributed.shutil, "which", lambda name: None)  # no Slurm here: parse the list in Python
    env = {
        "SLURM_PROCID": "5",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_NTASKS": "64",  # the job's, not the step's
        "SLURM_LOCALID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_STEP_NODELIST": "gpu[017-018]",
        "SLURM_JOB_NODELIST": "gpu[001-018]",
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_ID": "2",
    }
    layout = detect_layout(env)
    assert (layout.rank, layout.world_size, layout.local_rank, layout.local_world_size) == (5, 8, 1, 4)
    assert layout.master_addr == "gpu017"
    assert layout.source == "srun"
    assert 20000 <= layout.master_port < 40000
    assert detect_layout(env | {"SLURM_STEP_ID": "3"}).master_port != layout.master_port  # concurrent steps differ


def test_horovodrun_environment_on_one_node_uses_loopback():
    env = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"}
    env |= {"HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1", "HOROVOD_CONTROLLER": "gloo"}
    layout = detect_layout(env | {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"})  # horovodrun inside a step
    assert (layout.rank, layout.world_size, layout.local_rank, layout.local_world_size) == (1, 2, 1, 2)
    assert (layout.master_addr, layout.source) == ("127.0.0.1", "horovodrun")


def test_slurm_batch_script_is_one_process():
    layout = detect_layout({"SLURM_PROCID": "0", "SLURM_NTASKS": "32", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert (layout.world_size, layout.source) == (1, "single process")


def test_openmpi_environment_on_one_node_uses_loopback():
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    layout = detect_layout(env)
    assert (layout.rank, layout.world_size, layout.local_rank, layout.master_addr) == (1, 4, 1, "127.0.0.1")
    assert layout.source == "openmpi"


def test_openmpi_under_slurm_uses_the_first_node(monkeypatch):
    monkeypatch.setattr(distributed.shutil, "which", lambda name: None)
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "32", "OMPI_COMM_WORLD_LOCAL_SIZE": "16"}
    assert detect_layout(env | {"SLURM_JOB_NODELIST": "nid[001002,001005]"}).master_addr == "nid001002"
    assert detect_layout(env | {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "4000"}).master_port == 4000


def test_mpi_across_nodes_without_an_address_is_a_clear_error():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "32", "OMPI_COMM_WORLD_LOCAL_SIZE": "16"}
    with pytest.raises(DistributedSetupError, match="set MASTER_ADDR"):
        detect_layout(env)


def test_mpich_pmi_environment():
    env = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"}
    layout = detect_layout(env)
    assert (layout.rank, layout.world_size, layout.local_rank, layout.source) == (2, 3, 2, "pmi")


def test_no_launcher_is_a_single_process():
    layout = detect_layout({})
    assert (layout.rank, layout.world_size, layout.is_main) == (0, 1, True)


def test_bad_value_names_the_variable():
    with pytest.raises(DistributedSetupError, match="PMI_SIZE='four'"):
        detect_layout({"PMI_RANK": "0", "PMI_SIZE": "four"})


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[1-2],login,b[9-10]", ["a1", "a2", "login", "b9", "b10"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ],
)
def test_slurm_node_lists_expand_like_scontrol(nodelist, hosts):
    assert expand_hostlist(nodelist) == hosts


def test_launcher_starting_another_world_size_is_named():
    with pytest.raises(DistributedSetupError, match=r"plans 2 processes but the launcher started 1 \(read from the"):
        check_world_size(detect_layout({}), 2)


def test_missing_backend_module_is_named():
    with pytest.raises(MissingModuleError, match=r"backend 'x' needs the Python module 'mlcampaign_absent\.torch'"):
        require_module("mlcampaign_absent.torch", "backend 'x'")


def test_allreduce_timer_splits_hidden_and_exposed_communication():
    timer = AllreduceTimer(lambda state, bucket: None, __import__("torch").device("cpu"))
    # Three buckets: two overlap each other and backward; the last launches when backward ends (t=5).
    timer.intervals = [(1.0, 3.0), (2.0, 4.0), (5.0, 5.5)]
    exposed, in_flight = timer.take_step()
    assert exposed == pytest.approx(0.5)  # after the last launch
    assert in_flight == pytest.approx(3.5)  # union [1, 4] + [5, 5.5]
    assert timer.take_step() == (0.0, 0.0)


# -- the campaign's parallel dimensions ---------------------------------------------------------------
CONFIG_DIR = REPO / "config"


def load(config):
    return load_campaign(config, CONFIG_DIR, source="campaign.yaml")


def with_matrix(campaign: dict, **matrix) -> dict:
    config = copy.deepcopy(campaign)
    config["matrix"] |= matrix
    return config


def test_default_cells_keep_their_names_and_new_dimensions_extend_them():
    assert cell_id(Scale(1, 1), "fp32", "none", "torch", "native") == "1x1-fp32"
    assert cell_id(Scale(1, 2), "bf16", "fp16", "torch", "native") == "1x2-bf16-grad_fp16"
    assert cell_id(Scale(2, 4), "fp32", "none", "tensorflow", "horovod") == "2x4-fp32-tensorflow-horovod"


def test_compression_is_planned_only_where_there_is_an_all_reduce(default_campaign):
    config = with_matrix(default_campaign, scales=["1x1", "1x2"], compressions=["none", "bf16"])
    matrix = load(config).trial_matrix()
    cells = set(matrix.cell)
    assert cells == {"1x1-fp32", "1x2-fp32", "1x2-fp32-grad_bf16"}
    assert set(matrix[matrix.cell == "1x2-fp32-grad_bf16"].compression) == {"bf16"}


def test_batch_semantics():
    strong = {"batch_scaling": "strong", "global_batch_size": 32}
    weak = {"batch_scaling": "weak", "local_batch_size": 8}
    assert batch_sizes(strong, 4) == (32, 8)
    assert batch_sizes(weak, 4) == (32, 8)
    assert batch_sizes(weak, 16) == (128, 8)
    with pytest.raises(ValueError, match="not divisible by 3 processes"):
        batch_sizes(strong, 3)


def test_learning_rate_scaling_rules():
    def training(rule):
        return {"optimizer": {"lr": 0.1}, "lr_scaling": {"rule": rule, "base_batch_size": 64}}

    assert scaled_lr(training("none"), 256) == pytest.approx(0.1)
    assert scaled_lr(training("linear"), 256) == pytest.approx(0.4)
    assert scaled_lr(training("sqrt"), 256) == pytest.approx(0.2)


def test_weak_scaling_override_switches_batch_semantics(default_campaign):
    weak = {"training": {"batch_scaling": "weak", "local_batch_size": 4, "global_batch_size": None}}
    config = with_matrix(default_campaign, scales=["1x1", "1x2"])
    config["benchmark_overrides"] = {"resnet50-digits": weak}
    campaign = load(config)
    assert batch_sizes(campaign.benchmarks["resnet50-digits"]["training"], 2) == (8, 4)


def test_horovod_ranks_on_the_local_system_are_planned_for_horovodrun(default_campaign):
    campaign = load(with_matrix(default_campaign, scales=["1x2"], backends=["horovod"]))
    rows = list(campaign.trials())
    assert {row["cell"] for row in rows} == {"1x2-fp32-horovod"}
    for row in rows:
        argv = launch_argv(campaign.systems["local-cpu"], row, "python")
        assert argv[:5] == ["python", "-m", "horovod.runner.launch", "-np", "2"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {
                "benchmark_overrides": {
                    "resnet50-digits": {"training": {"batch_scaling": "weak", "local_batch_size": 4}}
                }
            },
            "resnet50-digits.yaml with campaign.yaml benchmark_overrides.resnet50-digits: key "
            "'training.global_batch_size': value 32 contradicts batch_scaling 'weak'",
        ),
        (
            {"benchmark_overrides": {"resnet50-digits": {"training": {"lr_scaling": {"rule": "linear"}}}}},
            "key 'training.lr_scaling.base_batch_size': missing (required)",
        ),
        (
            {
                "matrix": {"scales": ["1x2"]},
                "benchmark_overrides": {"resnet50-digits": {"training": {"global_batch_size": 9}}},
            },
            "key 'training.global_batch_size': at scale '1x2': global_batch_size 9 is not divisible by 2 processes",
        ),
        ({"matrix": {"scales": ["1x3"]}}, "3 processes x 1 threads_per_process exceed cores_per_node 2"),
        ({"matrix": {"scales": ["2x1"]}}, "needs 2 nodes but system 'local-cpu' has nodes_max 1"),
        ({"matrix": {"backends": ["horovod"], "compressions": ["bf16"]}}, "Horovod compresses to fp16 only"),
        ({"matrix": {"frameworks": ["tensorflow"]}}, "keras.applications.ResNet50 has bottleneck width 64"),
    ],
)
def test_plans_that_cannot_run_stop_before_any_job(default_campaign, change, expected):
    config = copy.deepcopy(default_campaign)
    for key, value in change.items():
        config[key] = config[key] | value if isinstance(config.get(key), dict) else value
    with pytest.raises(ConfigError) as error:
        load(config)
    assert expected in str(error.value)


# -- a real run: two processes with gloo, through the system's launcher ---------------------------------
TINY = {
    "resnet50-synthetic": {
        "dataset": {
            "name": "synthetic-dp",
            "source": {"options": {"num_classes": 2, "train_per_class": 8, "val_per_class": 3, "image_size": 16}},
        },
        "model": {"options": {"image_size": 16, "num_classes": 2}},
        "training": {"epochs_max": 2, "global_batch_size": 8, "warmup_steps": 1, "channels_last": True},
        "target": {"value": 1.01},  # unreachable: every epoch runs
    }
}


def trial_spec(default_campaign, **matrix) -> tuple[dict, dict]:
    config = with_matrix(default_campaign, **matrix) | {
        "benchmarks": ["resnet50-synthetic"],
        "trials": 1,
        "benchmark_overrides": TINY,
    }
    campaign = load(config)
    spec = campaign.trial_spec(next(campaign.trials()), "test-run", "local")
    return spec, spec["benchmark"]["dataset"]


def test_two_gloo_processes_train_one_model(tmp_path, default_campaign):
    """A 1x2 bf16 trial with fp16 gradient compression, as the trial job runs it: the supervisor starts
    the system's launcher (torch.distributed.run), which starts two ranks of the trial script."""
    spec, dataset = trial_spec(default_campaign, scales=["1x2"], precisions=["bf16"], compressions=["fp16"])
    stage_into(dataset, tmp_path / "dataset")
    paths = {"record": tmp_path / "out" / "record.json", "mllog": tmp_path / "out" / "mllog.txt"}
    log = tmp_path / "trial.log"
    status = supervise(spec, tmp_path / "dataset" / ID_FILE, paths["record"], paths["mllog"], log, None)
    assert status == 0, log.read_text()[-5000:]
    record = read_record(paths["record"])
    assert record["status"] == "ok", record["failure"]
    assert record["trial"]["cell"] == "1x2-bf16-grad_fp16-channels_last"  # TINY trains channels-last
    parallel = record["distributed"]
    assert (parallel["world_size"], parallel["communication"], parallel["rank_environment"]) == (2, "gloo", "torchrun")
    assert [rank["rank"] for rank in parallel["ranks"]] == [0, 1]
    assert parallel["weights_consistent"] is True
    assert len({rank["weights_sha256"] for rank in parallel["ranks"]}) == 1
    metrics = record["metrics"]
    assert metrics["communication_s"] > 0 and metrics["compute_s"] > 0 and metrics["data_loading_s"] > 0
    assert metrics["allreduce_in_flight_s"] >= metrics["communication_s"]
    assert metrics["communication_method"].startswith("DDP communication hook timing")
    assert metrics["samples_trained"] == 2 * 16  # 2 epochs of 2 global batches of 8
    assert (record["benchmark"]["global_batch_size"], record["benchmark"]["local_batch_size"]) == (8, 4)
    step_time = metrics["data_loading_s"] + metrics["compute_s"] + metrics["communication_s"]
    assert metrics["throughput_samples_per_s"] == pytest.approx((32 - 8) / step_time)
    assert metrics["samples_evaluated"] == 2 * 6  # each epoch's evaluation covers the validation split once
    # The canaries of two ranks: the all-reduce in the trial's own gloo group among them.
    collective = record["canaries"]["allreduce_bus_bytes_per_s"]
    assert collective["value"] > 0 and collective["unit"] == "B/s"
    assert "torch.distributed gloo over 2 processes" in collective["method"]
    assert "2 processes measuring at once" in record["canaries"]["memory_triad_bytes_per_s"]["method"]
    # Only rank 0 logs: every MLPerf event appears once.
    keys = [json.loads(line.split(":::MLLOG", 1)[1])["key"] for line in paths["mllog"].read_text().splitlines()]
    assert keys.count("run_start") == 1 and keys.count("eval_accuracy") == 2
    # Beside the record: the spec it ran (no spec travels on a command line) and its job.
    assert sorted(p.name for p in paths["record"].parent.iterdir()) == [
        "job.json",
        "mllog.txt",
        "record.json",
        "spec.json",
    ]
