"""Clocks and the order of runs and attempts: a run dated in the future is refused at ingest, one older
than its site's latest is ingested with a warning (and refused when planned); a run id of another run
is refused when planned; and a trial's current record is its run folder's record.json whatever the
finish times that the nodes' clocks wrote, in the store's summary and in its export as in the folder."""

from __future__ import annotations

import datetime
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import synthetic_records as synthetic

from mlcampaign.cli import EXIT_CANNOT_TELL, EXIT_OK, EXIT_USAGE, main
from mlcampaign.history.store import ManifestError, RunConflictError, open_store
from mlcampaign.plan.config_files import ConfigError
from mlcampaign.plan.runs import Run, check_run_start
from mlcampaign.records.files import content_sha256, write_json_atomic

CAMPAIGN = "synthetic"
ROW = synthetic.plan_row("local-cpu", "resnet50", "1x1", "fp32", 0)
TRIAL_DIR = "trials/local-cpu/resnet50/1x1-fp32/trial0-rep0"


def days_ago(days: float) -> str:
    return (datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=days)).isoformat(timespec="seconds")


def run_manifest(run_id: str, started_utc: str, campaign: str = CAMPAIGN, site: str = "local") -> dict:
    return {
        "run_id": run_id,
        "campaign": campaign,
        "site": site,
        "started_utc": started_utc,
        "campaign_config": synthetic.HISTORY_CAMPAIGN_CONFIG | {"campaign": campaign},
        "systems": {"local-cpu": {"site": site}},
        "benchmarks": {"resnet50": synthetic.benchmark_config()},
        "plan": [ROW | {"at_site": True}],
        "unplanned": [],
        "workflow_commit": None,
    }


def trial_record(run_id: str, finished_utc: str, failure_reason: str | None = None, site: str = "local") -> dict:
    record = synthetic.record(ROW, np.random.default_rng(0), failure_reason=failure_reason)
    record["run"] = {"id": run_id, "site": site}
    record["trial"]["campaign"] = CAMPAIGN
    record["provenance"]["finished_utc"] = finished_utc
    return record


def write_run(results: Path, manifest: dict, current: dict, earlier: list[dict] = ()) -> Path:
    """A run folder as the workflow leaves it: the trial's record.json and its earlier attempts."""
    run_dir = results / manifest["campaign"] / "runs" / manifest["run_id"]
    write_json_atomic(manifest, run_dir / "run.json")
    write_json_atomic(current, run_dir / TRIAL_DIR / "record.json")
    for record in earlier:
        write_json_atomic(record, run_dir / TRIAL_DIR / "superseded" / f"{content_sha256(record)}.json")
    dataset = current["dataset"]
    write_json_atomic(
        {"manifest_version": 1, "name": dataset["name"], "format": "synthetic", "files": [], "dataset_id": "0" * 16},
        results / "datasets" / dataset["name"] / "manifest.json",
    )
    return run_dir


def cli(store: str, *arguments: str) -> int:
    return main(["--store", store, *arguments])


# -- run starts --------------------------------------------------------------------------------------


def test_a_run_that_starts_in_the_future_is_refused_at_ingest_and_import(tmp_path, capsys):
    store = f"sqlite:///{tmp_path / 'history.db'}"
    run_dir = write_run(
        tmp_path / "results", run_manifest("r2099", "2099-01-01T00:00:00+00:00"), trial_record("r2099", days_ago(1))
    )
    assert cli(store, "ingest", str(run_dir)) == EXIT_USAGE
    error = capsys.readouterr().err
    assert (
        "run 'r2099': key 'started_utc': value '2099-01-01T00:00:00.000000+00:00' is after this machine's clock"
        in error
    )
    assert cli(store, "export", str(run_dir), "--out", str(tmp_path / "r2099.tar.gz")) == EXIT_OK
    assert cli(store, "import", str(tmp_path / "r2099.tar.gz")) == EXIT_USAGE
    assert "is after this machine's clock" in capsys.readouterr().err
    with open_store(store) as results:
        assert results.list_runs() == []  # never the site's "latest"


def test_a_new_run_older_than_its_site_s_latest_is_ingested_with_a_warning(tmp_path, capsys):
    store = f"sqlite:///{tmp_path / 'history.db'}"
    latest = write_run(tmp_path / "results", run_manifest("week2", days_ago(2)), trial_record("week2", days_ago(2)))
    late = write_run(tmp_path / "results", run_manifest("week1", days_ago(9)), trial_record("week1", days_ago(9)))
    assert cli(store, "ingest", str(latest)) == EXIT_OK
    assert "warning" not in capsys.readouterr().err
    assert cli(store, "ingest", str(late)) == EXIT_OK
    output = capsys.readouterr()
    assert "mlcampaign ingest: warning: " in output.err and "before run 'week2'" in output.err
    assert json.loads(output.out)["warnings"]
    assert cli(store, "ingest", str(late)) == EXIT_OK  # a stored run is its own
    assert "warning" not in capsys.readouterr().err


def test_planning_refuses_what_ingest_would(tmp_path):
    with open_store(f"sqlite:///{tmp_path / 'history.db'}") as results:
        results.ingest(run_manifest("t1", days_ago(3), campaign="epcc-2024"), [])
        results.ingest(run_manifest("week2", days_ago(2)), [])
        with pytest.raises(RunConflictError, match=r"already in results store .* as a run of campaign 'epcc-2024'"):
            results.check_planned_run("t1", CAMPAIGN, "local", days_ago(0), new=True)
        with pytest.raises(ManifestError, match=r"before run 'week2' .* this machine's clock is behind"):
            results.check_planned_run("week3", CAMPAIGN, "local", days_ago(5), new=True)
        with pytest.raises(ManifestError, match="is after this machine's clock"):
            results.check_planned_run("week9", CAMPAIGN, "local", "2099-01-01T00:00:00+00:00", new=True)
        results.check_planned_run("week2", CAMPAIGN, "local", days_ago(2), new=False)  # the run itself
        results.check_planned_run("week3", CAMPAIGN, "local", days_ago(0), new=True)
        results.check_planned_run("week3", CAMPAIGN, "elsewhere", days_ago(5), new=True)  # another site's order


def test_planning_refuses_a_run_out_of_order_with_the_site_s_run_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = Path("results") / CAMPAIGN / "runs"
    write_json_atomic(run_manifest("ahead", "2099-01-01T00:00:00+00:00"), runs / "ahead" / "run.json")
    now = days_ago(0)
    with pytest.raises(ConfigError, match="before run ahead of campaign synthetic at site local"):
        check_run_start(CAMPAIGN, Run("new-run", "local", runs / "new-run", now, created=True))
    with pytest.raises(ConfigError, match=r"ahead/run.json: key 'started_utc': value '2099.*after this machine's"):
        check_run_start(CAMPAIGN, Run("ahead", "local", runs / "ahead", "2099-01-01T00:00:00+00:00", created=False))
    check_run_start(CAMPAIGN, Run("new-run", "elsewhere", runs / "new-run", now, created=True))


# -- current records ---------------------------------------------------------------------------------


def bundle_record(bundle: Path) -> dict:
    with tarfile.open(bundle) as archive:
        (member,) = [entry for entry in archive if entry.name.endswith(f"{TRIAL_DIR}/record.json")]
        return json.loads(archive.extractfile(member).read())


@pytest.mark.parametrize("ingests", ["after the re-run", "before and after the re-run"])
def test_the_run_folder_s_record_is_the_current_outcome_whatever_the_finish_times(tmp_path, capsys, ingests):
    """The first attempt failed on a node whose clock was an hour ahead: it 'finished' after the re-run."""
    store = f"sqlite:///{tmp_path / 'history.db'}"
    manifest = run_manifest("r1", days_ago(1))
    failure = trial_record("r1", days_ago(0.5), failure_reason="timeout")
    success = trial_record("r1", days_ago(0.5 + 1 / 24))
    if ingests == "before and after the re-run":
        first = write_run(tmp_path / "before", manifest, failure)
        assert cli(store, "ingest", str(first)) == EXIT_OK
    run_dir = write_run(tmp_path / "results", manifest, success, [failure])
    assert cli(store, "ingest", str(run_dir)) == EXIT_OK
    capsys.readouterr()

    # A first run's cells cannot tell yet whether they changed (exit 4); a current failure would make it 3.
    assert cli(store, "summary", "r1") == EXIT_CANNOT_TELL
    assert json.loads(capsys.readouterr().out)["trials"] | {"planned": 1} == {
        "planned": 1,
        "ok": 1,
        "failed": 0,
        "not_run": 0,
        "contended": 0,
    }
    assert cli(store, "export", "r1", "--out", str(tmp_path / "r1.tar.gz")) == EXIT_OK
    assert bundle_record(tmp_path / "r1.tar.gz") == success
    # The exported run imported elsewhere keeps the same current outcome.
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    assert cli(elsewhere, "import", str(tmp_path / "r1.tar.gz")) == EXIT_OK
    with open_store(elsewhere) as results:
        assert [record["status"] for record in results.records(["r1"])["r1"]] == ["failed", "ok"]
