"""Integration: the real snakemake CLI refuses, while it plans and before any job, what would otherwise
fail hours later or never: a YAML alias bomb, a run id that the results store holds as another
campaign's run, and run starts that a wrong clock put out of order."""

import json
import re
import time

import pytest

from mlcampaign.history.store import open_store
from mlcampaign.records.files import write_json_atomic

from conftest import run_snakemake

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
