"""Horovod trials for real: 1x2 torch and TensorFlow trials started as the trial job starts them (the system's
launcher, which on this machine runs horovodrun for backend horovod), and a Horovod that cannot serve the trial
refused before training.

Every benchmark with a Horovod cell (torch: ResNet-50, CosmoFlow, DeepCAM; TensorFlow: ResNet-50, CosmoFlow) runs
once, and every precision x compression pair of the matrix (fp32, bf16 x none, fp16) runs for torch; two trials
train the default campaign's CPU-sized benchmarks to their targets. The other cells are tiny (2 epochs of 2-3
steps, an unreachable target). ``bench/horovod_vs_native.py`` runs the whole matrix against backend native.

Skipped where Horovod, or its extension for the trial's framework, is not installed; failing where it is installed
but broken.
"""

import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlcampaign.data.manifest import ID_FILE
from mlcampaign.data.staging import stage_into
from mlcampaign.job.launch import TRIAL_PROGRAM, launch_argv, trial_environment
from mlcampaign.plan.config import deep_merge, load_campaign
from mlcampaign.records.files import read_record
from mlcampaign.trial.distributed import (
    DistributedSetupError,
    MissingModuleError,
    ProcessLayout,
    init_horovod,
)
from mlcampaign.trial.protocol import COMMUNICATION_METHODS, classify_failure

from conftest import REPO

pytestmark = pytest.mark.integration

DEFAULT_CAMPAIGN = REPO / "config" / "config.yaml"
EXTENSIONS = {"torch": "mpi_lib_v2", "tensorflow": "mpi_lib"}
UNREACHABLE = {"higher": 1.01, "lower": 0.0}  # top1 / IoU above 1, or a mean absolute error of 0
EPOCHS = 2
# Tiny variants of the CPU-sized benchmarks (same model family, format and reader): 2-3 steps an epoch at 1x2.
TINY = {
    "resnet50-synthetic": {
        "dataset": {
            "name": "hvd-images-16",
            "source": {"options": {"num_classes": 2, "train_per_class": 8, "val_per_class": 2, "image_size": 16}},
        },
        "model": {"options": {"image_size": 16, "num_classes": 2}},
        "training": {"global_batch_size": 8},
    },
    "cosmoflow": {
        "dataset": {"name": "hvd-cosmoflow-32", "source": {"options": {"train_samples": 48, "val_samples": 8}}}
    },
    "deepcam": {
        "dataset": {"name": "hvd-deepcam-64x96", "source": {"options": {"train_samples": 24, "val_samples": 8}}}
    },
}
# keras.applications.ResNet50 has the full bottleneck width and takes 32x32 images at least.
TINY_KERAS = {
    "resnet50-synthetic": {
        "dataset": {
            "name": "hvd-images-32",
            "source": {"options": {"num_classes": 2, "train_per_class": 8, "val_per_class": 2, "image_size": 32}},
        },
        "model": {"options": {"image_size": 32, "num_classes": 2, "width_per_group": 64}},
        "training": {"global_batch_size": 8},
    }
}


def horovod_package() -> Path:
    """The installed Horovod's package directory; skips where there is none."""
    spec = importlib.util.find_spec("horovod")
    if spec is None:
        pytest.skip(f"horovod is not installed in {sys.executable} (build it: python envs/horovod/build.py)")
    return Path(spec.origin).parent


def require_extension(framework: str) -> None:
    """Skips where the installed Horovod has no extension for ``framework``."""
    package = horovod_package() / framework
    if not list(package.glob(f"{EXTENSIONS[framework]}.*.so")):
        pytest.skip(f"horovod.{framework} was not built into the installed Horovod ({package})")


def trial_spec(benchmark: str, framework: str, scale: str, precision: str, compression: str, tiny: bool) -> dict:
    """The default campaign's spec of one Horovod trial; ``tiny``: on a tiny variant, every epoch run."""
    config = yaml.safe_load(DEFAULT_CAMPAIGN.read_text())
    overrides = config["benchmark_overrides"].get(benchmark, {})
    if tiny:
        variant = TINY_KERAS.get(benchmark, TINY[benchmark]) if framework == "tensorflow" else TINY[benchmark]
        overrides = deep_merge(overrides, variant)
        overrides = deep_merge(overrides, {"training": {"epochs_max": EPOCHS, "warmup_steps": 1}})
    config |= {
        "benchmarks": [benchmark],
        "trials": 1,
        "matrix": {
            "scales": [scale],
            "precisions": [precision],
            "compressions": [compression],
            "frameworks": [framework],
            "backends": ["horovod"],
        },
        "benchmark_overrides": {benchmark: overrides},
    }
    campaign = load_campaign(config, REPO / "config", source=str(DEFAULT_CAMPAIGN))
    spec = campaign.trial_spec(next(campaign.trials()), "test-run", "local")
    if tiny:
        target = spec["benchmark"]["target"]
        target["value"] = UNREACHABLE[target["direction"]]
    return spec


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """The staged dataset of a spec (its id file), staged once per dataset name in this module."""
    root = tmp_path_factory.mktemp("datasets")

    def stage(spec: dict) -> Path:
        dataset = spec["benchmark"]["dataset"]
        if not (root / dataset["name"] / ID_FILE).is_file():
            stage_into(dataset, root / dataset["name"])
        return root / dataset["name"] / ID_FILE

    return stage


def launch(
    spec: dict, dataset_id: Path, out: Path, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, dict]:
    """Start the trial as its job does: the system's launcher, then the trial program with the spec in a file."""
    out.mkdir(parents=True)
    (out / "spec.json").write_text(json.dumps(spec))
    argv = [*launch_argv(spec["system"], spec["trial"], sys.executable), *TRIAL_PROGRAM, "--spec-file"]
    argv += [str(out / "spec.json"), "--dataset-id", str(dataset_id)]
    argv += ["--record", str(out / "record.json"), "--mllog", str(out / "mllog.txt")]
    environment = trial_environment(os.environ if env is None else env)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=environment)
    assert (out / "record.json").exists(), (
        f"{' '.join(argv)}: no record\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    )
    return result, read_record(out / "record.json")


def assert_horovod_trial(record: dict, spec: dict, result: subprocess.CompletedProcess) -> None:
    """Trained ok on 2 horovodrun ranks with bit-identical weights; communication measured as the record says."""
    assert record["status"] == "ok", record["failure"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert record["trial"]["cell"] == spec["trial"]["cell"]
    parallel = record["distributed"]
    assert (parallel["world_size"], parallel["communication"]) == (2, "horovod")
    assert (parallel["launcher"], parallel["rank_environment"]) == ("python", "horovodrun")
    assert [rank["rank"] for rank in parallel["ranks"]] == [0, 1]
    assert parallel["weights_consistent"] is True
    assert len({rank["weights_sha256"] for rank in parallel["ranks"]}) == 1
    assert all(rank["communication_s"] > 0 for rank in parallel["ranks"])
    metrics = record["metrics"]
    assert metrics["communication_method"] == COMMUNICATION_METHODS[(spec["trial"]["framework"], "horovod")]
    # A blocking all-reduce after backward: nothing hides it, all of it is exposed.
    assert metrics["communication_s"] > 0
    assert metrics["allreduce_in_flight_s"] == metrics["communication_s"]
    assert metrics["compute_s"] > 0 and metrics["throughput_samples_per_s"] > 0
    # The all-reduce canary in the trial's own Horovod ranks.
    collective = record["canaries"]["allreduce_bus_bytes_per_s"]
    assert f"with horovod.{spec['trial']['framework']} over 2 processes" in collective["method"]


# (benchmark, framework, precision, compression): each Horovod benchmark, and for torch each precision x compression.
TINY_CELLS = [
    ("cosmoflow", "torch", "bf16", "fp16"),
    ("deepcam", "torch", "fp32", "fp16"),
    ("deepcam", "torch", "bf16", "none"),
    ("resnet50-synthetic", "tensorflow", "bf16", "fp16"),
]


@pytest.mark.parametrize(("benchmark", "framework", "precision", "compression"), TINY_CELLS)
def test_horovod_cell_trains_alike_on_both_ranks(benchmark, framework, precision, compression, staged, tmp_path):
    require_extension(framework)
    spec = trial_spec(benchmark, framework, "1x2", precision, compression, tiny=True)
    result, record = launch(spec, staged(spec), tmp_path / "trial")
    assert_horovod_trial(record, spec, result)
    steps = record["dataset"]["train_samples"] // record["benchmark"]["global_batch_size"]
    assert record["metrics"]["samples_trained"] == EPOCHS * steps * record["benchmark"]["global_batch_size"]
    assert record["metrics"]["epochs_run"] == EPOCHS


# The default campaign's CPU-sized benchmarks as configured (config/config.yaml), at 1x2.
TARGET_CELLS = [("resnet50-synthetic", "torch"), ("cosmoflow", "tensorflow")]


@pytest.mark.parametrize(("benchmark", "framework"), TARGET_CELLS)
def test_horovod_trial_reaches_the_target(benchmark, framework, staged, tmp_path):
    require_extension(framework)
    spec = trial_spec(benchmark, framework, "1x2", "fp32", "none", tiny=False)
    result, record = launch(spec, staged(spec), tmp_path / "trial")
    assert_horovod_trial(record, spec, result)
    metrics, target = record["metrics"], spec["benchmark"]["target"]
    assert metrics["epochs_to_target"] is not None, metrics["quality_history"]
    quality = metrics["achieved_quality"]
    assert quality >= target["value"] if target["direction"] == "higher" else quality <= target["value"]


# -- a Horovod that cannot serve the trial ---------------------------------------------------------------------
def remove_extension(package: Path, framework: str) -> None:
    next((package / framework).glob(f"{EXTENSIONS[framework]}.*.so")).unlink()


def replace_extension_with_text(package: Path, framework: str) -> None:
    next((package / framework).glob(f"{EXTENSIONS[framework]}.*.so")).write_text("not a shared library\n")


def edit_metadata(package: Path, key: str, version: str | None) -> None:
    built = json.loads((package / "metadata.json").read_text())
    if version is None:
        del built[key]
    else:
        built[key] = version
    (package / "metadata.json").write_text(json.dumps(built))


BROKEN_HOROVOD = {
    "torch extension removed": (
        "torch",
        lambda package: remove_extension(package, "torch"),
        r"has no working torch extension \(ImportError: .*mpi_lib_v2",
    ),
    "built against another torch": (
        "torch",
        lambda package: edit_metadata(package, "pytorch", "2.0.0"),
        r"was built against torch 2\.0\.0, but this environment has torch ",
    ),
    "built without torch": (
        "torch",
        lambda package: edit_metadata(package, "pytorch", None),
        r"was built without torch \(metadata\.json: ",
    ),
    "tensorflow extension not a library": (
        "tensorflow",
        lambda package: replace_extension_with_text(package, "tensorflow"),
        r"has no working tensorflow extension \(NotFoundError: ",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN_HOROVOD))
def test_a_horovod_that_cannot_serve_the_trial_is_refused_before_training(case, staged, tmp_path):
    """The installed Horovod, copied and broken, first on the trial's PYTHONPATH; a one-process trial."""
    framework, damage, message = BROKEN_HOROVOD[case]
    require_extension(framework)
    copy = tmp_path / "site" / "horovod"
    shutil.copytree(horovod_package(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    damage(copy)
    spec = trial_spec("resnet50-synthetic", framework, "1x1", "fp32", "none", tiny=True)
    env = os.environ | {"PYTHONPATH": str(copy.parent)}
    result, record = launch(spec, staged(spec), tmp_path / "trial", env=env)
    assert result.returncode == 1
    assert record["status"] == "failed"
    assert record["failure"]["reason"] == "unsupported", record["failure"]
    assert f"backend 'horovod' of framework {framework}: Horovod " in record["failure"]["message"]
    assert f"at {copy}" in record["failure"]["message"]  # the Horovod it found, named
    assert re.search(message, record["failure"]["message"]), record["failure"]["message"]
    assert "build Horovod for this environment (python envs/horovod/build.py)" in record["failure"]["message"]
    # Refused before MLPerf run_start: nothing trained or timed.
    assert (record["metrics"]["samples_trained"], record["metrics"]["time_to_train_s"]) == (None, None)
    assert "run_start" not in (tmp_path / "trial" / "mllog.txt").read_text()


def test_no_horovod_is_refused_as_unsupported(monkeypatch):
    monkeypatch.setitem(sys.modules, "horovod", None)  # what `import horovod` meets where it is not installed
    with pytest.raises(
        MissingModuleError, match="backend 'horovod' of framework torch needs the Python module 'horovod'"
    ) as error:
        init_horovod("torch", ProcessLayout(0, 1, 0, 1, "127.0.0.1", 29500, source="single process"))
    assert classify_failure(error.value) == "unsupported"


def test_a_horovod_without_mpi_refuses_ranks_an_mpi_launcher_started():
    require_extension("torch")
    if importlib.import_module("horovod.torch").mpi_built():
        pytest.skip("the installed Horovod has MPI: srun's ranks can join it")
    layout = ProcessLayout(0, 2, 0, 1, "node1", 29500, source="srun")
    with pytest.raises(MissingModuleError, match=r"was built without MPI, so the 2 ranks srun started") as error:
        init_horovod("torch", layout)
    assert "envs/horovod/build.py --mpi" in str(error.value)
    assert classify_failure(error.value) == "unsupported"


def test_horovod_does_not_join_ranks_torchrun_started():
    require_extension("torch")
    layout = ProcessLayout(0, 2, 0, 2, "127.0.0.1", 29500, source="torchrun")
    with pytest.raises(DistributedSetupError, match="Horovod joins ranks started by horovodrun or an MPI launcher"):
        init_horovod("torch", layout)
