"""What a trial costs beyond its training, made cheaper without losing a measurement: FLOP counts from a
cache keyed by everything they depend on, datasets hashed once per node and run, and a trial process
that imports only what it runs (bench/campaign_overhead.py measures the cost)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlcampaign.data import staging
from mlcampaign.data.manifest import DatasetError, read_manifest
from mlcampaign.data.staging import in_place_note, stage_into, stage_to_node
from mlcampaign.measure import flops
from mlcampaign.plan import registry
from mlcampaign.trial.torch import models

from conftest import REPO

COSMOFLOW = models.get("cosmoflow")
TINY = {"input_size": 8, "base_filters": 2, "n_conv_layers": 2, "fc1_size": 8, "fc2_size": 8}
SHAPE = (4, 8, 8, 8)


# -- FLOP counts -----------------------------------------------------------------------------------
@pytest.fixture
def counts(monkeypatch):
    """The calls of count_flops (the counter itself still runs)."""
    calls = []
    original = flops.count_flops

    def counting(build, options, shape, batch=2):
        calls.append((dict(options), tuple(shape)))
        return original(build, options, shape, batch)

    monkeypatch.setattr(flops, "count_flops", counting)
    return calls


def test_a_cached_flop_count_is_the_count(tmp_path, counts):
    counted = flops.count_flops(COSMOFLOW.build, TINY, SHAPE)
    first = flops.cached_flop_count("cosmoflow", COSMOFLOW.build, TINY, SHAPE, tmp_path)
    again = flops.cached_flop_count("cosmoflow", COSMOFLOW.build, TINY, SHAPE, tmp_path)
    assert first == again == counted  # exactly: the record's figures do not change
    assert len(counts) == 2  # the direct count and the first cached one; the second was read
    (entry,) = tmp_path.glob("*.json")
    assert json.loads(entry.read_text())["key"]["model"] == "cosmoflow"


@pytest.mark.parametrize(
    "change",
    [
        {"options": TINY | {"base_filters": 4}},
        {"shape": (4, 16, 16, 16), "options": TINY | {"input_size": 16}},
        {"model": "cosmoflow-other-name"},
    ],
)
def test_a_change_of_options_shape_or_model_is_counted_again(tmp_path, counts, change):
    flops.cached_flop_count("cosmoflow", COSMOFLOW.build, TINY, SHAPE, tmp_path)
    options, shape = change.get("options", TINY), change.get("shape", SHAPE)
    changed = flops.cached_flop_count(change.get("model", "cosmoflow"), COSMOFLOW.build, options, shape, tmp_path)
    assert changed == flops.count_flops(COSMOFLOW.build, options, shape)
    assert len(counts) == 3 and len(list(tmp_path.glob("*.json"))) == 2


def test_a_change_of_torch_or_of_the_model_code_is_counted_again(tmp_path, counts, monkeypatch):
    flops.cached_flop_count("cosmoflow", COSMOFLOW.build, TINY, SHAPE, tmp_path)
    code = flops._counting_code()
    for key in ("torch", "torchvision", "sources_sha256"):
        monkeypatch.setattr(flops, "_counting_code", lambda key=key: code | {key: "changed"})
        flops.cached_flop_count("cosmoflow", COSMOFLOW.build, TINY, SHAPE, tmp_path)
    assert len(counts) == 4


def test_the_model_sources_are_in_the_key():
    assert Path(flops.__file__) in flops.COUNTED_SOURCES
    for name in registry.models():  # every benchmark's torch model
        assert Path(registry.resolve(registry.models()[name].torch.partition(":")[0]).__file__) in flops.COUNTED_SOURCES


@pytest.mark.parametrize("damage", ["truncated", "other key", "not a number"])
def test_a_damaged_cache_entry_is_counted_again_and_rewritten(tmp_path, counts, damage):
    first = flops.cached_flop_count("cosmoflow", COSMOFLOW.build, TINY, SHAPE, tmp_path)
    (entry,) = tmp_path.glob("*.json")
    content = json.loads(entry.read_text())
    if damage == "truncated":
        entry.write_text(entry.read_text()[:20])
    elif damage == "other key":
        entry.write_text(json.dumps(content | {"key": content["key"] | {"batch": 3}}))
    else:
        entry.write_text(json.dumps(content | {"train_per_sample": "many"}))
    assert flops.cached_flop_count("cosmoflow", COSMOFLOW.build, TINY, SHAPE, tmp_path) == first
    assert len(counts) == 2
    assert json.loads(entry.read_text()) == content


def test_a_cache_that_cannot_be_written_costs_a_count_only(tmp_path, counts, capsys):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    count = flops.cached_flop_count("cosmoflow", COSMOFLOW.build, TINY, SHAPE, blocked)
    assert count == flops.count_flops(COSMOFLOW.build, TINY, SHAPE)
    assert "could not be cached" in capsys.readouterr().err


# -- datasets verified once per node and run --------------------------------------------------------
@pytest.fixture
def staged(tmp_path):
    """A small staged dataset whose files were written long ago (not 'racily' recent), and a record of hashing."""
    dataset = {
        "name": "cosmoflow-unit-8",
        "format": "cosmoflow_tfrecord",
        "source": {"generator": "cosmoflow_universes", "options": {"train_samples": 4, "val_samples": 2, "size": 8}},
    }
    root = tmp_path / "dataset"
    stage_into(dataset, root)
    long_ago = 1_700_000_000_000_000_000
    for path in (root / "data").rglob("*"):
        os.utime(path, ns=(long_ago, long_ago))
    return root / "data", read_manifest(root / "manifest.json")


@pytest.fixture
def hashed(monkeypatch):
    roots = []
    original = staging.verify

    def verify(root, manifest):
        roots.append(root)
        original(root, manifest)

    monkeypatch.setattr(staging, "verify", verify)
    return roots


def test_in_place_the_first_trial_of_a_run_hashes_and_the_others_do_not(staged, hashed):
    data_dir, manifest = staged
    for _trial in range(3):
        assert stage_to_node(data_dir, manifest, None, None, "campaign/run-1") == data_dir
    assert hashed == [data_dir]
    stage_to_node(data_dir, manifest, None, None, "campaign/run-2")  # the next run hashes again
    stage_to_node(data_dir, manifest, None, None, None)  # as does a caller that names no run
    assert hashed == [data_dir] * 3
    note = json.loads(in_place_note(data_dir).read_text())
    assert (note["run"], note["dataset_id"]) == ("campaign/run-2", manifest["dataset_id"])


@pytest.mark.parametrize("change", ["rewritten", "removed", "added"])
def test_a_file_changed_within_the_run_is_hashed_and_named(staged, hashed, change):
    data_dir, manifest = staged
    stage_to_node(data_dir, manifest, None, None, "campaign/run-1")
    victim = data_dir / manifest["files"][0]["path"]
    if change == "rewritten":
        content = bytearray(victim.read_bytes())
        content[-1] ^= 0xFF  # one flipped byte, same size
        victim.write_bytes(bytes(content))
        expected = f"corrupted file {victim}"
    elif change == "removed":
        victim.unlink()
        expected = f"missing file {victim}"
    else:
        victim = victim.with_name("stray.tfrecord")
        victim.write_bytes(b"x")
        expected = f"unexpected file {victim}"
    with pytest.raises(DatasetError, match=expected):
        stage_to_node(data_dir, manifest, None, None, "campaign/run-1")


def test_what_metadata_cannot_show_is_found_by_the_next_run(staged):
    """A file rewritten in place with its size and mtime restored passes the rest of the run (the
    documented limit), and the first trial of the next run names it."""
    data_dir, manifest = staged
    stage_to_node(data_dir, manifest, None, None, "campaign/run-1")
    victim = data_dir / manifest["files"][0]["path"]
    before = victim.stat()
    content = bytearray(victim.read_bytes())
    content[-1] ^= 0xFF
    with open(victim, "r+b") as file:  # the same inode
        file.write(bytes(content))
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    stage_to_node(data_dir, manifest, None, None, "campaign/run-1")
    with pytest.raises(DatasetError, match=f"corrupted file {victim}"):
        stage_to_node(data_dir, manifest, None, None, "campaign/run-2")


def test_recently_written_files_are_hashed_again(staged, hashed):
    """A file modified just before its metadata was read may change again unseen within one tick of the
    filesystem's clock: its verification is not reused."""
    data_dir, manifest = staged
    victim = data_dir / manifest["files"][0]["path"]
    os.utime(victim)  # now
    stage_to_node(data_dir, manifest, None, None, "campaign/run-1")
    stage_to_node(data_dir, manifest, None, None, "campaign/run-1")
    assert len(hashed) == 2


def test_a_node_copy_is_hashed_once_per_run_across_launches(staged, hashed, tmp_path):
    data_dir, manifest = staged
    scratch = str(tmp_path / "scratch")
    copy = stage_to_node(data_dir, manifest, scratch, "torchrun-a", "campaign/run-1")
    assert len(hashed) == 1  # the copy was hashed (under its temporary name, before its rename)
    long_ago = 1_700_000_000_000_000_000
    for path in copy.rglob("*"):
        os.utime(path, ns=(long_ago, long_ago))  # as if the copy were made long ago
    stage_to_node(data_dir, manifest, scratch, "torchrun-b", "campaign/run-1")  # too recent a copy: hashed
    stage_to_node(data_dir, manifest, scratch, "torchrun-c", "campaign/run-1")
    stage_to_node(data_dir, manifest, scratch, "torchrun-d", "campaign/run-1")
    assert hashed[1:] == [copy]
    stage_to_node(data_dir, manifest, scratch, "torchrun-e", "campaign/run-2")
    assert hashed[1:] == [copy, copy]


# -- what a trial process imports ------------------------------------------------------------------
def test_the_torch_trial_and_its_supervisor_import_no_other_framework_and_no_analysis_library():
    """The trial job's supervisor and a torch trial process import neither TensorFlow nor the analysis's
    libraries (pandas, scipy, matplotlib), nor the FLOP counter where the count is cached."""
    code = (
        "import sys; import mlcampaign.trial.__main__, mlcampaign.trial.torch.trial, mlcampaign.job.supervisor; "
        "from mlcampaign.trial.torch import models; from mlcampaign.plan.registry import models as registered; "
        "[models.get(name) for name in registered()]; "
        "unwanted = ('tensorflow', 'keras', 'pandas', 'scipy', 'matplotlib', 'torch.utils.flop_counter'); "
        "print(sorted(m for m in unwanted if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
