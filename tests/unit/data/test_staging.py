"""Staging: generator or path -> manifest and dataset id; verified copies to the staging directory."""

import json

import pandas as pd
import pytest
import yaml

from mlcampaign.benchmarks.deepcam.generator import deepcam_climate
from mlcampaign.data import staging
from mlcampaign.data.manifest import ID_FILE, DatasetError, read_manifest, sha256_file
from mlcampaign.data.staging import launch_id, node_copy_dir, stage, stage_into, stage_to_node
from mlcampaign.plan.config import load_campaign
from mlcampaign.trial.protocol import run_trial

from conftest import REPO, latest_run, run_snakemake


def _deepcam_dataset(**source) -> dict:
    return {"name": "deepcam-unit", "format": "deepcam_hdf5", "source": source}


GENERATED = _deepcam_dataset(
    generator="deepcam_climate", options={"seed": 2, "train_samples": 4, "val_samples": 2, "height": 32, "width": 48}
)


@pytest.fixture
def staged(tmp_path):
    manifest = stage(GENERATED, tmp_path / "data", tmp_path / "manifest.json")
    return tmp_path / "data", manifest


def test_generated_dataset_has_a_manifest_with_a_hash_per_file(staged, tmp_path):
    data_dir, manifest = staged
    assert manifest == read_manifest(tmp_path / "manifest.json")
    assert len(manifest["files"]) == 4 + 2 + 1  # train, validation, stats.h5
    for entry in manifest["files"]:
        assert sha256_file(data_dir / entry["path"]) == entry["sha256"]
    assert not (tmp_path / "data.tmp").exists()
    again = stage(GENERATED, tmp_path / "again", tmp_path / "again.json")
    assert again["dataset_id"] == manifest["dataset_id"]
    assert manifest["staging"]["seconds"] > 0


def test_generator_of_another_format_is_refused(tmp_path):
    dataset = GENERATED | {"format": "cosmoflow_tfrecord"}
    with pytest.raises(DatasetError, match=r"key 'source\.generator': value 'deepcam_climate' writes"):
        stage(dataset, tmp_path / "data", tmp_path / "manifest.json")


@pytest.fixture
def source_dir(tmp_path, monkeypatch):
    origin = tmp_path / "filesystem" / "deepcam"
    deepcam_climate(origin, seed=5, train_samples=6, val_samples=3, height=32, width=48)
    (origin / "README").write_text("not part of the dataset")
    monkeypatch.setenv("UNIT_DATA", str(origin.parent))
    return origin


def test_path_source_copies_a_seeded_subset_and_the_shared_files(source_dir, tmp_path):
    dataset = _deepcam_dataset(path="$UNIT_DATA/deepcam", subset={"train": 4, "val": 2, "seed": 1})
    manifest = stage(dataset, tmp_path / "data", tmp_path / "manifest.json")
    paths = [entry["path"] for entry in manifest["files"]]
    assert sum(p.startswith("train/") for p in paths) == 4
    assert sum(p.startswith("validation/") for p in paths) == 2
    assert "stats.h5" in paths and "README" not in paths
    for entry in manifest["files"]:
        assert sha256_file(source_dir / entry["path"]) == entry["sha256"]
    same = stage(dataset, tmp_path / "same", tmp_path / "same.json")
    other_seed = stage(
        _deepcam_dataset(path="$UNIT_DATA/deepcam", subset={"train": 4, "val": 2, "seed": 2}),
        tmp_path / "other",
        tmp_path / "other.json",
    )
    assert same["dataset_id"] == manifest["dataset_id"] != other_seed["dataset_id"]


def test_path_source_without_subset_takes_every_split_file(source_dir, tmp_path):
    manifest = stage(_deepcam_dataset(path=str(source_dir)), tmp_path / "data", tmp_path / "manifest.json")
    assert len(manifest["files"]) == 6 + 3 + 1


@pytest.mark.parametrize(
    "source, message",
    [
        ({"path": "$UNSET_UNIT_VARIABLE/x"}, r"key 'source.path': value '\$UNSET_UNIT_VARIABLE/x' uses unset"),
        ({"path": "/nonexistent/deepcam"}, r"key 'source.path': value '/nonexistent/deepcam'.* is not a directory"),
        ({"path": "$UNIT_DATA/deepcam", "subset": {"train": 7}}, r"key 'source.subset.train': value 7 exceeds the 6"),
    ],
)
def test_bad_path_sources_are_named(source_dir, tmp_path, source, message):
    with pytest.raises(DatasetError, match=message):
        stage(_deepcam_dataset(**source), tmp_path / "data", tmp_path / "manifest.json")


def test_missing_shared_file_is_named(source_dir, tmp_path):
    (source_dir / "stats.h5").unlink()
    with pytest.raises(DatasetError, match=r"stats\.h5 is missing"):
        stage(_deepcam_dataset(path=str(source_dir)), tmp_path / "data", tmp_path / "manifest.json")


# -- staging to the node -----------------------------------------------------------------------
def test_without_staging_dir_the_dataset_is_verified_in_place(staged):
    data_dir, manifest = staged
    assert stage_to_node(data_dir, manifest, None) == data_dir
    victim = data_dir / manifest["files"][0]["path"]
    content = bytearray(victim.read_bytes())
    content[-1] ^= 0xFF  # one flipped byte, same size
    victim.write_bytes(bytes(content))
    with pytest.raises(DatasetError, match=f"corrupted file {victim}"):
        stage_to_node(data_dir, manifest, None)


def test_staging_dir_gets_a_verified_copy_that_later_trials_reuse(staged, tmp_path):
    data_dir, manifest = staged
    scratch = tmp_path / "scratch"
    copy = stage_to_node(data_dir, manifest, str(scratch))
    assert copy == node_copy_dir(str(scratch), manifest) == scratch / f"deepcam-unit-{manifest['dataset_id']}"
    # No temporaries left: the copy, its lock and the note of who verified it last.
    assert sorted(p.name for p in scratch.iterdir()) == [copy.name, copy.name + ".lock", copy.name + ".verified"]
    for entry in manifest["files"]:
        assert sha256_file(copy / entry["path"]) == entry["sha256"]
    assert stage_to_node(data_dir, manifest, str(scratch)) == copy
    victim = copy / manifest["files"][-1]["path"]
    victim.write_bytes(b"changed on the node")
    with pytest.raises(DatasetError, match=f"corrupted file {victim}"):
        stage_to_node(data_dir, manifest, str(scratch))


def test_the_ranks_of_one_launch_verify_the_node_copy_once(staged, tmp_path, monkeypatch):
    """16 ranks on a node must not hash the dataset 16 times: the first verifies, the others of its
    launch read the copy; the next launch (the next trial) verifies again."""
    data_dir, manifest = staged
    scratch = str(tmp_path / "scratch")
    hashed = []
    monkeypatch.setattr(staging, "verify", lambda root, manifest: hashed.append(root))
    for _rank in range(16):
        stage_to_node(data_dir, manifest, scratch, "torchrun-a")
    assert len(hashed) == 1  # the first copied and verified the copy; no other rank hashed it again
    stage_to_node(data_dir, manifest, scratch, "torchrun-b")
    assert hashed[1:] == [node_copy_dir(scratch, manifest)]
    assert launch_id({"TORCHELASTIC_RUN_ID": "x", "SLURM_JOB_ID": "1"}) == "torchrun-x"
    assert launch_id({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}) == "slurm-7.0"
    assert launch_id({"SLURM_JOB_ID": "7"}) is None  # a batch script, not a step: no shared launch


def test_a_file_missing_from_the_staged_dataset_is_named_and_nothing_is_left_behind(staged, tmp_path):
    data_dir, manifest = staged
    victim = data_dir / manifest["files"][1]["path"]
    victim.unlink()
    scratch = tmp_path / "scratch"
    with pytest.raises(DatasetError, match=f"missing file {victim}"):
        stage_to_node(data_dir, manifest, str(scratch))
    assert [p.name for p in scratch.iterdir()] == [f"deepcam-unit-{manifest['dataset_id']}.lock"]


def _deepcam_trial(tmp_path, staging_dir):
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config |= {
        "benchmarks": ["deepcam"],
        "trials": 1,
        "benchmark_overrides": {
            "deepcam": {
                "model": {"options": {"image_height": 32, "image_width": 48, "width": 0.0625, "middle_blocks": 1}},
                "dataset": GENERATED,
                "training": {"epochs_max": 1, "global_batch_size": 2, "eval_batch_size": 2, "warmup_steps": 0},
            }
        },
    }
    campaign = load_campaign(config, REPO / "config")
    spec = campaign.trial_spec(next(campaign.trials()), "test-run", "local")
    spec["system"] = spec["system"] | {"staging_dir": staging_dir}
    stage_into(spec["benchmark"]["dataset"], tmp_path / "dataset")
    return run_trial(spec, tmp_path / "dataset" / ID_FILE, tmp_path / "record.json", tmp_path / "mllog.txt")


def test_trial_stages_to_the_system_staging_dir_and_times_it(tmp_path):
    record = _deepcam_trial(tmp_path, str(tmp_path / "scratch"))
    assert record["status"] == "ok", record["failure"]
    assert record["metrics"]["staging_s"] > 0
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (tmp_path / "mllog.txt").read_text().splitlines()]
    keys = [event["key"] for event in events]
    assert keys.index("staging_start") < keys.index("staging_stop") < keys.index("init_stop") < keys.index("run_start")
    assert (tmp_path / "scratch" / f"deepcam-unit-{record['dataset']['dataset_id']}" / "stats.h5").is_file()


def test_a_node_copy_that_rots_fails_the_next_trial_before_training(tmp_path):
    scratch = tmp_path / "scratch"
    first = _deepcam_trial(tmp_path / "first", str(scratch))
    assert first["status"] == "ok", first["failure"]
    victim = sorted((scratch / f"deepcam-unit-{first['dataset']['dataset_id']}" / "train").iterdir())[0]
    victim.write_bytes(b"bit rot")
    record = _deepcam_trial(tmp_path / "second", str(scratch))
    assert record["status"] == "failed"
    assert record["failure"]["reason"] == "dataset"
    assert str(victim) in record["failure"]["message"]
    assert record["metrics"]["samples_trained"] is None


# -- the workflow ------------------------------------------------------------------------------
@pytest.mark.integration
def test_cosmoflow_and_deepcam_run_as_campaign_cells(tmp_path, write_config):
    """Snakemake stages each dataset in its real format and runs a trial of each benchmark to a record."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    overrides = {name: config["benchmark_overrides"][name] for name in ("cosmoflow", "deepcam")}
    for name, samples in (("cosmoflow", 32), ("deepcam", 16)):
        dataset = overrides[name]["dataset"]
        options = dataset["source"]["options"] | {"train_samples": samples, "val_samples": samples // 2}
        overrides[name] = overrides[name] | {
            "dataset": dataset | {"name": f"{name}-unit", "source": {"options": options}},
            "training": overrides[name]["training"] | {"epochs_max": 1},
        }
    campaign = config | {
        "campaign": "unit-hpc",
        "benchmarks": ["cosmoflow", "deepcam"],
        "trials": 1,
        "benchmark_overrides": overrides,
    }
    result = run_snakemake(tmp_path, write_config(campaign))
    assert result.returncode == 0, result.stderr[-3000:]
    table = pd.read_csv(latest_run(tmp_path, "unit-hpc") / "trials.csv")
    assert sorted(table["trial.benchmark"]) == ["cosmoflow", "deepcam"]
    assert (table["status"] == "ok").all()
    assert set(table["benchmark.target_metric"]) == {"mae", "iou"}
    assert (table["metrics.staging_s"] > 0).all()
    assert (table["flops.train_per_sample"] > 0).all()
    manifest = read_manifest(tmp_path / "results" / "datasets" / "cosmoflow-unit" / "manifest.json")
    assert manifest["format"] == "cosmoflow_tfrecord"
    assert all(entry["path"].endswith(".tfrecord") for entry in manifest["files"])
