"""The results store, every test on SQLite and on a real PostgreSQL server the tests start: ingest
semantics (idempotent, atomic, runs that gain records), queries, concurrent and killed ingests,
schema versions and migrations, URLs, and bad input (refused with a message naming it, the store
left as it was)."""

from __future__ import annotations

import dataclasses
import hashlib
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy
import synthetic_records as synthetic
from servers import POSTGRES_USER, free_port

from mlcampaign.history import store
from mlcampaign.history.store import (
    ManifestError,
    PublishedRunConflictError,
    RecordError,
    RecordFile,
    RunConflictError,
    SchemaVersionError,
    StoreUnavailableError,
    StoreURLError,
    UnknownRunError,
    migrations,
    open_store,
)
from mlcampaign.history.store.backends.postgresql import CONNECT_TIMEOUT_S
from mlcampaign.history.store.published import PublishedLog, PublishedRun
from mlcampaign.records.files import content_sha256

TESTS = Path(__file__).resolve().parent


# Test data.


def manifest(run_id: str, site: str = "archer2", campaign: str = "epcc-2024", **changes) -> dict:
    """A run manifest of the shape the workflow writes (run.json)."""
    return {
        "run_id": run_id,
        "campaign": campaign,
        "site": site,
        "started_utc": "2026-11-30T08:00:00+00:00",
        "campaign_config": {"campaign": campaign, "seed": 7, "matrix": {"scales": ["1x1", "1x4"]}},
        "systems": {"local-cpu": {"launcher": "python", "site": site}},
        "benchmarks": {"resnet50": {"valid_flops": {"exponent": 10, "cap": 1.0}}},
        "plan": [synthetic.plan_row("local-cpu", "resnet50", "1x1", "fp32", 0) | {"at_site": True}],
        "unplanned": [],
        "workflow_commit": "0123abc",
    } | changes


def synthetic_record(index: int, campaign: str = "epcc-2024", **options) -> dict:
    """Record ``index`` (trial ``index`` of one cell of ``campaign``): the same content whichever process makes it."""
    row = synthetic.plan_row("local-cpu", "resnet50", "1x4", "fp32", index)
    record = synthetic.record(row, np.random.default_rng(index), **options)
    record["trial"]["campaign"] = campaign
    return record


def record_files(first: int, count: int, run_id: str = "run", campaign: str = "epcc-2024") -> list[RecordFile]:
    return [
        RecordFile(f"{run_id}/trial{i}/record.json", synthetic_record(i, campaign)) for i in range(first, first + count)
    ]


# Backends: a fresh store URL per test, and a way to see everything the store holds.


@dataclasses.dataclass
class Backend:
    """A store URL of one backend, and direct access to its database (not through the store code)."""

    name: str
    url: str  # of a store that does not exist yet
    engine: sqlalchemy.Engine

    @property
    def sqlite_path(self) -> Path:
        return Path(sqlalchemy.make_url(self.url).database)

    def contents(self) -> dict[str, list[tuple]] | None:
        """Every row of every table of the store (None: no store file)."""
        if self.name == "sqlite" and not self.sqlite_path.exists():
            return None
        with self.engine.connect() as connection:
            names = sorted(sqlalchemy.inspect(connection).get_table_names())
            return {
                name: sorted(tuple(row) for row in connection.exec_driver_sql(f"SELECT * FROM {name}"))
                for name in names
            }

    def execute(self, sql: str) -> None:
        """Run SQL on the store's database (to make a store that no code of this version would)."""
        with self.engine.begin() as connection:
            connection.exec_driver_sql(sql)

    def writer_is_inserting(self) -> bool:
        """Whether another connection is inside a write transaction that inserted records (SQLite: holds
        the database's write lock)."""
        if self.name == "sqlite":
            probe = sqlite3.connect(self.sqlite_path, timeout=0, isolation_level=None)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                return False
            except sqlite3.OperationalError:  # database is locked: a writer holds the write lock
                return True
            finally:
                probe.close()
        with self.engine.connect() as connection:
            return bool(
                connection.exec_driver_sql(
                    "SELECT count(*) FROM pg_locks JOIN pg_class ON pg_class.oid = pg_locks.relation "
                    "WHERE pg_class.relname = 'records' AND pg_locks.mode = 'RowExclusiveLock' "
                    "AND pg_locks.pid <> pg_backend_pid()"
                ).scalar_one()
            )


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path, monkeypatch):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/history.db"
        engine = sqlalchemy.create_engine(url)
    else:
        server = request.getfixturevalue("postgres_server")
        # The password comes from the environment, as a site's would (libpq reads PGPASSWORD).
        monkeypatch.setenv("PGPASSWORD", server.password)
        url = f"postgresql://{POSTGRES_USER}@127.0.0.1:{server.port}/{server.new_database()}"
        engine = sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    yield Backend(request.param, url, engine)
    engine.dispose()


# Ingest and queries.


def test_runs_and_records_read_back_as_ingested(backend):
    with open_store(backend.url) as results:
        first = results.ingest(manifest("2026w48"), record_files(0, 30))
        results.ingest(manifest("2026w49", started_utc="2026-11-30T12:00:00Z"), record_files(30, 20))
        results.ingest(manifest("cirrus-1", site="cirrus", started_utc="2026-11-30T10:00:00+01:00"), record_files(0, 5))
        results.ingest(manifest("other-1", campaign="hpcai500"), record_files(0, 1, campaign="hpcai500"))

        assert first == store.IngestResult("2026w48", run_created=True, records_added=30, records_present=0)
        assert results.manifest("2026w49") == manifest("2026w49", started_utc="2026-11-30T12:00:00Z")
        stored = results.records(["2026w48", "cirrus-1"])
        assert stored == {
            "2026w48": [file.record for file in record_files(0, 30)],
            "cirrus-1": [file.record for file in record_files(0, 5)],
        }
        runs = results.list_runs(campaign="epcc-2024")
        assert [(run.run_id, run.site, run.records) for run in runs] == [
            ("2026w48", "archer2", 30),
            ("cirrus-1", "cirrus", 5),
            ("2026w49", "archer2", 20),
        ]
        assert runs[1].started_utc == "2026-11-30T09:00:00.000000+00:00"  # normalised to UTC
        assert [run.run_id for run in results.list_runs(site="archer2")] == ["2026w48", "other-1", "2026w49"]
        assert [run.run_id for run in results.list_runs(campaign="epcc-2024", site="cirrus")] == ["cirrus-1"]
        latest = results.latest_runs("epcc-2024")
        assert {site: run.run_id for site, run in latest.items()} == {"archer2": "2026w49", "cirrus": "cirrus-1"}
        assert results.latest_runs("no-such-campaign") == {}


def test_ingest_is_idempotent_and_a_run_gains_records(backend):
    with open_store(backend.url) as results:
        results.ingest(manifest("2026w48"), record_files(0, 10))
        # The same records again (given twice in one ingest, too) add nothing.
        again = results.ingest(manifest("2026w48"), record_files(0, 10) + record_files(0, 10))
        assert again == store.IngestResult("2026w48", run_created=False, records_added=0, records_present=10)
        # A later invocation of the run: new trials, and an earlier attempt of trial 3 (a failure on a node
        # whose clock was ahead) that the store had not seen, superseded by the ok record it holds. Only the
        # run's own workflow continues a run so (supersede=True); an ingest without it is refused.
        failure = synthetic_record(3, failure_reason="out_of_memory")
        failure["provenance"]["finished_utc"] = "2026-12-31T23:00:00+00:00"
        superseded = RecordFile(f"run/trial3/superseded/{content_sha256(failure)}.json", failure)
        files = [*record_files(0, 12), superseded]
        before = backend.contents()
        with pytest.raises(store.SupersedeError) as refused:
            results.ingest(manifest("2026w48"), files)
        assert "1 trial(s) the store has records of would get another record (e.g. local-cpu/resnet50/1x4" in str(
            refused.value
        )
        assert backend.contents() == before
        later = results.ingest(manifest("2026w48"), files, supersede=True)
        assert later == store.IngestResult(
            "2026w48", run_created=False, records_added=3, records_present=10, trials_superseded=1
        )

        stored = results.records(["2026w48"])["2026w48"]
        assert len(stored) == 13
        assert len({content_sha256(record) for record in stored}) == 13
        of_trial_3 = [record for record in stored if record["trial"]["trial"] == 3]
        # Both records of the trial are kept; the current outcome (the folder's record.json) comes last.
        assert [record["status"] for record in of_trial_3] == ["failed", "ok"]
        assert results.list_runs()[0].records == 13


def test_records_of_runs_with_none_and_unknown_runs(backend):
    with open_store(backend.url) as results:
        results.ingest(manifest("empty"), [])
        assert results.records(["empty"]) == {"empty": []}
        assert results.list_runs()[0].records == 0
        before = backend.contents()
        with pytest.raises(UnknownRunError, match="has no run 'missing'"):
            results.records(["empty", "missing"])
        with pytest.raises(UnknownRunError, match=f"{backend.url} has no run 'missing'"):
            results.manifest("missing")
        assert backend.contents() == before


# Bad input: named in the error, and the store left as it was.


def test_a_run_id_stored_as_another_run_is_refused(backend):
    """A run is its campaign, site and start (RUN_IDENTITY): another run under a stored id is refused,
    naming what differs; the same run planned again with a changed config updates its manifest."""
    with open_store(backend.url) as results:
        results.ingest(manifest("2026w48"), record_files(0, 5))
        before = backend.contents()
        other = manifest("2026w48", site="cirrus", started_utc="2026-12-07T08:00:00+00:00")
        with pytest.raises(RunConflictError) as refused:
            results.ingest(other, record_files(5, 5), manifest_source="results/epcc-2024/runs/2026w48/run.json")
        message = str(refused.value)
        assert "results/epcc-2024/runs/2026w48/run.json: run '2026w48' is already in results store" in message
        assert "site ('archer2' in the store, 'cirrus' given)" in message
        assert "started_utc ('2026-11-30T08:00:00+00:00' in the store, '2026-12-07T08:00:00+00:00' given)" in message
        assert backend.contents() == before
        with pytest.raises(RunConflictError, match=r"campaign \('epcc-2024' in the store, 'hpcai500' given\)"):
            results.ingest(manifest("2026w48", campaign="hpcai500"), [])
        assert backend.contents() == before

        # The same run, re-planned (one dataset changed between two invocations of the run): its own
        # workflow replaces the manifest (supersede=True), and the store keeps the one replaced.
        replanned = manifest("2026w48", campaign_config={"campaign": "epcc-2024", "seed": 7, "trials": 2})
        with pytest.raises(store.SupersedeError, match=r"its manifest differs from the stored one in: campaign_config"):
            results.ingest(replanned, record_files(5, 2))
        assert backend.contents() == before
        result = results.ingest(replanned, record_files(5, 2), supersede=True, manifest_source="w48/run.json")
        assert (result.run_created, result.records_added, result.manifest_superseded) == (False, 2, True)
        assert results.manifest("2026w48") == replanned
        (kept,) = results.superseded_manifests("2026w48")
        assert (kept.manifest, kept.superseded_by) == (manifest("2026w48"), "w48/run.json")


def test_a_record_failing_the_schema_is_refused_with_nothing_written(backend):
    with open_store(backend.url) as results:
        results.ingest(manifest("2026w48"), record_files(0, 5))
        before = backend.contents()
        bad = synthetic_record(7)
        bad["metrics"]["epochs_run"] = "three"
        files = [*record_files(5, 2), RecordFile("results/x/trial7/record.json", bad), *record_files(8, 2)]
        for run_id in ("2026w48", "new-run"):  # a run gaining records, and a new run
            with pytest.raises(RecordError) as refused:
                results.ingest(manifest(run_id), files)
            message = str(refused.value)
            assert message.startswith("results/x/trial7/record.json: the record does not satisfy the record schema")
            assert "at 'metrics.epochs_run'" in message and "'three'" in message
            assert backend.contents() == before


def test_a_record_of_another_run_is_refused(backend):
    # Records named by a `run` block are checked against the manifest whatever the schema version.
    with open_store(backend.url) as results:
        results.ingest(manifest("2026w48"), [])
        before = backend.contents()
        misfiled = synthetic_record(1) | {"run": {"id": "2026w47", "site": "archer2"}}
        with pytest.raises(RecordError) as refused:
            results.ingest(manifest("2026w48"), [*record_files(0, 1), RecordFile("w47/record.json", misfiled)])
        assert str(refused.value).startswith(
            "w47/record.json: the record's run block names run '2026w47' at site 'archer2', not run '2026w48'"
        )
        other_site = synthetic_record(1) | {"run": {"id": "2026w48", "site": "cirrus"}}
        with pytest.raises(RecordError, match="names run '2026w48' at site 'cirrus', not run '2026w48' at site"):
            results.ingest(manifest("2026w48"), [RecordFile("cirrus/record.json", other_site)])
        assert backend.contents() == before


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"run_id": "../up"}, "key 'run_id': value '../up' is not a name"),
        ({"campaign": None}, "key 'campaign': value None is not a name"),
        ({"site": ""}, "run 'r1': key 'site': value '' is not text"),
        ({"started_utc": "2026-11-30 08:00"}, "run 'r1': key 'started_utc': time '2026-11-30 08:00' has no UTC offset"),
        ({"started_utc": "last week"}, "run 'r1': key 'started_utc': Invalid isoformat string: 'last week'"),
        ({"workflow_commit": 12}, "run 'r1': key 'workflow_commit': value 12 is not text"),
    ],
)
def test_a_manifest_that_cannot_file_a_run_is_refused(backend, changes, expected):
    with open_store(backend.url) as results:
        before = backend.contents()
        with pytest.raises(ManifestError) as refused:
            results.ingest(manifest("r1") | changes, record_files(0, 2), manifest_source="r1/run.json")
        assert str(refused.value).startswith(f"r1/run.json: {expected}")
        assert backend.contents() == before


def test_an_unreachable_store_fails_quickly_naming_its_url(backend, tmp_path):
    if backend.name == "sqlite":
        unreachable = [f"sqlite:///{tmp_path}/no/such/directory/history.db"]
        expected = [f"results store {unreachable[0]}: directory '{tmp_path}/no/such/directory' does not exist"]
    else:
        closed = free_port()
        # A server that accepts connections and never answers: only the connect timeout ends the wait.
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        unreachable = [
            f"postgresql://{POSTGRES_USER}@127.0.0.1:{closed}/history",
            f"postgresql://{POSTGRES_USER}@127.0.0.1:{silent.getsockname()[1]}/history",
        ]
        expected = [f"results store {url}: " for url in unreachable]
    try:
        for url, message in zip(unreachable, expected, strict=True):
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as refused:
                open_store(url)
            assert str(refused.value).startswith(message)
            assert time.monotonic() - started < 4 * CONNECT_TIMEOUT_S
    finally:
        if backend.name == "postgresql":
            silent.close()
    assert not (tmp_path / "no").exists()


def test_a_url_with_a_password_is_refused_without_showing_it(backend):
    with open_store(backend.url) as results:
        results.ingest(manifest("2026w48"), record_files(0, 2))
    before = backend.contents()
    scheme, rest = backend.url.split("://", 1)
    if backend.name == "sqlite":
        location = rest.lstrip("/")
        urls = [f"{scheme}://someone:hunter2@/{location}"]
    else:
        user, location = rest.split("@", 1)
        urls = [f"{scheme}://{user}:hunter2@{location}", f"{backend.url}?password=hunter2"]
    for url in urls:
        with pytest.raises(StoreURLError) as refused:
            open_store(url)
        message = str(refused.value)
        assert "hunter2" not in message
        assert location in message  # the URL is named (without its password)
        assert "embeds a password" in message and "PGPASSWORD" in message
    assert backend.contents() == before


def test_a_store_of_a_newer_schema_version_is_refused_and_left_untouched(backend):
    with open_store(backend.url) as results:
        results.ingest(manifest("2026w48"), record_files(0, 3))
        assert results.schema_version == migrations.MIGRATIONS[-1].VERSION
    newer = migrations.MIGRATIONS[-1].VERSION + 1
    backend.execute(
        f"INSERT INTO schema_version (version, applied_utc, description) VALUES ({newer}, '2027-01-01', 'future')"
    )
    before = backend.contents()
    file_bytes = backend.sqlite_path.read_bytes() if backend.name == "sqlite" else None
    with pytest.raises(SchemaVersionError) as refused:
        open_store(backend.url)
    assert str(refused.value) == (
        f"results store {backend.url} has schema version {newer}, newer than the {newer - 1} this mlcampaign "
        "knows: use a newer mlcampaign with it (the store was left untouched)"
    )
    assert backend.contents() == before
    if backend.name == "sqlite":
        assert backend.sqlite_path.read_bytes() == file_bytes


def test_migrations_are_applied_in_order_once(backend, monkeypatch):
    assert [migration.VERSION for migration in migrations.MIGRATIONS] == list(range(1, len(migrations.MIGRATIONS) + 1))
    with open_store(backend.url) as results:
        results.ingest(manifest("2026w48"), record_files(0, 3))
    applied = []

    def add_note_column(connection):
        applied.append(len(applied) + 1)
        connection.exec_driver_sql("ALTER TABLE runs ADD COLUMN note TEXT")

    version = len(migrations.MIGRATIONS) + 1
    later = types.SimpleNamespace(VERSION=version, DESCRIPTION="runs.note", upgrade=add_note_column)
    monkeypatch.setattr(migrations, "MIGRATIONS", (*migrations.MIGRATIONS, later))
    for _ in range(2):
        with open_store(backend.url) as results:
            assert results.schema_version == later.VERSION
            assert [file.record for file in record_files(0, 3)] == results.records(["2026w48"])["2026w48"]
    assert applied == [1]
    contents = backend.contents()
    assert [row[0] for row in contents["schema_version"]] == list(range(1, later.VERSION + 1))
    assert contents["schema_version"][-1][2] == "runs.note"
    assert all(row[-1] is None for row in contents["runs"])  # the new column, last


def test_a_reader_does_not_create_a_store(backend):
    with pytest.raises(StoreUnavailableError, match=f"results store {backend.url}: no store there"):
        open_store(backend.url, create=False)
    assert backend.contents() in (None, {})
    open_store(backend.url).close()
    open_store(backend.url, create=False).close()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://me@host/db", "store URL 'mysql://me@host/db' is not of a supported kind; use postgresql://"),
        ("results/history.db", "store URL 'results/history.db' is not a URL"),
        ("sqlite://", "store URL 'sqlite://' names no file"),
        ("sqlite:///:memory:", "store URL 'sqlite:///:memory:' names no file"),
        ("postgresql://me@host:port/db", "store URL 'postgresql://me@host:port/db' is not a URL"),
    ],
)
def test_urls_of_other_kinds_are_refused(url, expected):
    with pytest.raises(StoreURLError) as refused:
        open_store(url)
    assert str(refused.value).startswith(expected)


def test_credentials_come_from_the_environment(postgres_server, monkeypatch):
    url = f"postgresql://{POSTGRES_USER}@127.0.0.1:{postgres_server.port}/{postgres_server.new_database()}"
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent")
    with pytest.raises(StoreUnavailableError, match=f"results store {url}: .*password"):
        open_store(url)
    monkeypatch.setenv("PGPASSWORD", postgres_server.password)
    open_store(url).close()


# Processes: a killed ingest, concurrent ingests.

INGEST_SCRIPT = """
import sys, time
from pathlib import Path
sys.path[:0] = [sys.argv[1], str(Path(sys.argv[1]).parents[1]), str(Path(sys.argv[1]).parents[2])]
from test_store import manifest, record_files
from mlcampaign.history.store import open_store

url, go, hold, *jobs = sys.argv[2:]
if hold:
    # Stop inside the write transaction, once records are inserted and before the commit: the
    # test then reads the store and kills this process there.
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def hold_after_records(connection, cursor, statement, *args):
        if statement.lstrip().upper().startswith("INSERT INTO RECORDS"):
            Path(hold).touch()
            time.sleep(3600)

    event.listen(Engine, "after_cursor_execute", hold_after_records)
ingests = [(manifest(run_id, site), record_files(int(first), int(count), run_id))
           for run_id, site, first, count in (job.split(":") for job in jobs)]
print("ready", flush=True)
while not Path(go).exists():
    time.sleep(0.01)
with open_store(url) as results:
    for run_manifest, files in ingests:
        print(results.ingest(run_manifest, files).records_added, flush=True)
"""


def start_ingests(backend: Backend, go: Path, *jobs: str, hold: Path | None = None) -> subprocess.Popen:
    """A process that ingests ``jobs`` ("run_id:site:first:count") once ``go`` exists; with ``hold``,
    it creates that file after inserting records, inside the transaction, and waits there."""
    process = subprocess.Popen(
        [sys.executable, "-c", INGEST_SCRIPT, str(TESTS), backend.url, str(go), str(hold or ""), *jobs],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "ready\n", process.communicate()[1]
    return process


def test_a_killed_ingest_leaves_nothing_of_its_run(backend, tmp_path):
    count = 10_000
    with open_store(backend.url) as results:
        results.ingest(manifest("kept"), record_files(0, 3))
        before = backend.contents()
        go, inserted = tmp_path / "go", tmp_path / "inserted"
        process = start_ingests(backend, go, f"killed:archer2:0:{count}", hold=inserted)
        go.touch()
        deadline = time.monotonic() + 300
        while not inserted.exists():
            assert process.poll() is None, f"the ingest ended before inserting records: {process.communicate()}"
            assert time.monotonic() < deadline, "the ingest never started writing"
            time.sleep(0.005)
        assert backend.writer_is_inserting()
        # Readers are not blocked by the writer, and do not see its uncommitted records.
        assert [run.run_id for run in results.list_runs()] == ["kept"]
        process.send_signal(signal.SIGKILL)
        process.communicate()
        assert process.returncode == -signal.SIGKILL

    with open_store(backend.url) as results:
        assert {run.run_id: run.records for run in results.list_runs()} == {"kept": 3}
        assert backend.contents() == before
        # The store takes the whole run afterwards.
        results.ingest(manifest("killed"), record_files(0, count, "killed"))
        assert {run.run_id: run.records for run in results.list_runs()} == {"kept": 3, "killed": count}


def test_concurrent_ingests_lose_nothing(backend, tmp_path):
    # Two processes open a store that does not exist yet (so they race to create it), then ingest
    # the same new run (overlapping records) and a run each, at once.
    go = tmp_path / "go"
    first = start_ingests(backend, go, "shared:archer2:0:1500", "run-a:archer2:0:1500")
    second = start_ingests(backend, go, "shared:archer2:750:1500", "run-b:cirrus:1500:1500")
    go.touch()
    outputs = [process.communicate() for process in (first, second)]
    assert [process.returncode for process in (first, second)] == [0, 0], outputs
    added = [[int(line) for line in stdout.split()] for stdout, _ in outputs]
    assert added[0][0] + added[1][0] == 2250  # every distinct record of the shared run added once
    assert (added[0][1], added[1][1]) == (1500, 1500)
    with open_store(backend.url) as results:
        stored = results.records(["shared", "run-a", "run-b"])
        assert stored["shared"] == [file.record for file in record_files(0, 2250)]
        assert stored["run-a"] == [file.record for file in record_files(0, 1500)]
        assert stored["run-b"] == [file.record for file in record_files(1500, 1500)]
        assert results.schema_version == migrations.MIGRATIONS[-1].VERSION
    assert [row[0] for row in backend.contents()["schema_version"]] == [m.VERSION for m in migrations.MIGRATIONS]


# Published MLPerf HPC results (tables of schema version 3).


def published_run(system: str = "sys-a", round_name: str = "v3.0", logs: int = 3, **changes) -> PublishedRun:
    """A published run of ``logs`` DeepCAM logs; log i has the same record in every run and round."""
    records = [
        {"sha256": hashlib.sha256(bytes([i])).hexdigest(), "benchmark": "deepcam", "time_to_train_min": 10.0 + i}
        for i in range(logs)
    ]
    fields = {
        "round": round_name,
        "submitter": "Org",
        "system": system,
        "source": f"round/Org/results/{system}",
        "description": {"submitter": "Org", "number_of_nodes": "4", "accelerators_per_node": "4"},
        "logs": [PublishedLog("strong", "deepcam", f"result_{i}.txt", record) for i, record in enumerate(records)],
        "scores": [{"scaling": "strong", "benchmark": "deepcam", "time_to_train_min": 11.0}],
    }
    return PublishedRun(**(fields | changes))


def test_published_runs_are_idempotent_and_a_log_in_two_rounds_is_one_row(backend):
    with open_store(backend.url) as results:
        first = results.ingest_published(published_run())
        assert (first.run_created, first.logs_added, first.logs_present) == (True, 3, 0)
        before = backend.contents()
        again = results.ingest_published(published_run(source="elsewhere/Org/results/sys-a"))  # same content
        assert (again.run_created, again.logs_added, again.logs_present) == (False, 0, 3)
        assert backend.contents() == before
        older = results.ingest_published(published_run(round_name="v2.0", logs=4))
        assert (older.run_created, older.logs_added, older.logs_present) == (True, 1, 3)
        stored = results.published_results()
    contents = backend.contents()
    assert len(contents["published_logs"]) == 4 and len(contents["published_log_files"]) == 7
    assert [(run["round"], len(run["logs"]), run["scores"]) for run in stored] == [
        ("v2.0", 4, published_run().scores),
        ("v3.0", 3, published_run().scores),
    ]
    assert stored[1]["logs"][0] == {
        "scaling": "strong",
        "benchmark": "deepcam",
        "file": "result_0.txt",
        "record": published_run().logs[0].record,
    }


def test_a_published_run_stored_with_other_content_is_refused_with_nothing_written(backend):
    with open_store(backend.url) as results:
        results.ingest_published(published_run())
        before = backend.contents()
        other = published_run(logs=4, description={"submitter": "Org", "number_of_nodes": "8"})
        with pytest.raises(PublishedRunConflictError) as refused:
            results.ingest_published(other)
    message = str(refused.value)
    assert message.startswith("round/Org/results/sys-a: published run v3.0/Org/sys-a is already in results store")
    assert "systems description: number_of_nodes ('4' in the store, '8' given)" in message
    assert "accelerators_per_node (only in the store)" in message
    assert f"strong/deepcam/result_3.txt (sha256 {other.logs[3].record['sha256'][:12]}…, not in the store)" in message
    assert backend.contents() == before


def test_a_published_run_with_another_score_is_refused_or_superseded_keeping_the_stored_one(backend):
    with open_store(backend.url) as results:
        results.ingest_published(published_run())
        before = backend.contents()
        rescored = published_run(scores=[{"scaling": "strong", "benchmark": "deepcam", "time_to_train_min": 11.5}])
        with pytest.raises(
            PublishedRunConflictError,
            match=r"strong/deepcam score: time_to_train_min \(11\.0 in the store, 11\.5 given\)",
        ):
            results.ingest_published(rescored)
        assert backend.contents() == before
        replaced = results.ingest_published(rescored, supersede=True)
        assert (replaced.run_created, replaced.superseded, replaced.logs_added, replaced.logs_present) == (
            False,
            True,
            0,
            3,
        )
        (stored,) = results.published_results()
        (kept,) = results.superseded_published_runs()
        again = results.ingest_published(rescored, supersede=True)
    assert stored["scores"] == rescored.scores and kept["scores"] == published_run().scores
    assert (kept["round"], kept["submitter"], kept["system"], kept["source"]) == (
        "v3.0",
        "Org",
        "sys-a",
        "round/Org/results/sys-a",
    )
    assert [file[2] for file in kept["files"]] == ["result_0.txt", "result_1.txt", "result_2.txt"]
    assert (again.run_created, again.superseded) == (False, False)  # the same again: nothing written


def test_a_version_3_store_is_upgraded_keeping_its_published_runs(backend, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:3])
        with open_store(backend.url) as results:
            results.ingest_published(published_run())
            assert results.schema_version == 3
    with open_store(backend.url) as results:
        assert results.schema_version == 4
        assert [run["system"] for run in results.published_results()] == ["sys-a"]
        assert results.superseded_published_runs() == []


def test_a_version_1_store_is_upgraded_keeping_its_runs(backend, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:1])
        with open_store(backend.url) as results:
            results.ingest(manifest("2026w48"), record_files(0, 3))
            assert results.schema_version == 1
    with open_store(backend.url) as results:
        assert results.schema_version == migrations.MIGRATIONS[-1].VERSION
        assert results.records(["2026w48"])["2026w48"] == [file.record for file in record_files(0, 3)]
        results.ingest_published(published_run())
        assert len(results.published_results()) == 1
