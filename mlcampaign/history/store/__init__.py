"""The results store: every record of every run, with the run's manifest, in one queryable database.

    from mlcampaign.history.store import RecordFile, open_store

    with open_store("sqlite:///results/history.db") as store:
        store.ingest(manifest, [RecordFile("…/record.json", record), ...])  # -> IngestResult
        store.list_runs(campaign="epcc-2024", site="archer2")               # [RunSummary], oldest first
        store.manifest("2026w48")                                           # the run.json dict
        store.records(["2026w48", "2026w49"])                               # {run_id: [record dict]}
        store.latest_runs("epcc-2024")                                      # {site: RunSummary}
        store.superseded_manifests("2026w48")                               # [SupersededManifest], oldest first
        store.ingest_published(published_run)        # a published MLPerf HPC run -> PublishedIngestResult
        store.published_results()                    # every published run with its scores and logs

Store URLs:
    sqlite:///relative/path.db      embedded store, relative to the working directory
    sqlite:////absolute/path.db     (SQLAlchemy's form: a fourth slash starts an absolute path)
    postgresql://user@host:port/dbname   a PostgreSQL server (driver: psycopg 3)
A URL never holds a password (it lives in campaign files under version control): libpq takes it from
the environment (PGPASSWORD, PGPASSFILE / ~/.pgpass; PGUSER, PGHOST, ... fill in what the URL leaves out).

Ingest: ``ResultsStore.ingest(manifest, records)`` adds a run and its records in one transaction.
A record's key is the sha256 of its canonical JSON (``canonical_json``), so ingesting the same
record again adds nothing, while a run gains the records it did not have. A run id already stored as
another run (another campaign, site or start: RUN_IDENTITY), a record that fails the record schema,
and a record whose ``run`` block or campaign names another run are refused before anything is written.
A run's own workflow continues it (``supersede=True``): a re-run trial's new record joins its failure
record, and a run planned again with a changed config replaces its manifest, the one it replaces kept in
superseded_manifests. Otherwise (an import of another site's bundle) both are refused (SupersedeError)
unless asked for. ``check_run`` checks a manifest and its records as ingest does, without a store
(bundles use it).

Reading checks every row it returns: a record whose text is not the content its key was computed from,
or a manifest that is not the run's, is a DamagedStoreError naming the run and the row.

Time: runs are ordered by their start (the previous run a regression check compares with, the
latest run of a site), so a new run that starts in the future of the ingesting machine's clock (by
more than mlcampaign.plan.runs.CLOCK_TOLERANCE) is refused; one that starts before the latest stored
run of its campaign at its site is ingested (a site may send an older run late) with a warning
(``IngestResult.warnings``). ``check_planned_run`` makes these checks, and the run id's, when the
workflow plans a run, before any trial trains (where a new run before the site's latest is refused:
the planning machine's clock is behind). A trial's current record is its run folder's
``record.json``, the others its earlier attempts (``superseded/``): ``records`` returns a trial's
records in attempt order, those first ingested from ``superseded/`` before those first ingested as
``record.json``, each by the ingest that added them (``ingested_utc``, which keeps increasing within
a run whatever the ingesting machine's clock): the last is the latest ``record.json``. Never by
``finished_utc``, which the clock of the trial's own node wrote.

Errors: every refusal raises a StoreError subclass whose message names what it concerns: the store
URL (never with a password), the manifest's or record's file, the run, the key.

What differs between kinds of store (connection set-up, locking, SQL dialect) is a backend object
(mlcampaign.history.store.backend; one module each in ``backends/``); the rules of ingest, the checks
before it and the queries here are one contract for all of them (what "atomic per run", "idempotent" and
"concurrent ingests lose nothing" mean); the schema itself is in the migrations.

Published MLPerf HPC results (mlcampaign.history.store.published) are kept in tables of their own, beside
the runs: one published run per (round, submitter, system), one row per distinct result log. Their ingest
has the same rules: idempotent (a run stored with the same content writes nothing; a log already stored,
in any round, is not stored again), atomic per run, refused before anything is written where a run is
stored with other content (PublishedRunConflictError).

The schema is created and upgraded by the migrations in mlcampaign.history.store.migrations, applied in
order on open; a store of a newer schema version than this code knows is refused and left untouched.
docs/history.md describes the tables, the choice of SQLite and the concurrency of ingests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

import fastjsonschema
import jsonschema
import sqlalchemy
from sqlalchemy import case, column, func, inspect, select, table
from sqlalchemy.engine import URL, Connection, Engine

from mlcampaign.history.store import migrations
from mlcampaign.history.store.backend import Backend, backend_kinds, url_forms
from mlcampaign.history.store.errors import (
    DamagedStoreError,
    ManifestError,
    PublishedRunConflictError,
    RecordError,
    RunConflictError,
    SchemaVersionError,
    StoreError,
    StoreUnavailableError,
    StoreURLError,
    SupersedeError,
    UnknownRunError,
)
from mlcampaign.history.store.published import (
    _PUBLISHED_LOG_FILES,
    _PUBLISHED_LOGS,
    _PUBLISHED_RUNS,
    _PUBLISHED_SCORES,
    PUBLISHED_RESULT_KEY,
    PUBLISHED_RUN_KEY,
    PublishedIngestResult,
    PublishedRun,
)
from mlcampaign.plan.config_files import load_schema, non_finite_numbers
from mlcampaign.plan.runs import CLOCK_TOLERANCE, RUN_ID
from mlcampaign.records.files import SUPERSEDED_DIR, canonical_json, validate_record

# What makes a run the one it is: a manifest under a stored run's id with other values of these is
# another run (refused); with the same, it is the run planned again (its config changed), and
# replaces the stored manifest.
RUN_IDENTITY = ("campaign", "site", "started_utc")
# Run ids and campaign names (as the campaign schema has them): each is a directory name in results/.
NAME_PATTERN = RUN_ID
# A record's trial: the records-table columns that name it.
TRIAL_KEY = ("system", "benchmark", "cell", "trial", "replicate")
# How many of a manifest's differences a refusal names.
SHOWN_DIFFERENCES = 5
_DAMAGED_REMEDY = (
    "the store was changed outside mlcampaign: restore it from a backup, or delete the run's rows and ingest "
    "the run again from its folder or bundle"
)

# The tables of the newest schema version, as the queries below use them (their definitions, with
# types and keys, are in the migrations).
_SCHEMA_VERSION = table("schema_version", column("version"), column("applied_utc"), column("description"))
_RUNS = table(
    "runs",
    column("run_id"),
    column("campaign"),
    column("site"),
    column("started_utc"),
    column("workflow_commit"),
    column("manifest_json"),
    column("ingested_utc"),
)
_SUPERSEDED_MANIFESTS = table(
    "superseded_manifests",
    column("run_id"),
    column("manifest_sha256"),
    column("manifest_json"),
    column("superseded_utc"),
    column("superseded_by"),
)
_RECORDS = table(
    "records",
    column("run_id"),
    column("content_sha256"),
    column("system"),
    column("benchmark"),
    column("cell"),
    column("trial"),
    column("replicate"),
    column("status"),
    column("finished_utc"),
    column("source_path"),
    column("ingested_utc"),
    column("record_json"),
)


@dataclasses.dataclass(frozen=True)
class RecordFile:
    """A record and the file it was read from (the file is named in error messages and kept)."""

    path: str
    record: dict


@dataclasses.dataclass(frozen=True)
class IngestResult:
    run_id: str
    run_created: bool  # the run was not in the store before this ingest
    records_added: int  # distinct records the store did not have
    records_present: int  # distinct records it already had (nothing written for them)
    manifest_superseded: bool = False  # the stored manifest was replaced (and kept in superseded_manifests)
    trials_superseded: int = 0  # trials the store had records of that gained a record
    warnings: tuple[str, ...] = ()  # what was ingested but is suspect (a new run older than its site's latest)


@dataclasses.dataclass(frozen=True)
class SupersededManifest:
    manifest: dict
    superseded_utc: str  # when a newer manifest replaced it
    superseded_by: str  # the file the newer manifest came from


@dataclasses.dataclass(frozen=True)
class RunSummary:
    run_id: str
    campaign: str
    site: str
    started_utc: str  # the manifest's started_utc, normalised (see utc_text)
    workflow_commit: str | None
    records: int  # distinct records stored for the run
    ingested_utc: str  # when the run was first ingested
    updated_utc: str  # when records were last added to it (ingested_utc if never since)


def utc_text(value: str) -> str:
    """An ISO 8601 time with a UTC offset as fixed-width UTC text, whose text order is time order.

    Raises ValueError for text that is not such a time (a time without offset is ambiguous)."""
    instant = datetime.datetime.fromisoformat(value)
    if instant.tzinfo is None:
        raise ValueError(f"time {value!r} has no UTC offset")
    return instant.astimezone(datetime.UTC).isoformat(timespec="microseconds")


def _now_utc() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


def _after(text: str) -> str:
    """The utc_text one microsecond after ``text``."""
    instant = datetime.datetime.fromisoformat(text) + datetime.timedelta(microseconds=1)
    return instant.isoformat(timespec="microseconds")


@dataclasses.dataclass(frozen=True)
class _Run:
    """What the runs table holds of a manifest."""

    run_id: str
    campaign: str
    site: str
    started_utc: str
    workflow_commit: str | None
    manifest_json: str
    source: str

    @classmethod
    def from_manifest(cls, manifest: Any, source: str) -> _Run:
        if not isinstance(manifest, dict):
            raise ManifestError(f"{source}: a run manifest is a JSON object, not {type(manifest).__name__}")
        run_id = manifest.get("run_id")
        for key in ("run_id", "campaign"):
            if not isinstance(manifest.get(key), str) or not NAME_PATTERN.fullmatch(manifest[key]):
                raise ManifestError(
                    f"{source}: key '{key}': value {manifest.get(key)!r} is not a name "
                    "(letters, digits, '.', '_', '-', starting with a letter or digit)"
                )
        for key in ("site", "started_utc"):
            if not isinstance(manifest.get(key), str) or not manifest[key]:
                raise ManifestError(f"{source}: run '{run_id}': key '{key}': value {manifest.get(key)!r} is not text")
        try:
            started = utc_text(manifest["started_utc"])
        except ValueError as error:
            raise ManifestError(f"{source}: run '{run_id}': key 'started_utc': {error}") from None
        commit = manifest.get("workflow_commit")
        if commit is not None and not isinstance(commit, str):
            raise ManifestError(f"{source}: run '{run_id}': key 'workflow_commit': value {commit!r} is not text")
        try:
            text = canonical_json(manifest)
        except RecursionError:
            raise ManifestError(f"{source}: run '{run_id}': the manifest is nested too deeply") from None
        return cls(run_id, manifest["campaign"], manifest["site"], started, commit, text, source)


# Keywords that draft 2020-12 (the record schema's) and fastjsonschema's draft 2019-09 define alike;
# with others the two could disagree, and records are then checked by jsonschema alone. Both ignore
# "x-" keywords (the project's annotations, e.g. x-registry).
_SHARED_KEYWORDS = frozenset(
    {
        "$schema", "$id", "$ref", "$defs", "$comment", "title", "description", "default", "examples",
        "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
        "minProperties", "maxProperties", "items", "minItems", "maxItems", "uniqueItems", "minimum",
        "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
        "pattern", "oneOf", "anyOf", "allOf", "not",
    }
)  # fmt: skip
_SCHEMA_MAPS = ("$defs", "properties", "patternProperties")  # keywords whose values map names to schemas
_SCHEMA_LISTS = ("oneOf", "anyOf", "allOf")
_SUBSCHEMAS = ("additionalProperties", "items", "not")


def uses_shared_keywords(schema: Any) -> bool:
    """Whether a JSON schema (and every schema in it) uses only keywords of _SHARED_KEYWORDS."""
    if not isinstance(schema, dict):
        return True  # a boolean schema
    for keyword, value in schema.items():
        if keyword.startswith("x-"):
            continue
        if keyword not in _SHARED_KEYWORDS:
            return False
        if keyword in _SCHEMA_MAPS:
            nested = list(value.values())
        elif keyword in _SCHEMA_LISTS:
            nested = value
        elif keyword in _SUBSCHEMAS:
            nested = [value]
        else:
            continue
        if not all(uses_shared_keywords(subschema) for subschema in nested):
            return False
    return True


class _RecordSchema:
    """The record schema that mlcampaign.records.files.validate_record checks, at ingest speed.

    validate_record (jsonschema) takes ~0.8 ms a record, 80 s for 100 000; the schema compiled to
    Python by fastjsonschema takes ~0.05 ms. validate_record stays the judge: a record the compiled
    schema rejects is refused only if validate_record rejects it too, and its error is the message."""

    def __init__(self) -> None:
        schema = load_schema("record")
        self._compiled = fastjsonschema.compile(schema) if uses_shared_keywords(schema) else None

    def error(self, record: dict) -> str | None:
        """None for a valid record, else validate_record's error: where in the record, and what."""
        if self._compiled is not None:
            try:
                self._compiled(record)
                # Bounds pass NaN (its comparisons are all false): validate_record finds it.
                if next(non_finite_numbers(record), None) is None:
                    return None
            except fastjsonschema.JsonSchemaValueException:
                pass
        try:
            validate_record(record)
        except jsonschema.ValidationError as error:
            where = ".".join(str(part) for part in error.absolute_path) or "<top level>"
            return f"at '{where}': {error.message}"
        return None


@functools.cache
def _record_schema() -> _RecordSchema:
    return _RecordSchema()


def _check_belongs_to_run(record_file: RecordFile, run: _Run) -> None:
    """A record's run block (schema 1.1) and its trial's campaign must be the manifest's run and campaign."""
    record = record_file.record
    trial = record.get("trial")
    campaign = trial.get("campaign") if isinstance(trial, dict) else None
    if campaign is not None and campaign != run.campaign:
        raise RecordError(
            f"{record_file.path}: the record's key 'trial.campaign' names campaign {campaign!r}, not campaign "
            f"'{run.campaign}' of run '{run.run_id}' ({run.source})"
        )
    block = record.get("run")
    if block is None:
        return
    named = (block.get("id"), block.get("site")) if isinstance(block, dict) else (block, None)
    if named != (run.run_id, run.site):
        raise RecordError(
            f"{record_file.path}: the record's run block names run {named[0]!r} at site {named[1]!r}, "
            f"not run '{run.run_id}' at site '{run.site}' of {run.source}"
        )


def _distinct(records: Iterable[RecordFile], run: _Run) -> dict[str, tuple[RecordFile, str]]:
    """The records by content key (a record given twice is one), each with its canonical JSON."""
    distinct = {}
    for record_file in records:
        if not isinstance(record_file.record, dict):
            raise RecordError(f"{record_file.path}: a record is a JSON object, not {type(record_file.record).__name__}")
        _check_belongs_to_run(record_file, run)
        try:
            text = canonical_json(record_file.record)
        except RecursionError:
            raise RecordError(f"{record_file.path}: the record is nested too deeply") from None
        distinct.setdefault(hashlib.sha256(text.encode()).hexdigest(), (record_file, text))
    return distinct


def _trial_key(row: dict) -> tuple:
    return tuple(row[name] for name in TRIAL_KEY)


def _record_row(run_id: str, key: str, record_file: RecordFile, text: str, now: str) -> dict:
    """The records-table row of a record, after checking it against the record schema."""
    record = record_file.record
    problem = _record_schema().error(record)
    if problem is not None:
        raise RecordError(f"{record_file.path}: the record does not satisfy the record schema {problem}")
    try:
        finished = utc_text(record["provenance"]["finished_utc"])
    except ValueError as error:
        raise RecordError(f"{record_file.path}: key 'provenance.finished_utc': {error}") from None
    trial = record["trial"]
    return {
        "run_id": run_id,
        "content_sha256": key,
        "system": trial["system"],
        "benchmark": trial["benchmark"],
        "cell": trial["cell"],
        "trial": trial["trial"],
        "replicate": trial["replicate"],
        "status": record["status"],
        "finished_utc": finished,
        "source_path": record_file.path,
        "ingested_utc": now,
        "record_json": text,
    }


def check_run(manifest: dict, records: Iterable[RecordFile], *, manifest_source: str = "run manifest") -> None:
    """Make every check ingest makes, without a store: the manifest files a run, every record
    satisfies the record schema and belongs to that run. Raises ManifestError or RecordError."""
    run = _Run.from_manifest(manifest, manifest_source)
    now = _now_utc()
    for key, (record_file, text) in _distinct(records, run).items():
        _record_row(run.run_id, key, record_file, text, now)


def _json_differences(stored: Any, given: Any, prefix: str = "") -> list[str]:
    """Where two JSON documents differ, as dotted key paths (with both values where they are scalars).

    Values are compared as canonical JSON, for which 1 and 1.0, or 1 and true, differ as in the store."""
    if isinstance(stored, dict) and isinstance(given, dict):
        differences = []
        for key in sorted(stored.keys() | given.keys()):
            path = f"{prefix}{key}"
            if key not in stored or key not in given:
                differences.append(f"{path} ({'only in the store' if key in stored else 'not in the store'})")
            elif canonical_json(stored[key]) != canonical_json(given[key]):
                differences.extend(_json_differences(stored[key], given[key], f"{path}."))
        return differences
    path = prefix.removesuffix(".") or "<top level>"
    if isinstance(stored, dict | list) or isinstance(given, dict | list):
        return [path]
    return [f"{path} ({stored!r} in the store, {given!r} given)"]


def parse_store_url(url: str) -> URL:
    """The SQLAlchemy URL of a store URL; StoreURLError for other kinds and for embedded passwords."""
    try:
        parsed = sqlalchemy.make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError) as error:
        raise StoreURLError(f"store URL {url!r} is not a URL ({error}); use {url_forms()}") from None
    if parsed.password is not None or "password" in parsed.query:
        raise StoreURLError(
            f"store URL {url!r} embeds a password: store URLs live in "
            "campaign files under version control; remove it and give it in the environment instead "
            "(PGPASSWORD, or a PGPASSFILE / ~/.pgpass entry)"
        )
    backend = backend_kinds().get(parsed.drivername)
    if backend is None:
        raise StoreURLError(f"store URL {url!r} is not of a supported kind; use {url_forms()}")
    backend.check_url(parsed, url)
    return parsed


def open_store(url: str, *, create: bool = True) -> ResultsStore:
    """Open the results store at ``url``, creating it (create=True) or upgrading its schema as needed.

    An unreachable store raises StoreUnavailableError naming the URL within a few seconds; with
    create=False a store that does not exist yet is an error too (for readers, where a mistyped
    URL should not look like an empty history)."""
    parsed = parse_store_url(url)
    backend = backend_kinds()[parsed.drivername]
    store = ResultsStore(url, backend, backend.engine(parsed, url, create))
    try:
        store._migrate(create)
    except BaseException:
        store.close()
        raise
    return store


class ResultsStore:
    """A results store (see the module docstring); open one with open_store, close it when done."""

    def __init__(self, url: str, backend: Backend, engine: Engine) -> None:
        self.url = url
        self._backend = backend
        self._engine = engine
        self._reader = backend.reader(engine)
        self._writer = backend.writer(engine)

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._engine.dispose()

    @contextlib.contextmanager
    def _database_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlalchemy.exc.OperationalError as error:
            raise StoreUnavailableError(f"results store {self.url}: {error.orig}") from error
        except sqlalchemy.exc.DBAPIError as error:
            raise StoreError(f"results store {self.url}: {error.orig}") from error

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Connection]:
        with self._database_errors(), self._reader.begin() as connection:
            yield connection

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Connection]:
        with self._database_errors(), self._writer.begin() as connection:
            yield connection

    # Schema versions.

    @property
    def schema_version(self) -> int:
        with self._reading() as connection:
            return _schema_version(connection)

    def _refuse_newer(self, version: int) -> None:
        known = migrations.MIGRATIONS[-1].VERSION
        if version > known:
            raise SchemaVersionError(
                f"results store {self.url} has schema version {version}, newer than the {known} this "
                "mlcampaign knows: use a newer mlcampaign with it (the store was left untouched)"
            )

    def _migrate(self, create: bool) -> None:
        with self._reading() as connection:
            version = _schema_version(connection)
        self._refuse_newer(version)
        if version == migrations.MIGRATIONS[-1].VERSION:
            return
        if version == 0 and not create:
            raise StoreUnavailableError(f"results store {self.url}: no store there (the database has no schema)")
        read_only = self._backend.read_only(self._engine)
        if read_only is not None:
            raise StoreUnavailableError(
                f"results store {self.url} has schema version {version}, older than the "
                f"{migrations.MIGRATIONS[-1].VERSION} this mlcampaign reads, and this user can only read it "
                f"({read_only}): upgrade it once where it can be written (any ingest or import does)"
            )
        with self._database_errors():
            self._backend.prepare_new(self._engine)
        with self._writing() as connection:
            self._backend.lock_migrations(connection)
            version = _schema_version(connection)  # another process may have migrated meanwhile
            self._refuse_newer(version)
            for migration in migrations.MIGRATIONS[version:]:
                migration.upgrade(connection)
                connection.execute(
                    sqlalchemy.insert(_SCHEMA_VERSION).values(
                        version=migration.VERSION, applied_utc=_now_utc(), description=migration.DESCRIPTION
                    )
                )

    # Ingest.

    def ingest(
        self,
        manifest: dict,
        records: Iterable[RecordFile],
        *,
        manifest_source: str = "run manifest",
        supersede: bool = False,
    ) -> IngestResult:
        """Add a run (its manifest) and those of its records the store does not have, atomically.

        ``manifest_source`` names the manifest in error messages (e.g. the path of run.json).
        ``supersede``: the manifest may replace the stored run's (which is kept in superseded_manifests),
        and trials the store has records of may gain records (a re-run's, which is then their current
        outcome: the record the run folder holds as record.json); the run's own workflow continues it so.
        Without, either is a SupersedeError. Raises ManifestError, RecordError, RunConflictError or
        SupersedeError, having written nothing."""
        run = _Run.from_manifest(manifest, manifest_source)
        distinct = _distinct(records, run)
        # Checks and schema validation happen before the write transaction, so that the write lock
        # is held only for the writing; the store only grows, so records missing now are a
        # superset of those missing then.
        with self._reading() as connection:
            self._other_manifest(connection, run, lock=False)
            warnings = self._new_run_problems(connection, run)
            present = self._record_keys(connection, run.run_id)
            last_ingest = connection.execute(
                select(func.max(_RECORDS.c.ingested_utc)).where(_RECORDS.c.run_id == run.run_id)
            ).scalar_one_or_none()
        # The records' ingest order is their trials' attempt order (module docstring): it must not go
        # back when this machine's clock is behind the one that ingested the run before.
        now = max(_now_utc(), _after(last_ingest)) if last_ingest else _now_utc()
        rows = [
            _record_row(run.run_id, key, record_file, text, now)
            for key, (record_file, text) in distinct.items()
            if key not in present
        ]
        with self._writing() as connection:
            created = connection.execute(
                self._backend.insert_or_skip(_RUNS)
                .values(
                    run_id=run.run_id,
                    campaign=run.campaign,
                    site=run.site,
                    started_utc=run.started_utc,
                    workflow_commit=run.workflow_commit,
                    manifest_json=run.manifest_json,
                    ingested_utc=now,
                )
                .on_conflict_do_nothing()
                .returning(_RUNS.c.run_id)
            ).scalar_one_or_none()
            # The run's row lock (PostgreSQL; SQLite's writer holds the database's) makes ingests of
            # one run take turns, so what is read next is exact.
            replaced = self._other_manifest(connection, run, lock=True)
            present = self._record_keys(connection, run.run_id)
            new_rows = [row for row in rows if row["content_sha256"] not in present]
            superseded_trials = self._stored_trials(connection, run.run_id) & {_trial_key(row) for row in new_rows}
            if not supersede and (replaced is not None or superseded_trials):
                raise SupersedeError(self._supersede_refusal(run, replaced, superseded_trials))
            if replaced is not None:
                # The same run, planned again since (a config changed within the run), or an import that
                # supersedes it: its newest manifest, the one it replaces kept.
                connection.execute(
                    self._backend.insert_or_skip(_SUPERSEDED_MANIFESTS)
                    .values(
                        run_id=run.run_id,
                        manifest_sha256=hashlib.sha256(replaced.encode()).hexdigest(),
                        manifest_json=replaced,
                        superseded_utc=now,
                        superseded_by=run.source,
                    )
                    .on_conflict_do_nothing()
                )
                connection.execute(
                    sqlalchemy.update(_RUNS)
                    .where(_RUNS.c.run_id == run.run_id)
                    .values(manifest_json=run.manifest_json, workflow_commit=run.workflow_commit)
                )
            if new_rows:
                connection.execute(sqlalchemy.insert(_RECORDS), new_rows)
        return IngestResult(
            run.run_id,
            created is not None,
            len(new_rows),
            len(distinct) - len(new_rows),
            manifest_superseded=replaced is not None,
            trials_superseded=len(superseded_trials),
            warnings=tuple(warnings),
        )

    def _new_run_problems(self, connection: Connection, run: _Run, *, refuse_older: bool = False) -> list[str]:
        """For a run the store does not hold yet: ManifestError if it starts in the future of this
        machine's clock; a warning (with ``refuse_older``: ManifestError) if it starts before the
        latest stored run of its campaign at its site (module docstring)."""
        stored = select(_RUNS.c.run_id).where(_RUNS.c.run_id == run.run_id)
        if connection.execute(stored).scalar_one_or_none() is not None:
            return []
        now = datetime.datetime.now(datetime.UTC)
        if run.started_utc > utc_text((now + CLOCK_TOLERANCE).isoformat()):
            raise ManifestError(
                f"{run.source}: run '{run.run_id}': key 'started_utc': value '{run.started_utc}' is after this "
                f"machine's clock ({now.isoformat(timespec='seconds')}): a run cannot start in the future; the clock "
                "of the machine that started it was ahead. Runs are ordered by their start, and this one would be "
                "its site's latest for good: correct that clock and start a new run"
            )
        latest = connection.execute(
            select(_RUNS.c.run_id, _RUNS.c.started_utc)
            .where(_RUNS.c.campaign == run.campaign, _RUNS.c.site == run.site)
            .order_by(_RUNS.c.started_utc.desc(), _RUNS.c.run_id.desc())
            .limit(1)
        ).one_or_none()
        if latest is None or latest.started_utc <= run.started_utc:
            return []
        problem = (
            f"{run.source}: run '{run.run_id}' starts at {run.started_utc}, before run '{latest.run_id}' of campaign "
            f"'{run.campaign}' at site '{run.site}' (started {latest.started_utc}) in results store {self.url}: runs "
            "are ordered by their start, so trends and regression checks put it before that run"
        )
        if refuse_older:
            raise ManifestError(
                f"{problem}; this machine's clock is behind, or that run's start is in the future: correct the clock"
            )
        return [f"{problem} (a run sent late is fine; a clock that was behind is not)"]

    def check_planned_run(self, run_id: str, campaign: str, site: str, started_utc: str, *, new: bool) -> None:
        """Before any trial of a run trains, what its ingest would refuse (module docstring): its id
        stored as another run (RunConflictError naming that run's campaign, site and start), a start in
        the future; and for a ``new`` run, a start before the latest stored run of its campaign at its
        site (ManifestError)."""
        source = f"run '{run_id}' of campaign '{campaign}' at site '{site}' (--config run)"
        identity = {"run_id": run_id, "campaign": campaign, "site": site, "started_utc": started_utc}
        run = _Run.from_manifest(identity, source)
        with self._reading() as connection:
            stored = connection.execute(
                select(_RUNS.c.campaign, _RUNS.c.site, _RUNS.c.started_utc).where(_RUNS.c.run_id == run_id)
            ).one_or_none()
            if stored is not None and tuple(stored) != (run.campaign, run.site, run.started_utc):
                raise RunConflictError(
                    f"{source}: run id '{run_id}' is already in results store {self.url} as a run of campaign "
                    f"'{stored.campaign}' at site '{stored.site}', started {stored.started_utc}; a run id names one "
                    "run: name another (--config run=<id>, or run=new)"
                )
            self._new_run_problems(connection, run, refuse_older=new)

    def _other_manifest(self, connection: Connection, run: _Run, *, lock: bool) -> str | None:
        """Refuse a manifest of another run under a stored run's id: another campaign, site or start
        (RunConflictError naming what differs). The stored manifest if it is this run's, planned
        differently (the run's config changed between two invocations of it, or a bundle says otherwise)."""
        query = select(_RUNS.c.manifest_json).where(_RUNS.c.run_id == run.run_id)
        stored = connection.execute(query.with_for_update() if lock else query).scalar_one_or_none()
        if stored is None or stored == run.manifest_json:
            return None
        stored_manifest, given = self._stored_manifest(run.run_id, stored), json.loads(run.manifest_json)
        identity = {key: stored_manifest.get(key) for key in RUN_IDENTITY}
        if identity != {key: given.get(key) for key in RUN_IDENTITY}:
            differences = _json_differences(identity, {key: given.get(key) for key in RUN_IDENTITY})
            raise RunConflictError(
                f"{run.source}: run '{run.run_id}' is already in results store {self.url} as another run; they "
                f"differ in: {'; '.join(differences)}. A run id names one run: give this run another id"
            )
        return stored

    def _supersede_refusal(self, run: _Run, replaced: str | None, trials: set[tuple]) -> str:
        reasons = []
        if replaced is not None:
            differences = _json_differences(json.loads(replaced), json.loads(run.manifest_json))
            shown = "; ".join(differences[:SHOWN_DIFFERENCES])
            more = f" and {len(differences) - SHOWN_DIFFERENCES} more" if len(differences) > SHOWN_DIFFERENCES else ""
            reasons.append(f"its manifest differs from the stored one in: {shown}{more}")
        if trials:
            system, benchmark, cell, trial, replicate = min(trials)
            reasons.append(
                f"{len(trials)} trial(s) the store has records of would get another record "
                f"(e.g. {system}/{benchmark}/{cell} trial {trial} replicate {replicate})"
            )
        return (
            f"{run.source}: run '{run.run_id}' is in results store {self.url}, and {' and '.join(reasons)}: "
            "nothing was written. To supersede the stored run with this one, import with --supersede "
            "(the store keeps the earlier manifest and records)"
        )

    @staticmethod
    def _stored_trials(connection: Connection, run_id: str) -> set[tuple]:
        """The keys of the trials the store has records of in a run."""
        query = select(*(_RECORDS.c[name] for name in TRIAL_KEY)).where(_RECORDS.c.run_id == run_id).distinct()
        return {tuple(row) for row in connection.execute(query)}

    @staticmethod
    def _record_keys(connection: Connection, run_id: str) -> set[str]:
        query = select(_RECORDS.c.content_sha256).where(_RECORDS.c.run_id == run_id)
        return set(connection.execute(query).scalars())

    # Queries.

    def list_runs(self, *, campaign: str | None = None, site: str | None = None) -> list[RunSummary]:
        """The stored runs (of a campaign, at a site when given), oldest start first."""
        run_columns = [_RUNS.c[name] for name in ("run_id", "campaign", "site", "started_utc", "workflow_commit")]
        query = (
            select(
                *run_columns,
                func.count(_RECORDS.c.content_sha256),
                _RUNS.c.ingested_utc,
                func.coalesce(func.max(_RECORDS.c.ingested_utc), _RUNS.c.ingested_utc),
            )
            .select_from(_RUNS.outerjoin(_RECORDS, _RECORDS.c.run_id == _RUNS.c.run_id))
            .group_by(*run_columns, _RUNS.c.ingested_utc)
            .order_by(_RUNS.c.started_utc, _RUNS.c.run_id)
        )
        if campaign is not None:
            query = query.where(_RUNS.c.campaign == campaign)
        if site is not None:
            query = query.where(_RUNS.c.site == site)
        with self._reading() as connection:
            return [RunSummary(*row) for row in connection.execute(query)]

    def latest_runs(self, campaign: str) -> dict[str, RunSummary]:
        """The latest run (by start time) of ``campaign`` at every site that has one."""
        return {run.site: run for run in self.list_runs(campaign=campaign)}  # oldest first: the last wins

    def manifest(self, run_id: str) -> dict:
        """The manifest (run.json) of a stored run, as ingested."""
        with self._reading() as connection:
            stored = connection.execute(
                select(_RUNS.c.manifest_json, *(_RUNS.c[key] for key in RUN_IDENTITY)).where(_RUNS.c.run_id == run_id)
            ).one_or_none()
        if stored is None:
            raise UnknownRunError(f"results store {self.url} has no run '{run_id}'")
        text, *identity = stored
        return self._stored_manifest(run_id, text, dict(zip(RUN_IDENTITY, identity, strict=True)))

    def _stored_manifest(self, run_id: str, text: str, identity: dict | None = None) -> dict:
        """A run's stored manifest, parsed; DamagedStoreError unless it files the run of its row (``identity``:
        the row's RUN_IDENTITY columns, where read)."""
        where = f"results store {self.url}: run '{run_id}': column runs.manifest_json"
        try:
            manifest = json.loads(text)
            filed = _Run.from_manifest(manifest, "the stored manifest")
        except (ValueError, RecursionError, ManifestError) as error:
            raise DamagedStoreError(f"{where} is damaged ({error}); {_DAMAGED_REMEDY}") from None
        row = {"run_id": run_id} | (identity or {})
        found = {key: getattr(filed, key) for key in row}
        if found != row:
            raise DamagedStoreError(f"{where} is damaged: it files run {found}, not the row's {row}; {_DAMAGED_REMEDY}")
        return manifest

    def superseded_manifests(self, run_id: str) -> list[SupersededManifest]:
        """The manifests a stored run had before its current one, oldest first."""
        query = (
            select(*(_SUPERSEDED_MANIFESTS.c[name] for name in ("manifest_json", "superseded_utc", "superseded_by")))
            .where(_SUPERSEDED_MANIFESTS.c.run_id == run_id)
            .order_by(_SUPERSEDED_MANIFESTS.c.superseded_utc, _SUPERSEDED_MANIFESTS.c.manifest_sha256)
        )
        self.manifest(run_id)  # UnknownRunError for a run the store does not have
        with self._reading() as connection:
            rows = connection.execute(query).all()
        return [SupersededManifest(self._stored_manifest(run_id, text), when, by) for text, when, by in rows]

    # Published MLPerf HPC results.

    def ingest_published(self, run: PublishedRun) -> PublishedIngestResult:
        """Add a published run (its description, the logs the store lacks, where each log is, its scores),
        atomically. A run already stored with the same description and logs writes nothing; with other
        ones it is refused (PublishedRunConflictError naming what differs), having written nothing."""
        identity = dict(zip(PUBLISHED_RUN_KEY, run.key, strict=True))
        description = canonical_json(run.description)
        logs = {log.record["sha256"]: canonical_json(log.record) for log in run.logs}
        now = _now_utc()
        with self._writing() as connection:
            created = connection.execute(
                self._backend.insert_or_skip(_PUBLISHED_RUNS)
                .values(**identity, source=run.source, description_json=description, ingested_utc=now)
                .on_conflict_do_nothing()
                .returning(_PUBLISHED_RUNS.c.round)
            ).scalar_one_or_none()
            if created is None:
                self._refuse_other_published_run(connection, run, description)
                return PublishedIngestResult(*run.key, False, 0, len(logs))
            present = set(
                connection.execute(
                    select(_PUBLISHED_LOGS.c.content_sha256).where(_PUBLISHED_LOGS.c.content_sha256.in_(list(logs)))
                ).scalars()
            )
            new_logs = [
                {"content_sha256": key, "record_json": text, "ingested_utc": now}
                for key, text in logs.items()
                if key not in present
            ]
            if new_logs:
                # Another import may store the same log meanwhile (a log shared by two rounds): skipped then.
                connection.execute(self._backend.insert_or_skip(_PUBLISHED_LOGS).on_conflict_do_nothing(), new_logs)
            files = [
                identity | {"scaling": scaling, "benchmark": benchmark, "file": file, "content_sha256": key}
                for scaling, benchmark, file, key in sorted(run.files())
            ]
            if files:
                connection.execute(sqlalchemy.insert(_PUBLISHED_LOG_FILES), files)
            scores = [
                identity
                | {"scaling": score["scaling"], "benchmark": score["benchmark"], "score_json": canonical_json(score)}
                for score in run.scores
            ]
            if scores:
                connection.execute(sqlalchemy.insert(_PUBLISHED_SCORES), scores)
        return PublishedIngestResult(*run.key, True, len(new_logs), len(logs) - len(new_logs))

    def _refuse_other_published_run(self, connection: Connection, run: PublishedRun, description: str) -> None:
        where = [_PUBLISHED_RUNS.c[name] == value for name, value in zip(PUBLISHED_RUN_KEY, run.key, strict=True)]
        stored = connection.execute(select(_PUBLISHED_RUNS.c.description_json).where(*where)).scalar_one()
        file_where = [
            _PUBLISHED_LOG_FILES.c[name] == value for name, value in zip(PUBLISHED_RUN_KEY, run.key, strict=True)
        ]
        stored_files = {
            tuple(row)
            for row in connection.execute(
                select(
                    *(_PUBLISHED_LOG_FILES.c[name] for name in ("scaling", "benchmark", "file", "content_sha256"))
                ).where(*file_where)
            )
        }
        differences = []
        if stored != description:
            differences += _json_differences(json.loads(stored), run.description, "systems description: ")
        given = run.files()
        for scaling, benchmark, file, key in sorted(stored_files ^ given):
            state = "only in the store" if (scaling, benchmark, file, key) in stored_files else "not in the store"
            differences.append(f"{scaling}/{benchmark}/{file} (sha256 {key[:12]}…, {state})")
        if differences:
            raise PublishedRunConflictError(
                f"{run.source}: published run {'/'.join(run.key)} is already in results store {self.url} with other "
                f"content: {'; '.join(differences)}. A published round does not change: import it under another "
                "round name if it is another one"
            )

    def published_results(self) -> list[dict]:
        """Every published run, by (round, submitter, system): its key, ``source``, ``description`` (the
        systems JSON), ``scores`` (one per scaling and benchmark) and ``logs`` (scaling, benchmark, file and
        the log's record), in file order."""
        with self._reading() as connection:
            runs = {
                tuple(row[:3]): {
                    **dict(zip(PUBLISHED_RUN_KEY, row[:3], strict=True)),
                    "source": row[3],
                    "description": json.loads(row[4]),
                    "scores": [],
                    "logs": [],
                }
                for row in connection.execute(
                    select(
                        *(_PUBLISHED_RUNS.c[name] for name in (*PUBLISHED_RUN_KEY, "source", "description_json"))
                    ).order_by(*(_PUBLISHED_RUNS.c[name] for name in PUBLISHED_RUN_KEY))
                )
            }
            score_rows = connection.execute(
                select(
                    *(_PUBLISHED_SCORES.c[name] for name in PUBLISHED_RUN_KEY), _PUBLISHED_SCORES.c.score_json
                ).order_by(*(_PUBLISHED_SCORES.c[name] for name in PUBLISHED_RESULT_KEY))
            )
            for *key, text in score_rows:
                runs[tuple(key)]["scores"].append(json.loads(text))
            files = _PUBLISHED_LOG_FILES
            log_rows = connection.execute(
                select(*(files.c[name] for name in (*PUBLISHED_RESULT_KEY, "file")), _PUBLISHED_LOGS.c.record_json)
                .select_from(files.join(_PUBLISHED_LOGS, _PUBLISHED_LOGS.c.content_sha256 == files.c.content_sha256))
                .order_by(*(files.c[name] for name in (*PUBLISHED_RESULT_KEY, "file")))
            )
            records: dict[str, dict] = {}  # a log stored once is read once
            for *key, scaling, benchmark, file, text in log_rows:
                record = records.setdefault(text, json.loads(text))
                runs[tuple(key)]["logs"].append(
                    {"scaling": scaling, "benchmark": benchmark, "file": file, "record": record}
                )
        return list(runs.values())

    def records(self, run_ids: Iterable[str]) -> dict[str, list[dict]]:
        """The records of each run, as ingested, by trial key and then attempt (module docstring: a
        trial's current record, its run folder's record.json, comes last)."""
        run_ids = list(dict.fromkeys(run_ids))
        records: dict[str, list[dict]] = {run_id: [] for run_id in run_ids}
        with self._reading() as connection:
            stored = set(connection.execute(select(_RUNS.c.run_id).where(_RUNS.c.run_id.in_(run_ids))).scalars())
            missing = [run_id for run_id in run_ids if run_id not in stored]
            if missing:
                raise UnknownRunError(f"results store {self.url} has no run {', '.join(map(repr, missing))}")
            query = (
                select(_RECORDS.c.run_id, _RECORDS.c.content_sha256, _RECORDS.c.record_json)
                .where(_RECORDS.c.run_id.in_(run_ids))
                .order_by(
                    _RECORDS.c.run_id,
                    *(_RECORDS.c[name] for name in TRIAL_KEY),
                    # Records first seen as earlier attempts (superseded/), then those first seen as the
                    # folder's record.json, each by ingest: the last is the latest record.json.
                    case((_RECORDS.c.source_path.like(f"%/{SUPERSEDED_DIR}/%"), 0), else_=1),
                    _RECORDS.c.ingested_utc,
                    _RECORDS.c.content_sha256,
                )
            )
            for run_id, key, text in connection.execute(query):
                records[run_id].append(self._stored_record(run_id, key, text))
        return records

    def _stored_record(self, run_id: str, key: str, text: str) -> dict:
        """A stored record, parsed; DamagedStoreError unless its text is the content its key was computed from."""
        where = f"results store {self.url}: run '{run_id}': the record with content_sha256 {key}"
        if hashlib.sha256(text.encode()).hexdigest() != key:
            raise DamagedStoreError(
                f"{where}: its record_json is not the record ingested (its sha256 differs); {_DAMAGED_REMEDY}"
            )
        try:
            record = json.loads(text)
        except (ValueError, RecursionError) as error:
            raise DamagedStoreError(f"{where}: its record_json is not JSON ({error}); {_DAMAGED_REMEDY}") from None
        if not isinstance(record, dict):
            raise DamagedStoreError(f"{where}: its record_json is not a JSON object; {_DAMAGED_REMEDY}")
        return record


def _schema_version(connection: Connection) -> int:
    """The store's schema version: the newest migration applied, 0 for a database without the schema."""
    if not inspect(connection).has_table("schema_version"):
        return 0
    return connection.execute(select(func.max(_SCHEMA_VERSION.c.version))).scalar_one() or 0
