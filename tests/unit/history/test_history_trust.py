"""The history commands against forged and malformed input, second pass (issue #33), each through the command
line: forged files through ``import --results`` (the store import's checks, never into a run folder the site
produced, never superseding from an imported folder), numbers that are not numbers (run.json, ``valid-flops``),
sites and names that are not what they say, and bundles whose checksum list announces more members than a
bundle may hold. Each is refused with a message naming what is wrong and exit status 2; nothing is written."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sqlite3
import tarfile
import unicodedata
from pathlib import Path

import pytest
import yaml
from test_bundle import RUN, files_under, member_of, raw_members, write_members, write_run_directory
from test_history_cli import cli, refused
from test_store import synthetic_record

from mlcampaign.history.bundle import export_run_directory, limits, reading
from mlcampaign.plan.config_files import ConfigError
from mlcampaign.plan.runs import IMPORTED_MARKER, latest_run, resolve_run
from mlcampaign.records.files import content_sha256, write_json_atomic


@pytest.fixture
def run_records() -> list[dict]:
    return [synthetic_record(i) for i in range(2)]


def store_rows(store: str) -> list[tuple]:
    database = sqlite3.connect(store.removeprefix("sqlite:///"))
    try:
        return database.execute("SELECT * FROM runs").fetchall() + database.execute("SELECT * FROM records").fetchall()
    finally:
        database.close()


def forged(tmp_path: Path, bundle: Path, record: dict, *, name: str = "forged.tar.gz") -> tuple[Path, dict]:
    """``bundle`` with a forged earlier attempt of ``record``'s trial: its time to train 100 times shorter."""
    members = raw_members(bundle)
    faster = json.loads(members[member_of(record)])
    faster["metrics"]["time_to_train_s"] /= 100
    members[member_of(record, f"superseded/{content_sha256(faster)}.json")] = json.dumps(faster).encode()
    return write_members(tmp_path / name, members, checksums=True), faster


def with_members(tmp_path: Path, bundle: Path, change, name: str = "changed.tar.gz") -> Path:
    """``bundle`` with its JSON members changed by ``change(name, document)`` (its checksum list recomputed)."""
    members = {}
    for member, data in raw_members(bundle).items():
        if member.endswith(".json"):
            document = json.loads(data)
            change(member, document)
            if document != json.loads(data):  # Python's json writes NaN as a bare word, as a forger's tool may
                data = json.dumps(document).encode()
        members[member] = data
    return write_members(tmp_path / name, members, checksums=True)


# 1: forged files through `mlcampaign import --results`.


def test_an_import_never_writes_into_a_run_folder_the_site_produced(capsys, tmp_path, run_records):
    results = tmp_path / "results"
    run_dir = write_run_directory(results, run_records)
    store = f"sqlite:///{tmp_path}/history.db"
    assert cli(capsys, "--store", store, "ingest", str(run_dir))[0] == 0
    rows, before = store_rows(store), files_under(results)
    bundle, faster = forged(tmp_path, export_run_directory(run_dir, tmp_path / "own.tar.gz"), run_records[0])

    # The store refuses it; the results folder, the site's own, refuses it too, naming the folder.
    assert "would get another record" in refused(capsys, "--store", store, "import", str(bundle))
    err = refused(capsys, "import", "--results", str(results), str(bundle))
    assert f"would be written into {results / RUN}, a run folder this site produced" in err
    assert files_under(results) == before
    # So the site's next ingest of its run stores nothing of it.
    assert cli(capsys, "--store", store, "ingest", str(run_dir))[0] == 0
    assert store_rows(store) == rows and str(faster["metrics"]["time_to_train_s"]) not in str(rows)


def test_an_import_into_a_results_folder_makes_the_checks_of_a_store_import(capsys, tmp_path, run_records):
    site_a = write_run_directory(tmp_path / "site-a", run_records)
    genuine = export_run_directory(site_a, tmp_path / "genuine.tar.gz")
    results = tmp_path / "results"
    assert cli(capsys, "import", "--results", str(results), str(genuine))[0] == 0
    assert (results / RUN / IMPORTED_MARKER).is_file()
    before = files_under(results)

    bundle, _ = forged(tmp_path, genuine, run_records[0])
    err = refused(capsys, "import", "--results", str(results), str(bundle))
    assert f"run '2026w48' is in results folder {results} ({results / RUN})" in err
    assert "1 trial(s) the results folder has records of would get another record" in err

    def rewrite(member, document):
        if member.endswith("run.json"):
            document["campaign_config"]["description"] = "rewritten"

    err = refused(capsys, "import", "--results", str(results), str(with_members(tmp_path, genuine, rewrite)))
    assert f"member '{RUN}/run.json' differs from {results / RUN / 'run.json'}, which is there already" in err

    def other_campaign(member, document):
        if member.endswith("run.json") or member == "bundle.json":
            document["campaign"] = "other"
        if isinstance(document.get("trial"), dict):
            document["trial"]["campaign"] = "other"

    members = {name.replace("epcc-2024/", "other/"): data for name, data in raw_members(genuine).items()}
    moved = write_members(tmp_path / "moved.tar.gz", members, checksums=True)
    err = refused(capsys, "import", "--results", str(results), str(with_members(tmp_path, moved, other_campaign)))
    assert f"is already in results folder {results} ({results / RUN}) as another run; they differ in: campaign" in err

    def future(member, document):
        if member.endswith("run.json"):
            document |= {"run_id": "2099w01", "started_utc": "2099-01-01T00:00:00+00:00"}
        if member == "bundle.json":
            document["run_id"] = "2099w01"
        if "run" in document and isinstance(document["run"], dict):
            document["run"]["id"] = "2099w01"

    members = {name.replace("/2026w48/", "/2099w01/"): data for name, data in raw_members(genuine).items()}
    renamed = write_members(tmp_path / "renamed.tar.gz", members, checksums=True)
    err = refused(capsys, "import", "--results", str(results), str(with_members(tmp_path, renamed, future)))
    assert (
        "run '2099w01': key 'started_utc': value '2099-01-01T00:00:00.000000+00:00' is after this machine's clock"
        in err
    )
    assert files_under(results) == before


def test_an_imported_run_folder_is_never_ingested_or_continued_as_the_site_s_own(
    capsys, tmp_path, run_records, monkeypatch
):
    site_a = write_run_directory(tmp_path / "site-a", run_records)
    genuine = export_run_directory(site_a, tmp_path / "genuine.tar.gz")
    results = tmp_path / "results"
    assert cli(capsys, "import", "--results", str(results), str(genuine))[0] == 0
    store = f"sqlite:///{tmp_path}/history.db"
    assert cli(capsys, "--store", store, "ingest", str(results / RUN))[0] == 0
    rows = store_rows(store)
    # A forged earlier attempt put into the imported folder by hand: its ingest does not supersede.
    faster = json.loads((results / RUN / member_of(run_records[0]).removeprefix(f"{RUN}/")).read_text())
    faster["metrics"]["time_to_train_s"] /= 100
    trial = results / RUN / member_of(run_records[0]).removeprefix(f"{RUN}/")
    write_json_atomic(faster, trial.parent / "superseded" / f"{content_sha256(faster)}.json")
    assert "would get another record" in refused(capsys, "--store", store, "ingest", str(results / RUN))
    assert store_rows(store) == rows
    # The workflow never continues it, whatever site its manifest names.
    monkeypatch.chdir(tmp_path)
    assert latest_run("epcc-2024", "archer2") is None
    with pytest.raises(ConfigError, match="run 2026w48 of campaign epcc-2024 was imported from a bundle"):
        resolve_run("epcc-2024", "archer2", "2026w48")


# 3: numbers that are not numbers.


def test_nan_in_a_run_manifest_is_refused_by_ingest_export_and_import(capsys, tmp_path, run_records):
    run_dir = write_run_directory(tmp_path / "site-a", run_records)
    genuine = export_run_directory(run_dir, tmp_path / "genuine.tar.gz")
    manifest = json.loads((run_dir / "run.json").read_text())
    manifest["benchmarks"]["resnet50"]["valid_flops"]["exponent"] = float("nan")
    (run_dir / "run.json").write_text(json.dumps(manifest))  # Python's json writes NaN
    expected = "key 'benchmarks.resnet50.valid_flops.exponent': value nan is not a finite number"
    store = f"sqlite:///{tmp_path}/history.db"
    assert expected in refused(capsys, "--store", store, "ingest", str(run_dir))
    assert expected in refused(capsys, "export", str(run_dir), "--out", str(tmp_path / "out.tar.gz"))

    def nan(member, document):
        if member.endswith("run.json"):
            document["benchmarks"]["resnet50"]["valid_flops"]["exponent"] = float("inf")

    bundle = with_members(tmp_path, genuine, nan)
    err = refused(capsys, "--store", store, "import", str(bundle))
    assert f"{RUN}/run.json' is not JSON: key 'benchmarks.resnet50.valid_flops.exponent': value inf" in err
    assert "valid_flops.exponent': value inf" in refused(
        capsys, "import", "--results", str(tmp_path / "r"), str(bundle)
    )
    assert not (tmp_path / "out.tar.gz").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("--flops", "nan", "is not a finite number"),
        ("--time", "inf", "is not a finite number"),
        ("--time", "-1", "is outside 0 to 1e+08 s"),
        ("--flops", "-5e12", "is outside 0 to 1e+30 FLOP"),
        ("--achieved", "nan", "is not a finite number"),
        ("--exponent", "-inf", "is not a finite number"),
    ],
)
def test_valid_flops_refuses_numbers_that_are_not_numbers_naming_option_and_value(capsys, option, value, problem):
    numbers = {"--flops": "1e15", "--time": "3600", "--achieved": "0.9", "--target": "0.8", "--exponent": "10"}
    argv = [
        "valid-flops",
        "--direction",
        "higher",
        *(f"{key}={text}" for key, text in (numbers | {option: value}).items()),
    ]
    with pytest.raises(SystemExit) as exited:
        cli(capsys, *argv)
    assert exited.value.code == 2
    assert f"argument {option}: value '{value}' {problem}" in capsys.readouterr().err


# 4: sites and names that are not what they say.


def test_a_bundle_whose_site_is_not_its_systems_site_is_refused_naming_both(capsys, tmp_path, run_records):
    genuine = export_run_directory(write_run_directory(tmp_path / "site-a", run_records), tmp_path / "genuine.tar.gz")

    def elsewhere(member, document):
        if member.endswith("run.json") or member == "bundle.json":
            document["site"] = "cirrus"
        if isinstance(document.get("run"), dict):
            document["run"]["site"] = "cirrus"

    bundle = with_members(tmp_path, genuine, elsewhere)
    store = f"sqlite:///{tmp_path}/history.db"
    for argv in (["--store", store, "import"], ["import", "--results", str(tmp_path / "r")]):
        err = refused(capsys, *argv, str(bundle))
        assert (
            "a trial of system 'local-cpu' at site 'archer2' (key 'systems'), marked at_site in a run of site " in err
        )
        assert "'cirrus'" in err
    assert not Path(store.removeprefix("sqlite:///")).exists() or store_rows(store) == []


@pytest.mark.parametrize(
    "site",
    [
        unicodedata.normalize("NFC", "arch\u00e9r2"),
        unicodedata.normalize("NFD", "arch\u00e9r2"),
        "<script>x</script>",
        "a/../b",
        "arch\ner2",
        "x" * 101,
    ],
)
def test_names_are_validated_once_at_ingest_and_import(capsys, tmp_path, run_records, site):
    genuine = export_run_directory(write_run_directory(tmp_path / "site-a", run_records), tmp_path / "genuine.tar.gz")

    def renamed(member, document):
        if member.endswith("run.json") or member == "bundle.json":
            document["site"] = site
        if member.endswith("run.json"):
            document["systems"]["local-cpu"]["site"] = site
        if isinstance(document.get("run"), dict):
            document["run"]["site"] = site

    bundle = with_members(tmp_path, genuine, renamed)
    store = f"sqlite:///{tmp_path}/history.db"
    for argv in (["--store", store, "import"], ["import", "--results", str(tmp_path / "r")]):
        assert "key 'site': value " in refused(capsys, *argv, str(bundle))
    run_dir = write_run_directory(tmp_path / "site-b", run_records)
    manifest = json.loads((run_dir / "run.json").read_text())
    write_json_atomic(manifest | {"site": site}, run_dir / "run.json")
    assert "is not a name" in refused(capsys, "--store", store, "ingest", str(run_dir))
    assert not (tmp_path / "r").exists()


def test_check_refuses_a_campaign_name_too_long_for_a_file_name(capsys, tmp_path):
    from conftest import REPO

    campaign = tmp_path / "long.yaml"
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    campaign.write_text(yaml.safe_dump(config | {"campaign": "x" * 101}))
    err = refused(capsys, "check", str(campaign), "--config-dir", str(REPO / "config"))
    assert "key 'campaign'" in err and "is too long" in err


# 7: a bundle's size is known from its checksum list, read first.


def members_read(monkeypatch) -> list[str]:
    """The names of the members an import reads, in order, from now on."""
    read = []
    read_member = reading._read_member

    def reading_member(bundle_path, archive, entry, **options):
        read.append(entry.name)
        return read_member(bundle_path, archive, entry, **options)

    monkeypatch.setattr(reading, "_read_member", reading_member)
    return read


def checksums_only(path: Path, count: int) -> Path:
    """A bundle whose SHA256SUMS lists ``count`` empty members (and holds nothing else)."""
    empty = hashlib.sha256(b"").hexdigest()
    listing = "".join(f"{empty}  {RUN}/trials/s/b/c/t{i}/mllog.txt\n" for i in range(count)).encode()
    with gzip.open(path, "wb") as stream, tarfile.open(fileobj=stream, mode="w") as archive:
        entry = tarfile.TarInfo("SHA256SUMS")
        entry.size = len(listing)
        archive.addfile(entry, io.BytesIO(listing))
    return path


@pytest.mark.parametrize("target", ["store", "results folder"])
def test_a_bundle_listing_more_members_than_a_bundle_may_hold_is_refused_before_reading_them(
    capsys, tmp_path, target, monkeypatch
):
    bundle = checksums_only(tmp_path / "many.tar.gz", limits.MAX_MEMBERS)  # with SHA256SUMS: one too many
    read = members_read(monkeypatch)
    argv = ["--store", f"sqlite:///{tmp_path}/history.db", "import"]
    if target == "results folder":
        argv = ["import", "--results", str(tmp_path / "r")]
    err = refused(capsys, *argv, str(bundle))
    assert f"member 'SHA256SUMS' lists {limits.MAX_MEMBERS} members: with itself, more than {limits.MAX_MEMBERS}" in err
    assert read == ["SHA256SUMS"] and not (tmp_path / "r").exists()


def test_a_listed_member_that_no_bundle_of_its_run_has_is_refused_before_any_member_is_read(
    capsys, tmp_path, run_records, monkeypatch
):
    genuine = export_run_directory(write_run_directory(tmp_path / "site-a", run_records), tmp_path / "genuine.tar.gz")
    members = raw_members(genuine)
    listing = members["SHA256SUMS"] + f"{'0' * 64}  {RUN}/notes.txt\n".encode()
    bundle = write_members(tmp_path / "listed.tar.gz", members | {"SHA256SUMS": listing})
    read = members_read(monkeypatch)
    err = refused(capsys, "import", "--results", str(tmp_path / "r"), str(bundle))
    assert f"member '{RUN}/notes.txt' is not part of a bundle of run '2026w48'" in err
    assert read == ["SHA256SUMS", "bundle.json"]
