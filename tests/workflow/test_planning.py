"""Integration: the real snakemake CLI refuses, while it plans and before any job, what would otherwise
fail hours later or never: a YAML alias bomb (in a campaign file or in --config), a run id that the results
store holds as another campaign's run, run starts that a wrong clock put out of order, a campaign name no
folder can have; and it reads an earlier run's files within bounds (docs/history.md, Trust and bounds)."""

import json
import os
import re
import time
from pathlib import Path

import pytest

from mlcampaign.cli import EXIT_USAGE, main
from mlcampaign.history.store import open_store
from mlcampaign.plan.config_files import MAX_YAML_VALUES
from mlcampaign.records.files import write_json_atomic

from conftest import REPO, run_snakemake

pytestmark = pytest.mark.integration


def campaign(name: str) -> dict:
    return {
        "campaign": name,
        "seed": 11,
        "trials": 1,
        "systems": ["local-cpu"],
        "benchmarks": ["resnet50-synthetic"],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
    }


def test_an_alias_bomb_stops_snakemake_at_once_naming_file_and_line(tmp_path):
    """Nine levels of nine aliases (387 million strings) in 460 bytes; took 578 s to be refused before."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * 9)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    configfile = tmp_path / "bomb.yaml"
    configfile.write_text("\n".join([*lines, "campaign: bomb", "bomb: *l8"]) + "\n")
    started = time.monotonic()
    result = run_snakemake(tmp_path, configfile, "-n", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(rf"{re.escape(str(configfile))}:\d+:\d+: not valid YAML: .* values, aliases expanded", output), (
        output
    )
    assert time.monotonic() - started < 120


def test_an_alias_bomb_in_config_stops_snakemake_at_once_naming_the_key(tmp_path):
    """Snakemake reads a --config value as YAML, its aliases as shared lists: 387 million strings in 230 bytes,
    which planned for minutes before. (A bomb of nested mappings stalls inside Snakemake's own merging, before
    the workflow is read: docs/history.md, Trust and bounds.)"""
    levels = ["&l0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    configfile = tmp_path / "campaign.yaml"
    configfile.write_text(json.dumps(campaign("bomb")))
    started = time.monotonic()
    result = run_snakemake(tmp_path, configfile, "-n", "--config", f"description=[{', '.join(levels)}]", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"--config: key 'description': the document holds more than {MAX_YAML_VALUES} values" in output, output
    assert time.monotonic() - started < 60


def _nested(path: Path) -> str:
    path.write_text("[" * 100_000 + "]" * 100_000)
    return "not JSON this reader takes: nested deeper than Python's recursion limit"


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return "not a regular file (a named pipe, which would wait for a writer)"


def _link_to_dev_zero(path: Path) -> str:
    path.symlink_to("/dev/zero")
    return "a link (to '/dev/zero'); a run's files are read as regular files, never through a link"


EARLIER_FILES = [_nested, _fifo, _link_to_dev_zero]


def test_earlier_summaries_that_cannot_be_read_are_named_and_left_out_of_planning(tmp_path):
    """Planning's detection warnings read every earlier run's summary.json: one nested 100 000 deep failed
    planning with a traceback naming no file, a named pipe hung it, a link to /dev/zero read until memory
    ran out. Each is named with the bound it breaks and left out; planning goes on."""
    runs = tmp_path / "results" / "delta" / "runs"
    expected = {}
    for make in EARLIER_FILES:
        summary = runs / make.__name__.strip("_") / "summary.json"
        summary.parent.mkdir(parents=True)
        expected[summary.relative_to(tmp_path)] = make(summary)
    configfile = tmp_path / "delta.yaml"
    configfile.write_text(json.dumps(campaign("delta")))
    started = time.monotonic()
    result = run_snakemake(tmp_path, configfile, "-n", run="r1", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    for path, refusal in expected.items():
        assert f"regression: {path}: {refusal}" in output, output[-3000:]
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("make", EARLIER_FILES, ids=["nested 100 000 deep", "named pipe", "link to /dev/zero"])
def test_an_earlier_run_manifest_that_cannot_be_read_stops_planning_naming_it(tmp_path, make):
    """Planning reads every earlier run's run.json (which run is latest, and whether a new one starts after it):
    one that cannot be read within bounds stops it at once, naming the file and the bound."""
    manifest = tmp_path / "results" / "epsilon" / "runs" / "earlier" / "run.json"
    manifest.parent.mkdir(parents=True)
    refusal = make(manifest)
    configfile = tmp_path / "epsilon.yaml"
    configfile.write_text(json.dumps(campaign("epsilon")))
    started = time.monotonic()
    result = run_snakemake(tmp_path, configfile, "-n", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{manifest.relative_to(tmp_path)}: {refusal}" in output, output[-3000:]
    assert time.monotonic() - started < 60


def test_a_campaign_name_no_folder_can_have_is_refused_by_check_and_planning(tmp_path, capsys):
    """A 300-character name passed `mlcampaign check` and then failed `snakemake -n` with "File name too long"."""
    configfile = tmp_path / "long.yaml"
    configfile.write_text(json.dumps(campaign("c" * 300)))
    (tmp_path / "results").mkdir()
    assert main(["check", str(configfile), "--config-dir", str(REPO / "config")]) == EXIT_USAGE
    assert f"{configfile}: key 'campaign': value '{'c' * 50}" in capsys.readouterr().err
    result = run_snakemake(tmp_path, configfile, "-n")
    output = result.stdout + result.stderr
    assert result.returncode != 0 and f"{configfile}: key 'campaign'" in output, output[-3000:]
    assert "File name too long" not in output


def test_a_run_id_of_another_campaign_in_the_store_is_refused_before_any_trial(tmp_path):
    (tmp_path / "results").mkdir()
    with open_store(f"sqlite:///{tmp_path}/results/history.db") as store:
        store.ingest({"run_id": "t1", "campaign": "alpha", "site": "local", "started_utc": "2026-01-05T08:00:00Z"}, [])
    configfile = tmp_path / "beta.yaml"
    configfile.write_text(json.dumps(campaign("beta")))
    result = run_snakemake(tmp_path, configfile, "--cores", "1", run="t1")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "run id 't1' is already in results store" in output and "as a run of campaign 'alpha'" in output, output
    assert not (tmp_path / "results" / "beta").exists()


def test_runs_a_wrong_clock_put_out_of_order_are_refused_before_any_trial(tmp_path):
    """A run folder of this site dated 2099 (its machine's clock was ahead): continuing it, and starting a
    new run that would be older than it, are both refused."""
    ahead = tmp_path / "results" / "gamma" / "runs" / "ahead"
    write_json_atomic(
        {"run_id": "ahead", "site": "local", "started_utc": "2099-01-01T00:00:00+00:00"}, ahead / "run.json"
    )
    configfile = tmp_path / "gamma.yaml"
    configfile.write_text(json.dumps(campaign("gamma")))
    for run, expected in (
        ("ahead", "key 'started_utc': value '2099-01-01T00:00:00+00:00' is after this machine's clock"),
        ("new", "would start at"),
    ):
        result = run_snakemake(tmp_path, configfile, "--cores", "1", run=run)
        output = result.stdout + result.stderr
        assert result.returncode != 0 and expected in output, output[-3000:]
        assert sorted(path.name for path in ahead.parent.iterdir()) == ["ahead"]
        assert sorted(path.name for path in ahead.iterdir()) == ["run.json"]
