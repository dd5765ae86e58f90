"""The history commands of ``mlcampaign`` under accident and attack (issue #25), each through the command
line: what a site operator may do by mistake (a results folder as the dashboard's, a full disk, a
read-only store, a damaged row) and what a hostile run folder or bundle may try (links out of the run,
members of gigabytes, data after the archive, JSON nested without end, a forged run or dataset). Each is
refused with a message naming what is wrong and exit status 2 (never a traceback, never 1, which a
summary's caller reads as a regression); nothing is lost, leaked or left half-written."""

from __future__ import annotations

import ctypes
import gzip
import io
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from synthetic_records import synthetic_history
from test_bundle import RUN, files_under, member_of, raw_members, write_members, write_run_directory
from test_store import synthetic_record

from mlcampaign.cli import EXIT_CANNOT_TELL, main
from mlcampaign.history.bundle import export_run_directory, limits, trial_directory
from mlcampaign.history.dashboard_folder import MARKER
from mlcampaign.history.store import RecordFile, open_store
from mlcampaign.plan.config_files import ConfigError
from mlcampaign.plan.runs import resolve_run
from mlcampaign.records.files import write_json_atomic

from conftest import REPO

# Tracebacks print this; a refusal prints one line.
TRACEBACK = "Traceback (most recent call last)"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``mlcampaign *argv`` in this process: exit status, stdout, stderr."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def refused(capsys, *argv: str) -> str:
    """Run ``mlcampaign *argv``, which must be refused with a message and exit status 2; its stderr."""
    status, _, err = cli(capsys, *argv)
    assert status == 2 and TRACEBACK not in err and err.startswith("mlcampaign "), (status, err)
    return err


def _drop_file_permission_override() -> None:
    """In a child of root: give up the capabilities that let root write where file permissions forbid it
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER), as an ordinary user is."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run_cli(*argv: str, file_size_limit: int | None = None, as_user: bool = False) -> subprocess.CompletedProcess:
    """``mlcampaign *argv`` as a process (run_restricted)."""
    return run_restricted(["-m", "mlcampaign", *argv], file_size_limit=file_size_limit, as_user=as_user)


def run_restricted(
    python_argv: list[str], *, file_size_limit: int | None = None, as_user: bool = False
) -> subprocess.CompletedProcess:
    """``python *python_argv`` as a process: with ``file_size_limit``, no file it writes may grow past that
    many bytes (a full disk, as the process sees it: writes fail with EFBIG); ``as_user``: file permissions
    hold for it even when the tests run as root."""

    def limit() -> None:
        if file_size_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
        if as_user and os.geteuid() == 0:
            _drop_file_permission_override()

    environment = os.environ | {"PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, *python_argv],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        env=environment,
        timeout=300,
    )


def assert_refused(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2 and TRACEBACK not in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


@pytest.fixture
def run_records() -> list[dict]:
    return [synthetic_record(i) for i in range(4)]


@pytest.fixture
def run_dir(tmp_path, run_records) -> Path:
    """A four-trial run folder (results/epcc-2024/runs/2026w48) with its MLPerf logs and dataset manifest."""
    return write_run_directory(tmp_path / "site-a", run_records)


@pytest.fixture
def exported(tmp_path, run_dir) -> Path:
    return export_run_directory(run_dir, tmp_path / "2026w48.tar.gz")


@pytest.fixture
def history(tmp_path) -> tuple[str, Path]:
    """A store (sqlite, in results/ beside a run's folder) of two weekly runs at one site; its URL and
    the results folder."""
    results = tmp_path / "results"
    manifests, records = synthetic_history({"site-a": ["alpha-cpu"]}, ["bench0"], [("1x1", "fp32")], 2, seed=5)
    url = f"sqlite:///{results / 'history.db'}"
    results.mkdir()
    with open_store(url) as store:
        for manifest in manifests:
            run_id = manifest["run_id"]
            files = [RecordFile(f"{run_id}/{i}.json", r) for i, r in enumerate(records) if r["run"]["id"] == run_id]
            store.ingest(manifest, files)
    write_json_atomic(manifests[-1], results / "synthetic" / "runs" / manifests[-1]["run_id"] / "run.json")
    return url, results


def dot_entries(folder: Path) -> list[str]:
    """Hidden entries (temporary files and folders) in ``folder``."""
    return sorted(path.name for path in folder.iterdir() if path.name.startswith("."))


# 1, 13: the dashboard replaces only a dashboard it built.


def test_the_dashboard_never_replaces_a_folder_it_did_not_build(capsys, tmp_path, history, monkeypatch):
    url, results = history
    before = files_under(results)
    err = refused(capsys, "--store", url, "dashboard", "--out", str(results))
    assert f"mlcampaign dashboard: {results}: not a dashboard this command built, so it is not replaced" in err
    assert "nothing was removed" in err
    monkeypatch.chdir(results)
    assert "not a dashboard this command built" in refused(capsys, "--store", url, "dashboard", "--out", ".")
    assert files_under(results) == before
    assert dot_entries(tmp_path) == []

    site = tmp_path / "site"
    for _ in range(2):  # a new folder, then the dashboard it built
        assert cli(capsys, "--store", url, "dashboard", "--out", str(site))[0] == 0
        marker = json.loads((site / MARKER).read_text())
        assert marker["campaign"] == "synthetic" and "index.html" in marker["files"]
    (site / "notes.txt").write_text("the operator's own")
    err = refused(capsys, "--store", url, "dashboard", "--out", str(site))
    assert "1 other entries, e.g. 'notes.txt'" in err
    assert (site / "notes.txt").read_text() == "the operator's own"
    # A dashboard built before the marker (its pages and assets only) is replaced; an empty folder too.
    (site / "notes.txt").unlink()
    (site / MARKER).unlink()
    assert cli(capsys, "--store", url, "dashboard", "--out", str(site))[0] == 0
    (tmp_path / "empty").mkdir()
    assert cli(capsys, "--store", url, "dashboard", "--out", str(tmp_path / "empty"))[0] == 0
    assert dot_entries(tmp_path) == []


def test_a_dashboard_that_cannot_be_written_keeps_the_previous_one(capsys, tmp_path, history):
    url, _ = history
    site = tmp_path / "site"
    assert cli(capsys, "--store", url, "dashboard", "--out", str(site))[0] == 0
    before = files_under(site)
    # plotly.js alone is over 4 MB: the disk is full before the new site is complete.
    result = run_cli("--store", url, "dashboard", "--out", str(site), file_size_limit=2**20)
    assert_refused(result, f"mlcampaign dashboard: {site}: the dashboard cannot be written (")
    assert "the previous one, if any, is left as it was" in result.stderr
    assert files_under(site) == before
    assert dot_entries(tmp_path) == []


# 2: export and ingest read regular files inside the run folder only.


@pytest.mark.parametrize("linked", ["mllog.txt", "record.json", "trial directory", "run.json"])
def test_export_and_ingest_refuse_a_link_out_of_the_run_folder(capsys, tmp_path, run_dir, run_records, linked):
    secret = tmp_path / "secret"
    secret.mkdir()
    trial = run_dir / trial_directory(run_records[1])
    if linked == "mllog.txt":
        (secret / "shadow").write_text("root:$6$secret:19000:0:99999:7:::\n")
        link, target = trial / "mllog.txt", secret / "shadow"
    elif linked == "record.json":
        link, target = trial / "record.json", secret / "record.json"
    elif linked == "trial directory":
        link, target = trial, secret / "trial"
    else:
        link, target = run_dir / "run.json", secret / "run.json"
    if not target.exists():
        link.rename(target)  # the same content, outside the run folder
    else:
        link.unlink()
    link.symlink_to(target)
    bundle_path = tmp_path / "out.tar.gz"
    commands = [["export", str(run_dir), "--out", str(bundle_path)]]
    if linked != "mllog.txt":  # ingest reads no MLPerf log
        commands.append(["--store", f"sqlite:///{tmp_path}/history.db", "ingest", str(run_dir)])
    for command in commands:
        err = refused(capsys, *command)
        assert f"{link}: a link (to '{target}'); a run's files are read as regular files, never through a link" in err
    assert not bundle_path.exists()
    assert not (tmp_path / "history.db").exists() or open_store(f"sqlite:///{tmp_path}/history.db").list_runs() == []


# 3: import streams, within stated limits, and stops at the archive's end.


def _zeros(size: int) -> io.RawIOBase:
    """``size`` zero bytes as a file to read from, never all in memory."""

    class Zeros(io.RawIOBase):
        left = size

        def readable(self):
            return True

        def readinto(self, buffer):
            count = min(len(buffer), self.left)
            buffer[:count] = bytes(count)
            self.left -= count
            return count

    return io.BufferedReader(Zeros(), 2**20)


def peak_memory_of(function) -> tuple[object, int]:
    """What ``function()`` returns, and the peak of Python's allocations while it ran, in bytes."""
    tracemalloc.start()
    try:
        return function(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_import_refuses_a_member_over_the_limit_without_reading_it(capsys, tmp_path, exported):
    oversized = tmp_path / "oversized.tar.gz"
    with tarfile.open(oversized, "w:gz", compresslevel=1) as archive:
        for name, data in raw_members(exported).items():
            archive.addfile(_entry(name, len(data)), io.BytesIO(data))
        archive.addfile(
            _entry(f"{RUN}/trials/zeros.txt", limits.MAX_MEMBER_BYTES + 1), _zeros(limits.MAX_MEMBER_BYTES + 1)
        )
    store = f"sqlite:///{tmp_path}/history.db"
    (status, _, err), peak = peak_memory_of(lambda: cli(capsys, "--store", store, "import", str(oversized)))
    assert status == 2 and TRACEBACK not in err
    assert (
        f"{oversized}: member '{RUN}/trials/zeros.txt' is {limits.MAX_MEMBER_BYTES + 1} bytes, over the limit of a "
        f"bundle member ({limits.MAX_MEMBER_BYTES} bytes)"
    ) in err
    assert peak < limits.MAX_MEMBER_BYTES / 4
    assert open_store(store).list_runs() == []


def _entry(name: str, size: int) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.size = size
    return entry


def test_import_stops_at_the_end_of_the_archive(capsys, tmp_path, exported):
    padded = tmp_path / "padded.tar.gz"
    with gzip.open(padded, "wb", compresslevel=1) as stream:
        stream.write(gzip.decompress(exported.read_bytes()))
        chunk = bytes(2**20)
        for _ in range(limits.MAX_MEMBER_BYTES // len(chunk)):
            stream.write(chunk)
    (status, _, err), peak = peak_memory_of(
        lambda: cli(capsys, "--store", f"sqlite:///{tmp_path}/history.db", "import", str(padded))
    )
    assert status == 2 and f"{padded}: content after the end of its tar archive" in err
    assert peak < limits.MAX_MEMBER_BYTES / 4


def test_import_refuses_tar_headers_over_the_limit(capsys, tmp_path, exported):
    bombed = tmp_path / "bombed.tar.gz"
    with tarfile.open(bombed, "w:gz", format=tarfile.PAX_FORMAT) as archive:
        entry = _entry("SHA256SUMS", 0)
        entry.pax_headers = {"comment": "x" * (2 * limits.MAX_HEADER_BYTES)}
        archive.addfile(entry, io.BytesIO(b""))
    err = refused(capsys, "--store", f"sqlite:///{tmp_path}/history.db", "import", str(bombed))
    assert f"{bombed}: over {limits.MAX_HEADER_BYTES} bytes of tar headers before its first member" in err


def test_import_refuses_more_members_or_bytes_than_a_bundle_may_hold(capsys, tmp_path, exported, monkeypatch):
    importing = ["--store", f"sqlite:///{tmp_path}/history.db", "import", str(exported)]
    members = len(raw_members(exported))
    monkeypatch.setattr(limits, "MAX_MEMBERS", members - 1)
    assert f"more than {members - 1} members, the limit of a bundle" in refused(capsys, *importing)
    monkeypatch.setattr(limits, "MAX_MEMBERS", members)
    half = len(gzip.decompress(exported.read_bytes())) // 2
    monkeypatch.setattr(limits, "MAX_BUNDLE_BYTES", half)
    assert f"over {half} bytes decompressed, the limit of a bundle" in refused(capsys, *importing)


def test_export_keeps_to_the_limits_a_reader_holds_to(capsys, tmp_path, run_dir, run_records, monkeypatch):
    out = tmp_path / "out.tar.gz"
    monkeypatch.setattr(limits, "MAX_MEMBER_BYTES", 1000)
    err = refused(capsys, "export", str(run_dir), "--out", str(out))
    record = run_dir / trial_directory(run_records[0]) / "record.json"
    assert f"{record}: {record.stat().st_size} bytes, over the limit of a bundle member (1000 bytes)" in err
    monkeypatch.setattr(limits, "MAX_MEMBER_BYTES", 2**20)
    monkeypatch.setattr(limits, "MAX_MEMBERS", 5)
    err = refused(capsys, "export", str(run_dir), "--out", str(out))
    assert "would be a bundle of 12 members and about " in err and "over the limits of a bundle (5 members" in err
    assert not out.exists()


# 4: an import that would supersede a stored run needs --supersede, and then both are kept.


def tampered(tmp_path: Path, exported: Path, run_records: list[dict]) -> Path:
    """The bundle with its run's description rewritten and every throughput 100 times higher."""
    members = raw_members(exported)
    manifest = json.loads(members[f"{RUN}/run.json"])
    manifest["campaign_config"]["description"] = "rewritten"
    members[f"{RUN}/run.json"] = json.dumps(manifest).encode()
    for record in run_records:
        faster = json.loads(members[member_of(record)])
        faster["metrics"]["throughput_samples_per_s"] *= 100
        members[member_of(record)] = json.dumps(faster).encode()
    return write_members(tmp_path / "tampered.tar.gz", members, checksums=True)


def test_an_import_superseding_a_stored_run_needs_supersede_and_keeps_both(capsys, tmp_path, exported, run_records):
    store = f"sqlite:///{tmp_path}/history.db"
    assert cli(capsys, "--store", store, "import", str(exported))[0] == 0
    with open_store(store) as results:
        stored_manifest, stored_records = results.manifest("2026w48"), results.records(["2026w48"])["2026w48"]
    database = sqlite3.connect(tmp_path / "history.db")
    rows = database.execute("SELECT * FROM runs").fetchall() + database.execute("SELECT * FROM records").fetchall()

    forged = tampered(tmp_path, exported, run_records)
    err = refused(capsys, "--store", store, "import", str(forged))
    assert f"{forged}:{RUN}/run.json: run '2026w48' is in results store {store}" in err
    assert "its manifest differs from the stored one in: campaign_config.description (not in the store)" in err
    assert "4 trial(s) the store has records of would get another record" in err
    assert "import with --supersede" in err
    assert (
        database.execute("SELECT * FROM runs").fetchall() + database.execute("SELECT * FROM records").fetchall() == rows
    )

    status, out, _ = cli(capsys, "--store", store, "import", "--supersede", str(forged))
    assert status == 0
    result = json.loads(out)
    assert (result["manifest_superseded"], result["trials_superseded"], result["records_added"]) == (True, 4, 4)
    with open_store(store) as results:
        assert results.manifest("2026w48")["campaign_config"]["description"] == "rewritten"
        (kept,) = results.superseded_manifests("2026w48")
        assert kept.manifest == stored_manifest and kept.superseded_by == f"{forged}:{RUN}/run.json"
        assert all(record in results.records(["2026w48"])["2026w48"] for record in stored_records)
    assert "--supersede applies to an import into the store" in refused(
        capsys, "import", "--supersede", "--results", str(tmp_path / "r"), str(forged)
    )


# 5: a password in a store URL is never shown.


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user:hunter2@host:notaport/db",
        "postgresql://user:hunter2@localhost/history",
        "postgresql://user@localhost/history?password=hunter2",
        "sqlite://user:hunter2@/results/history.db",
    ],
)
def test_a_store_url_password_is_never_shown(capsys, url):
    err = refused(capsys, "--store", url, "runs", "list")
    assert "hunter2" not in err and "***" in err


def test_a_campaign_file_with_a_password_in_its_store_url_is_refused_without_showing_it(capsys, tmp_path):
    override = tmp_path / "store.yaml"
    override.write_text("history:\n  store: postgresql://user:hunter2@db.example.org/history\n")
    campaign = REPO / "config" / "campaigns" / "epcc-2024-local.yaml"
    err = refused(capsys, "check", str(campaign), str(override), "--config-dir", str(REPO / "config"))
    assert "key 'history.store': value 'postgresql://user:***@db.example.org/history'" in err
    assert "hunter2" not in err


# 7: ingest and export check a record's campaign and place, as import does.


@pytest.mark.parametrize("forgery", ["campaign", "place"])
def test_ingest_and_export_refuse_a_record_of_another_campaign_or_place(
    capsys, tmp_path, run_dir, run_records, forgery
):
    record_path = run_dir / trial_directory(run_records[2]) / "record.json"
    record = json.loads(record_path.read_text())
    if forgery == "campaign":
        record["trial"]["campaign"] = "other-campaign"
        expected = (
            f"{record_path}: the record's key 'trial.campaign' names campaign 'other-campaign', not campaign "
            f"'epcc-2024' of run '2026w48'"
        )
    else:
        record["trial"]["system"] = "archer2-cpu"
        expected = f"{record_path} is not in its record's trial directory 'trials/archer2-cpu/"
    write_json_atomic(record, record_path)
    store = f"sqlite:///{tmp_path}/history.db"
    assert expected in refused(capsys, "--store", store, "ingest", str(run_dir))
    assert expected in refused(capsys, "export", str(run_dir), "--out", str(tmp_path / "out.tar.gz"))
    assert not (tmp_path / "out.tar.gz").exists()


# 9: a damaged row is named, with exit status 2.


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (
            "UPDATE records SET record_json = substr(record_json, 1, 100) WHERE content_sha256 = '{key}'",
            "run 'site-a-2026w02': the record with content_sha256 {key}: its record_json is not the record ingested",
        ),
        (
            "UPDATE runs SET manifest_json = '{}' WHERE run_id = 'site-a-2026w02'",
            "run 'site-a-2026w02': column runs.manifest_json is damaged (",
        ),
        (
            "UPDATE runs SET manifest_json = replace(manifest_json, '\"site-a\"', '\"site-b\"')"
            " WHERE run_id = 'site-a-2026w02'",
            "run 'site-a-2026w02': column runs.manifest_json is damaged: it files run {'run_id': 'site-a-2026w02', "
            "'campaign': 'synthetic', 'site': 'site-b'",
        ),
    ],
)
def test_summary_names_a_damaged_row(capsys, history, damage, expected):
    url, results = history
    database = sqlite3.connect(results / "history.db")
    with database:
        query = "SELECT content_sha256 FROM records WHERE run_id = 'site-a-2026w02' ORDER BY content_sha256"
        key = database.execute(query).fetchone()[0]
        database.execute(damage.replace("{key}", key))
    database.close()
    err = refused(capsys, "--store", url, "summary", "site-a-2026w02")
    assert f"results store {url}: " + expected.replace("{key}", key) in err
    assert "restore it from a backup" in err


# 10: a store in a folder this user cannot write can still be read.


def test_a_store_in_a_read_only_folder_can_be_read(tmp_path, history):
    url, results = history
    with open_store(url) as store:
        assert store.schema_version > 0
    assert not (results / "history.db-shm").exists()  # closed: the next reader must create it
    results.chmod(0o555)
    try:
        try:
            probe = run_restricted(["-c", f"open({str(results / 'probe')!r}, 'w')"], as_user=True)
        except subprocess.SubprocessError as error:  # prctl refused: root without CAP_SETPCAP
            pytest.skip(f"running as root, and the capability to write anywhere cannot be given up ({error})")
        assert probe.returncode != 0 and "PermissionError" in probe.stderr  # the folder is read-only for it
        listed = run_cli("--store", url, "runs", "list", as_user=True)
        summary = run_cli("--store", url, "summary", "site-a-2026w02", as_user=True)
    finally:
        results.chmod(0o755)
    assert listed.returncode == 0 and listed.stdout.count("site-a-2026w0") == 2, listed.stderr
    # Read in full: its two runs' cells cannot tell yet whether they changed (exit 4), nothing failed.
    assert summary.returncode == EXIT_CANNOT_TELL and json.loads(summary.stdout)["run_id"] == "site-a-2026w02", (
        summary.stderr
    )


# 11: import checks a bundle's dataset manifests as export does.


@pytest.mark.parametrize("forgery", ["unnamed", "other id", "missing"])
def test_import_checks_the_dataset_manifests(capsys, tmp_path, exported, forgery):
    members = raw_members(exported)
    manifest_member = "datasets/synthetic/manifest.json"
    if forgery == "unnamed":
        members["datasets/planted/manifest.json"] = members[manifest_member]
        expected = "member 'datasets/planted/manifest.json': dataset 'planted' is not named by any record"
    elif forgery == "other id":
        dataset = json.loads(members[manifest_member]) | {"dataset_id": "f" * 16}
        members[manifest_member] = json.dumps(dataset).encode()
        expected = f"member '{manifest_member}': dataset id 'ffffffffffffffff', but the records of run '2026w48'"
    else:
        del members[manifest_member]
        expected = f"member '{manifest_member}' is missing: the records name dataset 'synthetic'"
    forged = write_members(tmp_path / "forged.tar.gz", members, checksums=True)
    results = tmp_path / "results"
    results.mkdir()
    assert expected in refused(capsys, "import", "--results", str(results), str(forged))
    assert list(results.iterdir()) == []
    assert expected in refused(capsys, "--store", f"sqlite:///{tmp_path}/history.db", "import", str(forged))


# 12: JSON nested without end, and a full disk during an import.


def test_import_refuses_a_record_nested_without_end(capsys, tmp_path, exported, run_records):
    members = raw_members(exported)
    members[member_of(run_records[0])] = b"[" * 100_000 + b"]" * 100_000
    forged = write_members(tmp_path / "nested.tar.gz", members, checksums=True)
    err = refused(capsys, "--store", f"sqlite:///{tmp_path}/history.db", "import", str(forged))
    assert f"{forged}: member '{member_of(run_records[0])}' is not JSON this reader takes: nested too deeply" in err


def test_an_import_onto_a_full_disk_leaves_nothing_behind(tmp_path, exported):
    results = tmp_path / "results"
    write_json_atomic({"already": "here"}, results / "other.json")
    before = files_under(results)
    result = run_cli("import", "--results", str(results), str(exported), file_size_limit=1000)
    assert_refused(result, f"mlcampaign import: {exported}: member ")
    assert "cannot be unpacked into" in result.stderr
    assert files_under(results) == before and dot_entries(results) == []


# 13: every other error path is a message and exit status 2.


def test_export_names_an_output_it_cannot_write(capsys, tmp_path, run_dir):
    missing = tmp_path / "nonexistent" / "d" / "b.tar.gz"
    assert f"{missing}: cannot be written: folder '{missing.parent}' does not exist" in refused(
        capsys, "export", str(run_dir), "--out", str(missing)
    )
    folder = tmp_path / "bundles"
    folder.mkdir()
    assert f"{folder}: a folder; name the bundle file to write (e.g. {folder}/2026w48.tar.gz)" in refused(
        capsys, "export", str(run_dir), "--out", str(folder)
    )
    assert list(folder.iterdir()) == []
    result = run_cli("export", str(run_dir), "--out", str(folder / "b.tar.gz"), file_size_limit=2000)
    assert_refused(result, f"mlcampaign export: {folder / 'b.tar.gz'}: cannot be written (File too large)")
    assert list(folder.iterdir()) == []


def test_runs_show_takes_one_run(capsys, history):
    url, _ = history
    assert "runs show takes one run id, not 2" in refused(capsys, "--store", url, "runs", "show", "a", "b")
    assert "runs show takes one run id, not 0" in refused(capsys, "--store", url, "runs", "show")


def test_an_earlier_run_manifest_without_a_site_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    damaged = tmp_path / "results" / "c" / "runs" / "r1" / "run.json"
    write_json_atomic({"run_id": "r1", "started_utc": "2026-12-01T08:00:00+00:00"}, damaged)
    with pytest.raises(ConfigError, match=r"^results/c/runs/r1/run\.json: not a run manifest: key 'site': value None"):
        resolve_run("c", "local", None)
