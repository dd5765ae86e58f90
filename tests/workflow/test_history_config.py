"""Integration: planning a campaign through the real snakemake CLI stops on what the history path cannot
use, naming it: a store URL with a password (never shown) and an earlier run's damaged manifest."""

import json

import pytest

from conftest import run_snakemake

pytestmark = pytest.mark.integration


def test_a_store_url_with_a_password_given_by_config_is_refused_without_showing_it(
    tmp_path, write_config, default_campaign
):
    configfile = write_config(default_campaign)
    store = "history={store: 'postgresql://user:hunter2@db.example.org/history'}"
    result = run_snakemake(tmp_path, configfile, "--dry-run", "--config", store)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "key 'history.store': value 'postgresql://user:***@db.example.org/history'" in output
    assert "hunter2" not in output


def test_an_earlier_run_manifest_without_a_site_is_named(tmp_path, write_config, default_campaign):
    configfile = write_config(default_campaign)
    damaged = tmp_path / "results" / default_campaign["campaign"] / "runs" / "earlier" / "run.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text(json.dumps({"run_id": "earlier", "started_utc": "2026-12-01T08:00:00+00:00"}))
    result = run_snakemake(tmp_path, configfile, "--dry-run")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "runs/earlier/run.json: not a run manifest: key 'site': value None is not text" in output
    assert "KeyError" not in output
