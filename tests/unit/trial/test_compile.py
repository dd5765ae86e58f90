"""torch.compile as a benchmark setting: its own cells, refused where it cannot run, compiled in MLPerf init
(before run_start, on synthetic inputs) and timed apart, leaving no trace in the training itself.

The trials here compile with torch.compile's ``eager`` backend: dynamo captures the graph and runs it
with the same operators in the same order as the eager model, so a compiled trial must end with
bitwise the same weights as the eager one, which checks that the warm-up changed nothing (weights,
BatchNorm statistics, dropout's random numbers, gradients). Inductor itself (C++ code generation, a
minute cold on 2 cores) is measured by bench/compile_speedup.py, not here.
"""

import json
import time
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from mlcampaign.data.manifest import ID_FILE
from mlcampaign.data.staging import stage_into
from mlcampaign.job.supervisor import supervise
from mlcampaign.plan.campaign import Scale, cell_id
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.config_files import ConfigError
from mlcampaign.records.files import read_record
from mlcampaign.trial.distributed import detect_layout
from mlcampaign.trial.protocol import run_trial
from mlcampaign.trial.torch import onednn_bf16 as precision
from mlcampaign.trial.torch.trial import TorchTrial

from conftest import REPO, repo_system, workflow_copy

# CosmoFlow at 8^3 with 2 and 4 filters: its 3-D convolutions, pooling and dropout in a trial of a second.
TINY_COSMOFLOW = {
    "model": {"options": {"input_size": 8, "base_filters": 2, "n_conv_layers": 2, "fc1_size": 8, "fc2_size": 8}},
    "dataset": {
        "name": "cosmoflow-unit-8",
        "source": {"options": {"seed": 0, "train_samples": 16, "val_samples": 4, "size": 8}},
    },
    "training": {"epochs_max": 2, "global_batch_size": 4, "eval_batch_size": 4, "warmup_steps": 1},
}
EAGER_BACKEND = {"enabled": True, "backend": "eager"}


def _campaign(benchmark: str = "cosmoflow", override: dict | None = None, **changes):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config |= {"benchmarks": [benchmark], "trials": 1} | changes
    config["benchmark_overrides"] = {benchmark: override or {}}
    return load_campaign(config, REPO / "config")


def _tiny_cosmoflow(compile_setting: dict | None = None, channels_last: bool = False, **matrix) -> dict:
    override = json.loads(json.dumps(TINY_COSMOFLOW))
    override["training"]["channels_last"] = channels_last
    if compile_setting is not None:
        override["training"]["compile"] = compile_setting
    campaign = _campaign(override=override, matrix={"scales": ["1x1"], "precisions": ["fp32"]} | matrix)
    spec = campaign.trial_spec(next(campaign.trials()), "test-run", "local")
    spec["system"] = spec["system"] | {"threads_per_process": 1}  # a tiny model gains nothing from two
    return spec


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test's trial compiles as a trial process does, from nothing (dynamo recompiles the model's code
    for each model instance only up to its cache limit, then silently runs it eager)."""
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("cosmoflow-unit")
    stage_into(_tiny_cosmoflow()["benchmark"]["dataset"], root)
    return root / ID_FILE


def _run(spec, dataset_id, out):
    out.mkdir(parents=True, exist_ok=True)
    return run_trial(spec, dataset_id, out / "record.json", out / "mllog.txt")


# -- cells and planning ----------------------------------------------------------------------------
def test_eager_cells_keep_their_ids_and_compiled_cells_get_their_own():
    assert cell_id(Scale(1, 2), "bf16", "fp16", "torch", "native") == "1x2-bf16-grad_fp16"
    assert cell_id(Scale(1, 1), "fp32", "none", "torch", "native", None) == "1x1-fp32"
    inductor = {"enabled": True, "backend": "inductor", "mode": "max-autotune"}
    assert cell_id(Scale(1, 1), "fp32", "none", "torch", "native", inductor) == "1x1-fp32-compile_max_autotune"
    eager = {"enabled": True, "backend": "eager", "mode": "default"}
    assert cell_id(Scale(2, 4), "bf16", "none", "torch", "native", eager) == "2x4-bf16-compile_eager_default"
    # The default campaign plans exactly the cells it did; a compiled benchmark plans others.
    assert {trial["cell"] for trial in _campaign().trials()} == {"1x1-fp32"}
    assert {trial["cell"] for trial in _campaign(override={"training": {"compile": {"enabled": False}}}).trials()} == {
        "1x1-fp32"
    }
    compiled = _campaign(override={"training": {"compile": {"enabled": True}}})
    assert {trial["cell"] for trial in compiled.trials()} == {"1x1-fp32-compile_default"}


def test_channels_last_torch_cells_get_their_own_ids_and_keras_cells_do_not():
    assert cell_id(Scale(1, 1), "fp32", "none", "torch", "native", None, channels_last=True) == "1x1-fp32-channels_last"
    inductor = {"enabled": True, "backend": "inductor", "mode": "default"}
    compiled_channels_last = cell_id(Scale(1, 2), "bf16", "none", "torch", "native", inductor, True)
    assert compiled_channels_last == "1x2-bf16-channels_last-compile_default"
    # Keras convolutions are channels-last whichever the setting: one cell either way.
    assert cell_id(Scale(1, 1), "fp32", "none", "tensorflow", "native", None, True) == "1x1-fp32-tensorflow"
    matrix = {"scales": ["1x1"], "precisions": ["fp32"], "frameworks": ["torch", "tensorflow"]}
    planned = _campaign(override={"training": {"channels_last": True}}, matrix=matrix)
    assert {trial["cell"] for trial in planned.trials()} == {"1x1-fp32-channels_last", "1x1-fp32-tensorflow"}


@pytest.mark.parametrize(
    "setting, problem",
    [
        ({"enabled": True, "mode": "fastest"}, "key 'training.compile.mode': value 'fastest'"),
        ({"mode": "default"}, "key 'training.compile.enabled': missing"),
        ({"enabled": True, "backend": "in ductor"}, "key 'training.compile.backend': value 'in ductor'"),
        ({"enabled": "yes"}, "key 'training.compile.enabled': value 'yes'"),
    ],
)
def test_bad_compile_settings_are_refused_naming_file_key_and_value(setting, problem):
    with pytest.raises(ConfigError, match=r"benchmark_overrides\.cosmoflow") as error:
        _campaign(override={"training": {"compile": setting}})
    assert problem in str(error.value)


def test_tensorflow_cells_refuse_compile_when_planning():
    tensorflow = {"scales": ["1x1"], "precisions": ["fp32"], "frameworks": ["torch", "tensorflow"]}
    _campaign(matrix=tensorflow)  # eager: both frameworks plan
    with pytest.raises(ConfigError) as error:
        _campaign(override={"training": {"compile": {"enabled": True}}}, matrix=tensorflow)
    message = str(error.value)
    assert "key 'matrix.frameworks': value 'tensorflow'" in message
    assert "training.compile" in message and "torch.compile" in message


# -- the compiled trial ----------------------------------------------------------------------------
def test_compiled_trial_compiles_before_run_start_and_trains_exactly_as_the_eager_one(tiny_dataset, tmp_path, capfd):
    eager = _run(_tiny_cosmoflow(), tiny_dataset, tmp_path / "eager")
    compiled = _run(_tiny_cosmoflow(EAGER_BACKEND), tiny_dataset, tmp_path / "compiled")
    assert eager["status"] == compiled["status"] == "ok", (eager["failure"], compiled["failure"])
    assert compiled["trial"]["cell"] == "1x1-fp32-compile_eager_default" and eager["trial"]["cell"] == "1x1-fp32"
    # The warm-up (dropout included) left weights, statistics and random numbers as they were.
    assert compiled["distributed"]["ranks"][0]["weights_sha256"] == eager["distributed"]["ranks"][0]["weights_sha256"]
    assert compiled["metrics"]["quality_history"] == eager["metrics"]["quality_history"]
    assert compiled["metrics"]["samples_trained"] == eager["metrics"]["samples_trained"]
    assert eager["metrics"]["compile_s"] is None and eager["benchmark"]["compile"] is None
    assert compiled["metrics"]["compile_s"] > 0
    assert compiled["benchmark"]["compile"]["backend"] == "eager"
    assert compiled["benchmark"]["compile"]["mode"] == "default"
    assert compiled["benchmark"]["compile"]["cache_dir"]
    # All compilation happened in the warm-up: none inside the timed training.
    assert "torch.compile compiled" not in capfd.readouterr().err


def _mllog(path) -> dict[str, int]:
    """MLPerf log key -> its first event's time (ms since the epoch)."""
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in Path(path).read_text().splitlines()]
    return {event["key"]: event["time_ms"] for event in reversed(events)}


def test_compilation_lies_in_mlperf_init_before_run_start(tiny_dataset, tmp_path, monkeypatch):
    compiling = {}
    original = TorchTrial._compile

    def timed_compile(self, setting, shape):
        compiling["logged_before"] = set(_mllog(tmp_path / "mllog.txt"))
        compiling["start_ms"] = time.time() * 1e3
        original(self, setting, shape)
        compiling["end_ms"] = time.time() * 1e3

    monkeypatch.setattr(TorchTrial, "_compile", timed_compile)
    record = _run(_tiny_cosmoflow(EAGER_BACKEND), tiny_dataset, tmp_path)
    assert record["status"] == "ok", record["failure"]
    log = _mllog(tmp_path / "mllog.txt")
    assert "init_start" in compiling["logged_before"] and "run_start" not in compiling["logged_before"]
    assert log["init_start"] <= compiling["start_ms"] and compiling["end_ms"] <= log["init_stop"] <= log["run_start"]
    assert record["metrics"]["compile_s"] > 0


def test_compile_cache_dir_of_the_system_is_the_one_used(tiny_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("COMPILE_ROOT", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    spec = _tiny_cosmoflow(EAGER_BACKEND)
    spec["system"] = spec["system"] | {"compile_cache_dir": "$COMPILE_ROOT/inductor"}
    record = _run(spec, tiny_dataset, tmp_path / "trial")
    assert record["status"] == "ok", record["failure"]
    assert record["benchmark"]["compile"]["cache_dir"] == str(tmp_path / "inductor")


def test_a_system_file_names_its_compile_cache_and_the_trial_spec_carries_it(tmp_path):
    """compile_cache_dir is system data (mlcampaign/plan/schemas/system.schema.yaml), validated when planned."""
    system = repo_system("local-cpu", compile_cache_dir="$WORK/inductor-cache")
    workflow_copy(tmp_path / "w", {"local-cpu": system})
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text()) | {"benchmarks": ["cosmoflow"]}
    campaign = load_campaign(config, tmp_path / "w" / "config")
    assert campaign.trial_spec(next(campaign.trials()), "r", "local")["system"]["compile_cache_dir"] == (
        "$WORK/inductor-cache"
    )
    workflow_copy(tmp_path / "bad", {"local-cpu": system | {"compile_cache_dir": ""}})
    with pytest.raises(ConfigError, match=r"local-cpu.yaml: key 'compile_cache_dir': value ''"):
        load_campaign(config, tmp_path / "bad" / "config")


def test_an_unknown_backend_is_named_in_the_failure(tiny_dataset, tmp_path):
    record = _run(_tiny_cosmoflow({"enabled": True, "backend": "no_such_backend"}), tiny_dataset, tmp_path)
    assert record["status"] == "failed"
    assert "key 'backend': value 'no_such_backend'" in record["failure"]["message"]
    assert record["metrics"]["samples_trained"] is None  # refused before training


def test_channels_last_compiles_and_trains(tiny_dataset, tmp_path):
    record = _run(_tiny_cosmoflow(EAGER_BACKEND, channels_last=True), tiny_dataset, tmp_path)
    assert record["status"] == "ok", record["failure"]
    assert record["benchmark"]["channels_last"] is True and record["metrics"]["compile_s"] > 0


def test_bf16_cpu_trials_get_the_onednn_workaround_before_compiling(tiny_dataset, tmp_path):
    spec = _tiny_cosmoflow(EAGER_BACKEND, precisions=["bf16"])
    trial = TorchTrial(spec, detect_layout(), tiny_dataset, tmp_path / "mllog.txt")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trial.prepare()
        # Nothing in the trial's log a user cannot act on (Dynamo warned of the workaround's cache).
        assert not [str(w.message) for w in caught if "onednn_bf16" in str(w.message)]
        convolutions = [m for m in trial.model.modules() if isinstance(m, precision.CONVOLUTIONS)]
        assert convolutions and all(m.forward.__func__ is precision._forward for m in convolutions)
        assert trial.counters.compile_s > 0
    finally:
        trial.close()
    fp32 = TorchTrial(_tiny_cosmoflow(), detect_layout(), tiny_dataset, tmp_path / "fp32.txt")
    try:
        fp32.prepare()
        assert not any("forward" in vars(m) for m in fp32.model.modules())  # fp32: the modules' own forwards
    finally:
        fp32.close()


def test_a_detector_refuses_compile_with_the_reason(tmp_path):
    override = {
        "dataset": {
            "name": "extreme-weather-unit-compile",
            "source": {"options": {"seed": 0, "train_samples": 4, "val_samples": 2, "height": 64, "width": 96}},
        },
        "model": {"options": {"backbone": "resnet18", "stage_blocks": [1, 1, 1, 1], "fpn_channels": 16}},
        "training": {"epochs_max": 1, "global_batch_size": 2, "compile": EAGER_BACKEND},
    }
    campaign = _campaign("extreme-weather", override, matrix={"scales": ["1x1"], "precisions": ["fp32"]})
    spec = campaign.trial_spec(next(campaign.trials()), "test-run", "local")
    stage_into(spec["benchmark"]["dataset"], tmp_path / "dataset")
    record = _run(spec, tmp_path / "dataset" / ID_FILE, tmp_path / "trial")
    assert record["failure"]["reason"] == "unsupported"
    assert "takes the targets in its training forward" in record["failure"]["message"]


def test_the_warm_up_leaves_batchnorm_statistics_and_weights_as_they_were(tmp_path):
    override = {
        "model": {"options": {"image_height": 16, "image_width": 16, "width": 0.03, "middle_blocks": 1}},
        "dataset": {
            "name": "deepcam-unit-16",
            "source": {"options": {"seed": 0, "train_samples": 4, "val_samples": 2, "height": 16, "width": 16}},
        },
        "training": {"epochs_max": 1, "global_batch_size": 2, "eval_batch_size": 2},
    }
    prepared = {}
    for name, setting in (("eager", None), ("compiled", EAGER_BACKEND)):
        if setting is not None:
            override["training"]["compile"] = setting
        campaign = _campaign("deepcam", override, matrix={"scales": ["1x1"], "precisions": ["fp32"]})
        spec = campaign.trial_spec(next(campaign.trials()), "test-run", "local")
        if not (tmp_path / "dataset" / ID_FILE).is_file():
            stage_into(spec["benchmark"]["dataset"], tmp_path / "dataset")
        trial = TorchTrial(spec, detect_layout(), tmp_path / "dataset" / ID_FILE, tmp_path / f"{name}.txt")
        try:
            trial.prepare()
            prepared[name] = {key: value.clone() for key, value in trial.model.state_dict().items()}
            assert all(parameter.grad is None for parameter in trial.parameters)
        finally:
            trial.close()
    assert any("running_mean" in key for key in prepared["eager"])  # the model has BatchNorm statistics
    assert prepared["compiled"].keys() == prepared["eager"].keys()
    for key, value in prepared["eager"].items():
        assert torch.equal(prepared["compiled"][key], value), key


def test_two_compiled_gloo_ranks_all_reduce_through_the_hook_and_end_alike(tiny_dataset, tmp_path):
    """DistributedDataParallel under torch.compile, launched as the trial job launches it: the compressed
    all-reduce hook still runs and is timed, the warm-up's all-reduces are not counted, the ranks agree."""
    spec = _tiny_cosmoflow(EAGER_BACKEND, scales=["1x2"], compressions=["fp16"])
    assert spec["trial"]["cell"] == "1x2-fp32-grad_fp16-compile_eager_default"
    record_path, log = tmp_path / "out" / "record.json", tmp_path / "trial.log"
    status = supervise(spec, tiny_dataset, record_path, tmp_path / "out" / "mllog.txt", log, None)
    assert status == 0, log.read_text()[-5000:]
    record = read_record(record_path)
    assert record["status"] == "ok", record["failure"]
    assert record["distributed"]["world_size"] == 2 and record["distributed"]["weights_consistent"] is True
    metrics = record["metrics"]
    assert metrics["compile_s"] > 0 and metrics["allreduce_in_flight_s"] >= metrics["communication_s"] > 0
    assert "torch.compile compiled" not in log.read_text()


def test_a_compilation_inside_the_timed_training_is_reported(tiny_dataset, tmp_path, capfd):
    trial = TorchTrial(_tiny_cosmoflow(EAGER_BACKEND), detect_layout(), tiny_dataset, tmp_path / "mllog.txt")
    try:
        trial.prepare()
        trial._train_epoch(1)
        assert "torch.compile compiled" not in capfd.readouterr().err
        # Batches of another size than the warm-up's: torch.compile compiles again, inside the epoch.
        trial.train_loader = DataLoader(trial.train_loader.dataset, batch_size=3, sampler=trial.sampler, drop_last=True)
        trial._train_epoch(2)
        assert "torch.compile compiled 1 frame(s) during a timed training epoch" in capfd.readouterr().err
    finally:
        trial.close()
