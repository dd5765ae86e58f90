"""Incremental re-runs: content, not timestamps, decides which jobs are stale (`snakemake -n` counts).

One small campaign (2 systems x 2 benchmarks, one trial each; one dataset staged from a path, one
generated) runs once in a copy of the checkout; then each change is planned with `snakemake -n`
and the jobs Snakemake would run are compared with exactly the ones the change affects.
"""

import contextlib
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from mlcampaign.plan.registry import generators

from conftest import REPO, SNAKEMAKE, job_counts, run_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# What a clone of the repository holds that the workflow reads.
CHECKOUT_PARTS = ("Snakefile", "rules", "scripts", "mlcampaign", "config", "profiles", "envs")
CAMPAIGN = "incremental"
RUN = "week-1"
TRAINING = {
    "epochs_max": 1,
    "eval_every": 1,
    "global_batch_size": 16,
    "eval_batch_size": 16,
    "warmup_steps": 1,
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
}


def benchmark(name: str, dataset: dict) -> dict:
    return {
        "name": name,
        "model": {"name": "resnet50", "options": {"num_classes": 4, "image_size": 16, "width_per_group": 4}},
        "dataset": {"format": "image_folder", **dataset},
        "target": {"metric": "top1", "direction": "higher", "value": 0.5},
        "valid_flops": {"exponent": 10, "source": "test"},
        "training": TRAINING,
    }


def copy_checkout(destination: Path) -> Path:
    """The workflow's files copied as a fresh clone would have them: every file new (new mtimes)."""
    destination.mkdir(parents=True)
    for part in CHECKOUT_PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(
                source, destination / part, copy_function=shutil.copy, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(source, destination / part)
    return destination


def planned_jobs(checkout: Path, workdir: Path, *args: str) -> Counter:
    """Jobs per rule that `snakemake -n` plans for the campaign (empty: nothing to do)."""
    result = subprocess.run(
        [
            SNAKEMAKE,
            run_path(CAMPAIGN, RUN, "trials.csv"),
            run_path(CAMPAIGN, RUN, "analysis", "tables", "summary.csv"),
            "--config",
            f"run={RUN}",
            "--snakefile",
            str(checkout / "Snakefile"),
            "--directory",
            str(workdir),
            "--profile",
            str(checkout / "profiles" / "local"),
            "--configfile",
            str(checkout / "config" / "campaigns" / f"{CAMPAIGN}.yaml"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    if "-n" not in args:
        return Counter()
    if "Nothing to be done" in result.stdout + result.stderr:
        return Counter()
    return Counter(job_counts(result.stdout + result.stderr))


@contextlib.contextmanager
def edited_yaml(path: Path, edit):
    """``path`` with ``edit`` applied to its document, restored afterwards."""
    original = path.read_text()
    document = yaml.safe_load(original)
    edit(document)
    path.write_text(yaml.safe_dump(document))
    try:
        yield
    finally:
        path.write_text(original)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """A finished run: (checkout, workdir, source dataset directory)."""
    root = tmp_path_factory.mktemp("incremental")
    checkout = copy_checkout(root / "checkout")
    source = root / "source-images"
    generators()["synthetic_images"].write(
        source, "image_folder", seed=1, num_classes=4, train_per_class=8, val_per_class=4, image_size=16
    )
    config = checkout / "config"
    system_b = yaml.safe_load((config / "systems" / "local-cpu.yaml").read_text()) | {"name": "local-cpu-b"}
    (config / "systems" / "local-cpu-b.yaml").write_text(yaml.safe_dump(system_b))
    for name, dataset in {
        "tiny-path": {"name": "tiny-path", "source": {"path": str(source)}},
        "tiny-generated": {
            "name": "tiny-generated",
            "source": {
                "generator": "synthetic_images",
                "options": {"seed": 2, "num_classes": 4, "train_per_class": 8, "val_per_class": 4, "image_size": 16},
            },
        },
    }.items():
        (config / "benchmarks" / f"{name}.yaml").write_text(yaml.safe_dump(benchmark(name, dataset)))
    (config / "campaigns").mkdir(exist_ok=True)
    (config / "campaigns" / f"{CAMPAIGN}.yaml").write_text(
        yaml.safe_dump(
            {
                "campaign": CAMPAIGN,
                "seed": 7,
                "trials": 1,
                "systems": ["local-cpu", "local-cpu-b"],
                "benchmarks": ["tiny-path", "tiny-generated"],
                "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
            }
        )
    )
    workdir = root / "work"
    planned_jobs(checkout, workdir)
    assert len(list((workdir / run_path(CAMPAIGN, RUN, "trials")).rglob("record.json"))) == 4
    return checkout, workdir, source


AFFECTED_BY_ONE_BENCHMARK = Counter({"stage_dataset": 1, "trial": 2, "trials_table": 1, "aggregate": 1})


def test_a_finished_campaign_plans_nothing(campaign):
    checkout, workdir, _ = campaign
    assert planned_jobs(checkout, workdir, "-n") == Counter()


def test_a_fresh_clone_and_copied_results_re_run_nothing(campaign, tmp_path):
    """New code files (new mtimes, another path) with the results copied elsewhere: by `cp -a`
    (times kept) without Snakemake's metadata, or by `cp -r` (new times, in any order) with it,
    which holds the checksums of small inputs. Runs before any file is touched."""
    checkout, workdir, _ = campaign
    clone = copy_checkout(tmp_path / "clone")
    shutil.copytree(checkout / "config", clone / "config", dirs_exist_ok=True)
    kept_times = tmp_path / "work-cp-a"
    shutil.copytree(workdir / "results", kept_times / "results")
    assert planned_jobs(clone, kept_times, "-n") == Counter()
    new_times = tmp_path / "work-cp-r"
    for part in ("results", ".snakemake/metadata"):
        shutil.copytree(workdir / part, new_times / part, copy_function=shutil.copy)
    assert planned_jobs(clone, new_times, "-n") == Counter()


def test_touched_files_re_run_nothing(campaign):
    checkout, workdir, source = campaign
    for path in [*source.rglob("*"), *(workdir / "results").rglob("*")]:
        path.touch()
    assert planned_jobs(checkout, workdir, "-n") == Counter()


def test_changed_generator_settings_re_run_that_dataset_s_trials(campaign):
    checkout, workdir, _ = campaign
    path = checkout / "config" / "benchmarks" / "tiny-generated.yaml"
    with edited_yaml(path, lambda doc: doc["dataset"]["source"]["options"].update(seed=3)):
        assert planned_jobs(checkout, workdir, "-n") == AFFECTED_BY_ONE_BENCHMARK


def test_one_changed_source_file_re_runs_that_dataset_s_trials_and_tables(campaign):
    checkout, workdir, source = campaign
    changed = sorted((source / "train").rglob("*.png"))[0]
    original = changed.read_bytes()
    try:
        changed.write_bytes(other_image(changed))
        assert planned_jobs(checkout, workdir, "-n") == AFFECTED_BY_ONE_BENCHMARK
    finally:
        changed.write_bytes(original)
    # The original content back: nothing is stale any more.
    assert planned_jobs(checkout, workdir, "-n") == Counter()


def test_a_changed_system_config_re_runs_only_that_system_s_trials(campaign):
    checkout, workdir, _ = campaign
    path = checkout / "config" / "systems" / "local-cpu-b.yaml"
    with edited_yaml(path, lambda doc: doc.update(trial_time_limit_minutes=30)):
        assert planned_jobs(checkout, workdir, "-n") == Counter({"trial": 2, "trials_table": 1, "aggregate": 1})


def other_image(path: Path) -> bytes:
    """Another valid image of the same size (the synthetic set of another seed)."""
    other = path.parents[3] / "other-images"
    if not other.exists():
        generators()["synthetic_images"].write(
            other, "image_folder", seed=99, num_classes=4, train_per_class=8, val_per_class=4, image_size=16
        )
    return (other / path.relative_to(path.parents[2])).read_bytes()
