"""Issue #33's whole path, through the real workflow: a forged bundle of this site's run (an earlier attempt of
a trial, its time to train 100 times shorter), which the store import refuses, sent through ``mlcampaign import
--results`` into the site's results folder and then the workflow's ingest, never reaches the store; a forged
bundle of a new run that claims this site is imported as another site's run, which the workflow neither
continues nor ingests. The site's run is a finished one written in place (records, a staged dataset), so the
workflow runs only its manifest and ingest rules."""

from __future__ import annotations

import hashlib
import io
import json
import sqlite3
import tarfile

import numpy as np
import pytest
import synthetic_records as synthetic
import yaml

from mlcampaign.cli import main
from mlcampaign.records.files import content_sha256, write_json_atomic

from conftest import run_path, run_snakemake

pytestmark = pytest.mark.integration

CAMPAIGN = "forged"
DATASET = "synthetic-images-32"  # resnet50-synthetic's


def finished_run(workdir) -> list[dict]:
    """Run r1 of the campaign as its trials leave it: two records, and the dataset they trained on staged."""
    dataset = workdir / "results" / "datasets" / DATASET
    (dataset / "data").mkdir(parents=True)
    manifest = {"manifest_version": 1, "name": DATASET, "format": "synthetic", "files": [], "dataset_id": "0" * 16}
    write_json_atomic(manifest, dataset / "manifest.json")
    (dataset / "dataset_id").write_text("0" * 16 + "\n")
    records = []
    for trial in range(2):
        row = synthetic.plan_row("local-cpu", "resnet50-synthetic", "1x1", "fp32", trial)
        record = synthetic.record(row, np.random.default_rng(trial))
        record["trial"]["campaign"], record["run"] = CAMPAIGN, {"id": "r1", "site": "local"}
        record["dataset"]["name"] = DATASET
        folder = workdir / run_path(CAMPAIGN, "r1", "trials", "local-cpu", "resnet50-synthetic", row["cell"])
        write_json_atomic(record, folder / f"trial{trial}-rep0" / "record.json")
        (folder / f"trial{trial}-rep0" / "mllog.txt").write_text(':::MLLOG {"key": "run_stop"}\n')
        records.append(record)
    return records


def rewritten(source, target, change) -> None:
    """The bundle ``source`` as ``target``: ``change(members)`` edits its members (name -> bytes) in place, and
    its checksum list is computed again, as a forger would."""
    with tarfile.open(source, "r:gz") as archive:
        members = {entry.name: archive.extractfile(entry).read() for entry in archive}
    del members["SHA256SUMS"]
    change(members)
    listing = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in members.items()).encode()
    with tarfile.open(target, "w:gz") as archive:
        for name, data in {"SHA256SUMS": listing, **members}.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            archive.addfile(entry, io.BytesIO(data))


def store_rows(store) -> list[tuple]:
    database = sqlite3.connect(store)
    try:
        return database.execute("SELECT * FROM runs").fetchall() + database.execute("SELECT * FROM records").fetchall()
    finally:
        database.close()


def test_a_forged_bundle_never_reaches_the_store_through_the_site_s_results_folder(tmp_path, capsys):
    store = tmp_path / "results" / "history.db"
    configfile = tmp_path / "campaign.yaml"
    configfile.write_text(
        yaml.safe_dump(
            {
                "campaign": CAMPAIGN,
                "seed": 3,
                "trials": 2,
                "systems": ["local-cpu"],
                "benchmarks": ["resnet50-synthetic"],
                "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
                "history": {"store": f"sqlite:///{store}"},
            }
        )
    )
    records = finished_run(tmp_path)
    ingested = run_path(CAMPAIGN, "r1", "ingested.json")
    result = run_snakemake(tmp_path, configfile, "--cores", "1", ingested, run="r1")
    assert result.returncode == 0 and "rule trial:" not in result.stderr, result.stderr[-3000:]
    rows = store_rows(store)
    assert len(rows) == 3  # the run and its two records

    # The forger's bundle: the site's own export with an earlier attempt of trial 0, 100 times faster.
    assert main(["export", str(tmp_path / run_path(CAMPAIGN, "r1")), "--out", str(tmp_path / "own.tar.gz")]) == 0
    faster = json.loads(json.dumps(records[0]))
    faster["metrics"]["time_to_train_s"] /= 100
    trial = run_path(CAMPAIGN, "r1", "trials", "local-cpu", "resnet50-synthetic", "1x1-fp32", "trial0-rep0")
    forged = tmp_path / "forged.tar.gz"
    rewritten(
        tmp_path / "own.tar.gz",
        forged,
        lambda members: members.update(
            {f"{trial.removeprefix('results/')}/superseded/{content_sha256(faster)}.json": json.dumps(faster).encode()}
        ),
    )
    capsys.readouterr()
    assert main(["--store", f"sqlite:///{store}", "import", str(forged)]) == 2
    assert "would get another record" in capsys.readouterr().err
    folder = tmp_path / run_path(CAMPAIGN, "r1")
    before = sorted(path for path in folder.rglob("*") if path.is_file())
    assert main(["import", "--results", str(tmp_path / "results"), str(forged)]) == 2
    assert "a run folder this site produced" in capsys.readouterr().err
    assert sorted(path for path in folder.rglob("*") if path.is_file()) == before

    # The site's next ingest, by its workflow: the store is as it was.
    result = run_snakemake(tmp_path, configfile, "--cores", "1", "--forcerun", "ingest", "--", ingested, run="r1")
    assert result.returncode == 0 and "rule ingest:" in result.stderr, result.stderr[-3000:]
    assert store_rows(store) == rows
    assert str(faster["metrics"]["time_to_train_s"]) not in str(rows)

    # A forged bundle of a new run that claims this site: imported as another site's run, which the workflow
    # neither continues (its latest run stays r1) nor takes as its own (--config run=r9 is refused).
    def new_run(members):
        for name in list(members):
            data = members.pop(name)
            if name == "bundle.json" or name.endswith("/run.json"):
                data = json.dumps(json.loads(data) | {"run_id": "r9"}).encode()
            elif name.endswith("/record.json"):
                data = json.dumps(json.loads(data) | {"run": {"id": "r9", "site": "local"}}).encode()
            members[name.replace("/runs/r1/", "/runs/r9/")] = data

    rewritten(tmp_path / "own.tar.gz", tmp_path / "r9.tar.gz", new_run)
    assert main(["import", "--results", str(tmp_path / "results"), str(tmp_path / "r9.tar.gz")]) == 0
    result = run_snakemake(tmp_path, configfile, "--cores", "1", "-n")
    assert result.returncode == 0 and "runs/r9" not in result.stdout + result.stderr, result.stderr[-3000:]
    assert "runs/r1" in result.stdout + result.stderr
    result = run_snakemake(tmp_path, configfile, "--cores", "1", "-n", run="r9")
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "run r9 of campaign forged was imported from a bundle" in output, output[-3000:]
    assert store_rows(store) == rows
