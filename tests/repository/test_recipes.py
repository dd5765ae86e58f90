"""The recipes of config/README.md, followed in a copy of the checkout: a new system at an existing site is one
file, a new benchmark with an existing model one file; a benchmark with its own model and data format one folder
and one file, a metric one declaration with its measurement, a kind of results store one module, a power source
one module; a new MLPerf benchmark one folder and one file."""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlperf_tools import SUBSET

from conftest import REPO, SNAKEMAKE, job_counts

pytestmark = pytest.mark.integration

NEW_SYSTEM = {
    "name": "workstation-8core",
    "site": "local",
    "description": "An 8-core workstation of the same site as local-cpu.",
    "executor": "local",
    "launcher": "python",
    "device": "cpu",
    "accelerator": "8-core workstation CPU",
    "nodes_max": 1,
    "cores_per_node": 8,
    "devices_per_node": 1,
    "peak_flops_per_device": {"fp32": 6.0e11},
    "peak_source": "8 cores x 2.35 GHz x 32 FP32 FLOP/cycle (two 256-bit FMA pipes)",
}
NEW_BENCHMARK = {
    "name": "resnet18-width-synthetic",
    "description": "A narrower ResNet-50 on a small synthetic class-folder set.",
    "model": {"name": "resnet50", "options": {"num_classes": 4, "image_size": 16, "width_per_group": 8}},
    "dataset": {
        "name": "synthetic-images-16x4",
        "format": "image_folder",
        "source": {"generator": "synthetic_images", "options": {"num_classes": 4, "image_size": 16}},
    },
    "target": {"metric": "top1", "direction": "higher", "value": 0.8, "source": "test of the recipe"},
    "valid_flops": {"exponent": 10, "source": "test of the recipe"},
    "training": {"epochs_max": 2, "global_batch_size": 8, "optimizer": {"name": "sgd", "lr": 0.05}},
}


def checkout_copy(destination):
    """The checkout's files (tracked and untracked, not ignored), as a fresh clone has them."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return files_of(destination)


def files_of(checkout: Path) -> list[Path]:
    return sorted(path.relative_to(checkout) for path in checkout.rglob("*") if path.is_file())


def add_benchmark_folder(checkout: Path, folder: str, files: dict[str, str], config: dict) -> None:
    """A benchmark folder of ``files`` and its ``config/benchmarks/<name>.yaml``, as the recipes add them."""
    (checkout / "mlcampaign" / "benchmarks" / folder).mkdir()
    for name, text in files.items():
        (checkout / "mlcampaign" / "benchmarks" / folder / name).write_text(text)
    (checkout / "config" / "benchmarks" / f"{config['name']}.yaml").write_text(yaml.safe_dump(config))


def test_a_new_system_and_a_new_benchmark_are_one_file_each(tmp_path):
    checkout = tmp_path / "checkout"
    before = checkout_copy(checkout)
    (checkout / "config" / "systems" / "workstation-8core.yaml").write_text(yaml.safe_dump(NEW_SYSTEM))
    (checkout / "config" / "benchmarks" / "resnet18-width-synthetic.yaml").write_text(yaml.safe_dump(NEW_BENCHMARK))
    after = files_of(checkout)
    assert sorted(set(after) - set(before)) == [
        Path("config/benchmarks/resnet18-width-synthetic.yaml"),
        Path("config/systems/workstation-8core.yaml"),
    ]
    campaign = {
        "campaign": "recipes",
        "seed": 5,
        "trials": 2,
        "systems": ["local-cpu", "workstation-8core"],
        "benchmarks": ["resnet50-digits", "resnet18-width-synthetic"],
        "matrix": {"scales": ["1x1", "1x2"], "precisions": ["fp32"]},
    }
    campaign_file = tmp_path / "campaign.yaml"
    campaign_file.write_text(yaml.safe_dump(campaign))
    result = subprocess.run(
        [
            *(SNAKEMAKE, "--snakefile", str(checkout / "Snakefile"), "--directory", str(tmp_path / "work")),
            *("--profile", str(checkout / "profiles" / "local"), "-n", "--configfile", str(campaign_file)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # 2 systems x 2 benchmarks x 2 scales x 2 trials; each benchmark's dataset staged once.
    counts = job_counts(result.stdout)
    assert (counts["trial"], counts["stage_dataset"]) == (16, 2)
    assert "workstation-8core/resnet18-width-synthetic/1x2-fp32/trial1-rep0/record.json" in result.stdout


# -- a benchmark with its own model and data format: one folder and one YAML ---------------------
NEW_FOLDER = {
    "__init__.py": '''"""A tiny regression benchmark: an MLP fitting a noisy linear map (one .npz file a split)."""

from mlcampaign.plan.registry import Benchmark, DataFormat, Generator, GeneratorWork, Model

BENCHMARK = Benchmark(
    models={
        "tiny_mlp": Model(torch=f"{__name__}.model:SPEC", options=("features", "hidden"), quality_metrics=("rmse",))
    },
    data_formats={"linear_npz": DataFormat(f"{__name__}.reader:linear_npz", {"train": "train", "val": "val"})},
    generators={
        "noisy_linear": Generator(
            f"{__name__}.generator:noisy_linear",
            ("linear_npz",),
            GeneratorWork(lambda o: o["train_samples"] + o["val_samples"], lambda o: o["features"], 1e-7),
        )
    },
)
''',
    "model.py": """import torch
from torch import nn

from mlcampaign.trial.torch.models import ModelSpec


def build(features: int = 8, hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def sample_shape(features: int = 8, **_) -> tuple[int, ...]:
    return (features,)


def eval_sums(outputs, targets):
    squares = ((outputs.squeeze(1) - targets) ** 2).sum().double()
    return {"squares": squares, "count": torch.tensor(len(targets), dtype=torch.float64)}


SPEC = ModelSpec(
    build=build,
    sample_shape=sample_shape,
    criterion=lambda training: nn.MSELoss(),
    eval_sums=eval_sums,
    eval_finalize=lambda sums: {"rmse": (sums["squares"] / sums["count"]) ** 0.5},
)
""",
    "reader.py": """from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset


def linear_npz(root: Path, split: str, sample_shape: tuple[int, ...]) -> TensorDataset:
    with np.load(Path(root) / split / "samples.npz") as arrays:
        return TensorDataset(torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"]))
""",
    "generator.py": """from pathlib import Path

import numpy as np

from mlcampaign.data.formats import write_npz


def noisy_linear(out_dir: Path, seed: int = 0, features: int = 8, train_samples: int = 256, val_samples: int = 64):
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=features)
    for split, count in (("train", train_samples), ("val", val_samples)):
        x = rng.normal(size=(count, features)).astype(np.float32)
        y = (x @ weights + 0.05 * rng.normal(size=count)).astype(np.float32)
        (Path(out_dir) / split).mkdir(parents=True)
        write_npz(Path(out_dir) / split / "samples.npz", {"x": x, "y": y})
""",
}
TINY_BENCHMARK = {
    "name": "tiny-regression",
    "description": "An MLP fitting a noisy linear map (the recipe of a new benchmark).",
    "model": {"name": "tiny_mlp", "options": {"features": 8, "hidden": 16}},
    "dataset": {"name": "noisy-linear-8", "format": "linear_npz", "source": {"generator": "noisy_linear"}},
    "target": {"metric": "rmse", "direction": "lower", "value": 0.5, "source": "test of the recipe"},
    "valid_flops": {"exponent": 1, "source": "test of the recipe"},
    "training": {"epochs_max": 20, "global_batch_size": 16, "optimizer": {"name": "adam", "lr": 0.01}},
}
# A metric: one declaration (with its measurement, from the trial loop's counters) in the metric table.
NEW_METRIC = """        Metric(
            "samples_per_step",
            "samples",
            None,
            "training samples per timed step (the recipe of a new metric)",
            "metrics.samples_per_step",
            measure=lambda c: c.measured_samples / c.measured_steps if c.measured_steps else None,
            tabled=True,
        ),
"""
# A kind of results store: one module of history/store/backends (here SQLite through its named driver).
NEW_BACKEND = """from mlcampaign.history.store.backends.sqlite import SQLiteBackend


class NamedDriverSQLite(SQLiteBackend):
    drivernames = ("sqlite+pysqlite",)
    url_form = "sqlite+pysqlite:///path/to/store.db"


BACKEND = NamedDriverSQLite()
"""


def test_a_benchmark_folder_a_metric_and_a_store_backend_are_what_the_recipes_say(tmp_path):
    checkout = tmp_path / "checkout"
    before = checkout_copy(checkout)
    add_benchmark_folder(checkout, "tiny_regression", NEW_FOLDER, TINY_BENCHMARK)
    (checkout / "mlcampaign" / "history" / "store" / "backends" / "sqlite_named_driver.py").write_text(NEW_BACKEND)
    metrics = checkout / "mlcampaign" / "plan" / "metrics.py"
    text = metrics.read_text()
    anchor = "        # -- measured by the trial loop (record.metrics) "
    metrics.write_text(text.replace(anchor, NEW_METRIC + anchor, 1))
    after = files_of(checkout)
    assert sorted(set(after) - set(before)) == sorted(
        [
            *(Path("mlcampaign/benchmarks/tiny_regression") / name for name in NEW_FOLDER),
            Path("config/benchmarks/tiny-regression.yaml"),
            Path("mlcampaign/history/store/backends/sqlite_named_driver.py"),
        ]
    )
    # Of the files the checkout had, only the metric table changed.
    changed = [name for name in before if (checkout / name).read_bytes() != (REPO / name).read_bytes()]
    assert changed == [Path("mlcampaign/plan/metrics.py")]
    store = tmp_path / "history.db"
    campaign = {
        "campaign": "recipes-new-benchmark",
        "seed": 5,
        "trials": 1,
        "systems": ["local-cpu"],
        "benchmarks": ["tiny-regression"],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
        "history": {"store": f"sqlite+pysqlite:///{store}"},
    }
    campaign_file = tmp_path / "campaign.yaml"
    campaign_file.write_text(yaml.safe_dump(campaign))
    work = tmp_path / "work"
    result = subprocess.run(
        [
            *(SNAKEMAKE, "--snakefile", str(checkout / "Snakefile"), "--directory", str(work)),
            *(
                "--profile",
                str(checkout / "profiles" / "local"),
                "--config",
                "run=r1",
                "--configfile",
                str(campaign_file),
            ),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"PYTHONPATH": str(checkout)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = work / "results" / "recipes-new-benchmark" / "runs" / "r1"
    record = json.loads((run / "trials/local-cpu/tiny-regression/1x1-fp32/trial0-rep0/record.json").read_text())
    assert record["status"] == "ok" and record["benchmark"]["model"] == "tiny_mlp"
    assert record["metrics"]["samples_per_step"] == 16
    assert "samples_per_step" in pd.read_csv(run / "analysis/tables/planned_trials.csv").columns
    assert record["flops"]["train_per_sample"] > 0  # counted like any model
    with sqlite3.connect(store) as connection:  # the run went into the store of the new kind
        assert connection.execute("select count(*) from records").fetchone() == (1,)


# -- a new MLPerf benchmark: one folder and one YAML ---------------------------------------------------
# A stand-in for MLPerf HPC's OpenCatalyst (oc20, which the project does not run): the regression folder above,
# its model declared with the oc20 rules of MLPerf HPC 3.0, and its mlperf.py: the closed-division keys of
# closed_oc20.yaml (a schedule in optimizer steps) and their reading back from a submission's logs.
OC20_RULES = (
    'mlperf=MLPerfRules("oc20", "hpc", "3.0.0", "eval_error", f"{__name__}.mlperf:hyperparameters", 0.036, '
    'reproduce=f"{__name__}.mlperf:reproduce_schedule")'
)
OC20_DECLARATION = (
    NEW_FOLDER["__init__.py"]
    .replace("GeneratorWork, Model", "GeneratorWork, MLPerfRules, Model")
    .replace('quality_metrics=("rmse",))', f'quality_metrics=("rmse",), {OC20_RULES})')
)
MLPERF_FOLDER = NEW_FOLDER | {
    "__init__.py": OC20_DECLARATION,
    "mlperf.py": '''"""OpenCatalyst's keys in MLPerf's HPC rules (closed_oc20.yaml): a schedule in optimizer steps."""

from mlcampaign.plan.reproduce import Settings
from mlcampaign.records.mlperf.trial_log import Schedule


def hyperparameters(benchmark: dict, schedule: Schedule) -> dict:
    milestones = sorted(benchmark["training"]["schedule"].get("milestones", []), key=lambda m: m["epoch"])
    return {
        "opt_learning_rate_warmup_steps": schedule.warmup_steps,
        "opt_learning_rate_warmup_factor": 1.0,
        "opt_learning_rate_decay_boundary_steps": [round(m["epoch"] * schedule.steps_per_epoch) for m in milestones],
        "opt_learning_rate_decay_factor": [m["factor"] for m in milestones],
    }


def reproduce_schedule(settings: Settings, steps_per_epoch: float) -> None:
    warmup = settings.take("opt_learning_rate_warmup_steps", 0)
    factor = settings.take("opt_learning_rate_warmup_factor", 1.0)
    if factor != 1.0:
        settings.drop("opt_learning_rate_warmup_factor", factor, "the project's warm-up rises linearly from 0")
    boundaries = settings.take("opt_learning_rate_decay_boundary_steps", [])
    factors = settings.take("opt_learning_rate_decay_factor", [])
    if not isinstance(factors, list):  # one factor, applied again at each boundary
        factors = [factors ** (index + 1) for index in range(len(boundaries))]
    epochs = [round(step / steps_per_epoch, 6) for step in boundaries]
    schedule = {"name": "step" if boundaries else "constant", "warmup_epochs": round(warmup / steps_per_epoch, 6)}
    if boundaries:
        schedule["milestones"] = [{"epoch": e, "factor": f} for e, f in zip(epochs, factors, strict=True)]
    settings.carry(f"warm-up {warmup} steps, decay at steps {boundaries} -> epochs {epochs} by {factors}")
    settings.training["schedule"] = schedule
''',
}
SCHEDULE = {
    "name": "step",
    "warmup_epochs": 0.5,
    "milestones": [{"epoch": 2, "factor": 0.1}, {"epoch": 3, "factor": 0.01}],
}
OC20_BENCHMARK = TINY_BENCHMARK | {
    "name": "oc20",
    "description": "A stand-in for MLPerf HPC's OpenCatalyst (the recipe of a new MLPerf benchmark).",
    "target": TINY_BENCHMARK["target"] | {"value": 0.036, "source": "MLPerf HPC's (closed_oc20.yaml)"},
    "training": {
        "epochs_max": 4,
        "global_batch_size": 16,
        "optimizer": {"name": "adamw", "lr": 0.01, "weight_decay": 0.01},
        "schedule": SCHEDULE,
    },
}
# In the copy: each planned trial's MLPerf log (the events in the trial's order, reaching the target at its
# second evaluation) checked by the closed division's rules, and the FLOPs a published oc20 entry is given.
WRITE_AND_CHECK_LOGS = """
import json, sys
from pathlib import Path

from mlcampaign.analysis.mlperf_results import mlperf_hpc_name
from mlcampaign.history.published_rounds import full_size_flops
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.config_files import load_yaml
from mlcampaign.records.mlperf.trial_log import MLPerfLog, check_log

campaign = load_campaign(load_yaml(Path(sys.argv[1])), Path("config"))
folder = Path(sys.argv[2])
folder.mkdir(parents=True)
problems = []
for index, row in enumerate(campaign.trials()):
    spec = campaign.trial_spec(row, "r1", "local")
    path = folder / f"result_{index}.txt"
    log = MLPerfLog.open(path, spec)
    log.init_start(); log.header(); log.cache_clear(False); log.staging_start(); log.staging_stop(0.1)
    log.hyperparameters(256 // 16, {"train": 256, "val": 64})  # the generator's splits, 16 a batch
    log.init_stop(); log.run_start()
    for epoch, quality in ((1, 0.05), (2, 0.03)):
        log.epoch_start(epoch); log.epoch_stop(epoch)
        log.eval_start(epoch); log.quality(quality, epoch); log.eval_stop(epoch)
    log.run_stop(True, 2); log.close()
    problems.append(check_log(path, spec["benchmark"]).problems)
flops = full_size_flops("oc20")
print(json.dumps({"problems": problems, "name": mlperf_hpc_name(campaign.benchmarks["oc20"]), "flops": flops["model"]}))
"""


def test_a_new_mlperf_benchmark_is_one_folder_and_one_file(tmp_path):
    checkout = tmp_path / "checkout"
    before = checkout_copy(checkout)
    add_benchmark_folder(checkout, "oc20", MLPERF_FOLDER, OC20_BENCHMARK)
    assert sorted(set(files_of(checkout)) - set(before)) == sorted(
        [*(Path("mlcampaign/benchmarks/oc20") / name for name in MLPERF_FOLDER), Path("config/benchmarks/oc20.yaml")]
    )
    assert [name for name in before if (checkout / name).read_bytes() != (REPO / name).read_bytes()] == []
    campaign = {
        "campaign": "recipes-mlperf",
        "seed": 5,
        "trials": 5,
        "systems": ["local-cpu"],
        "benchmarks": ["oc20"],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
        "mlperf": {"org": "EPCC", "division": "closed", "status": "research"},
    }
    campaign_file = tmp_path / "campaign.yaml"
    campaign_file.write_text(yaml.safe_dump(campaign))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"PYTHONPATH": str(checkout)}

    def run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=300, env=env)

    # Its trials' logs pass MLPerf HPC's closed rules for oc20, with the keys of its mlperf.py.
    results = tmp_path / "submission" / "EPCC" / "results" / "local-cpu" / "strong" / "oc20"
    written = run(sys.executable, "-c", WRITE_AND_CHECK_LOGS, str(campaign_file), str(results))
    assert written.returncode == 0, written.stderr[-3000:]
    assert OC20_RULES in (checkout / "mlcampaign/benchmarks/oc20/__init__.py").read_text()
    assert json.loads(written.stdout) == {"problems": [[]] * 5, "name": "oc20", "flops": "tiny_mlp"}

    # Those logs, as a submission, reproduce the campaign's schedule (steps back to epochs) in a campaign file.
    reproduced = tmp_path / "reproduced.yaml"
    command = ["reproduce", str(results), "--system", "local-cpu", "--org", "EPCC", "--out", str(reproduced)]
    result = run(sys.executable, "-m", "mlcampaign", *command)
    assert result.returncode == 0, result.stderr[-3000:]
    training = yaml.safe_load(reproduced.read_text())["benchmark_overrides"]["oc20"]["training"]
    assert training["schedule"] == SCHEDULE and training["epochs_max"] == 4
    assert training["optimizer"] == {"name": "adamw", "lr": 0.01, "weight_decay": 0.01}
    checked = run(sys.executable, "-m", "mlcampaign", "check", str(reproduced))
    assert checked.returncode == 0 and "5 trials planned, valid" in checked.stdout, checked.stderr[-3000:]
    if SUBSET.is_dir():  # and a published oc20 submission (HPE+LBNL's on Perlmutter, MLPerf HPC v3.0)
        published = tmp_path / "published.yaml"
        source = SUBSET / "HPE+LBNL/results/perlmutter_128x4/strong/oc20"
        result = run(sys.executable, "-m", "mlcampaign", *command[:1], str(source), *command[2:-1], str(published))
        assert result.returncode == 0, result.stderr[-3000:]
        assert "decay at steps [23448, 31264]" in published.read_text()
        assert run(sys.executable, "-m", "mlcampaign", "check", str(published)).returncode == 0


# A power source: one module of measure/energy/sources (here HPE Cray's node counters, pm_counters, read from
# a folder the test writes).
NEW_POWER_SOURCE = '''"""HPE Cray EX node energy and power through pm_counters ("<value> J <time> us" files)."""

from pathlib import Path

from mlcampaign.measure.energy.source import PowerSourceKind, SourceReading, SourceUnavailable

ROOT = Path({root!r})


class PmCountersSource:
    name = "pm_counters"
    counter_range_j: dict[str, float] = {{}}

    def __init__(self):
        if not (ROOT / "energy").is_file():
            raise SourceUnavailable(f"no {{ROOT / 'energy'}}")
        self.description = f"Cray pm_counters node energy ({{ROOT}})"

    def read(self) -> SourceReading:
        joules = float((ROOT / "energy").read_text().split()[0])
        watts = float((ROOT / "power").read_text().split()[0])
        return SourceReading(energy_j={{"node": joules}}, power_w={{"node": watts}})

    def close(self) -> None:
        pass


SOURCE = PowerSourceKind("pm_counters", lambda gpu_indices: PmCountersSource(), order=40)
'''
MEASURE_A_WINDOW = """
import json
from pathlib import Path
from mlcampaign.measure.energy.monitor import EnergyMonitor

counters = Path({root!r})
monitor = EnergyMonitor.for_this_machine(period_s=60)
monitor.begin("timed")
(counters / "energy").write_text("1300 J 1700000002000000 us\\n")
window = monitor.end("timed")
monitor.stop()
print(json.dumps([window["sources"], window["not_measured"]]))
"""


def test_a_power_source_is_one_module(tmp_path):
    checkout = tmp_path / "checkout"
    before = checkout_copy(checkout)
    counters = tmp_path / "pm_counters"
    counters.mkdir()
    (counters / "energy").write_text("1000 J 1700000000000000 us\n")
    (counters / "power").write_text("150 W 1700000000000000 us\n")
    module = Path("mlcampaign/measure/energy/sources/pm_counters.py")
    (checkout / module).write_text(NEW_POWER_SOURCE.format(root=str(counters)))
    after = sorted(path.relative_to(checkout) for path in checkout.rglob("*") if path.is_file())
    assert sorted(set(after) - set(before)) == [module]
    assert [name for name in before if (checkout / name).read_bytes() != (REPO / name).read_bytes()] == []
    result = subprocess.run(
        [sys.executable, "-c", MEASURE_A_WINDOW.format(root=str(counters))],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"PYTHONPATH": str(checkout)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sources, not_measured = json.loads(result.stdout)
    # The new source is measured beside the machine's others, and its reading accounted like theirs.
    (node,) = [source for source in sources if source["source"] == "pm_counters"]
    assert node["energy_j"] == 300.0 and node["devices"]["node"]["peak_power_w"] == 150.0
    assert node["description"] == f"Cray pm_counters node energy ({counters})"
    assert not_measured is None or "pm_counters" not in not_measured
