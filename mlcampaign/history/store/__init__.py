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
        store.superseded_published_runs()            # what imports with supersede replaced

Store URLs (mlcampaign.plan.urls, where their forms are): ``sqlite:///path.db`` (embedded, relative to the
working directory; ``sqlite:////absolute/path.db``) or ``postgresql://user@host:port/dbname``, never with a
password (libpq takes it from the environment).

Ingest: ``ResultsStore.ingest(manifest, records)`` adds a run and its records in one transaction.
A record's key is the sha256 of its canonical JSON (``canonical_json``), so ingesting the same
record again adds nothing, while a run gains the records it did not have. Refused before anything is
written: a manifest whose run id, campaign or site is not a name (mlcampaign.plan.names) or that holds a
number that is not finite (mlcampaign.plan.numbers); a run id already stored as another run (another
campaign, site or start: RUN_IDENTITY); a record that fails the record schema, whose ``run`` block or
campaign names another run, or whose system the manifest does not put at the run's site (nor a trial its
plan marks ``at_site``). A run's own workflow continues it (``supersede=True``): a re-run trial's new record
joins its failure record, and a run planned again with a changed config replaces its manifest, the one it
replaces kept in superseded_manifests. Otherwise (an import of another site's bundle, the ingest of a run
folder an import wrote) both are refused (SupersedeError) unless asked for. The rules against what is held
of a run id are one check (mlcampaign.history.store.superseding.admit) that an import into a results folder
makes too; ``check_run`` checks a manifest and its records as ingest does, without a store (bundles use it).

Reading checks every row it returns: a record whose text is not the content its key was computed from,
or JSON with a number that is not finite, or a manifest that is not the run's, is a DamagedStoreError naming
the run and the row.

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
before it and the queries are one contract for all of them (what "atomic per run", "idempotent" and
"concurrent ingests lose nothing" mean); the schema itself is in the migrations.

The package, one module per concern: ``tables`` (the tables as the queries use them, and utc_text),
``checks`` (of a run before its ingest, of every row read back), ``superseding`` (a run against what is held
of its id), ``connection`` (an open store: its transactions and schema version), ``ingest``, ``queries`` and
``published`` (the store's operations, each a part of ``ResultsStore``), ``errors``, ``backend`` and
``backends/``, ``migrations/``. The record schema the checks apply is mlcampaign.records.schema.

Published MLPerf HPC results (mlcampaign.history.store.published) are kept in tables of their own, beside
the runs: one published run per (round, submitter, system), one row per distinct result log. Their ingest
has the same rules: idempotent (a run stored with the same content writes nothing; a log already stored,
in any round, is not stored again), atomic per run, refused before anything is written where a run is
stored with other content (PublishedRunConflictError: another systems description, other logs, another
score) unless asked to supersede it, the stored content then kept in superseded_published_runs.

The schema is created and upgraded by the migrations in mlcampaign.history.store.migrations, applied in
order on open; a store of a newer schema version than this code knows is refused and left untouched.
docs/history.md describes the tables, the choice of SQLite and the concurrency of ingests.
"""

from __future__ import annotations

from mlcampaign.history.store.checks import RecordFile, check_run
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
from mlcampaign.history.store.ingest import Ingest, IngestResult
from mlcampaign.history.store.published import PublishedResults
from mlcampaign.history.store.queries import Queries, RunSummary, SupersededManifest
from mlcampaign.plan.urls import URLError, parse_store_url, store_backends

__all__ = [
    "DamagedStoreError",
    "IngestResult",
    "ManifestError",
    "PublishedRunConflictError",
    "RecordError",
    "RecordFile",
    "ResultsStore",
    "RunConflictError",
    "RunSummary",
    "SchemaVersionError",
    "StoreError",
    "StoreURLError",
    "StoreUnavailableError",
    "SupersedeError",
    "SupersededManifest",
    "UnknownRunError",
    "check_run",
    "open_store",
]


class ResultsStore(Ingest, Queries, PublishedResults):
    """A results store (see the package docstring); open one with open_store, close it when done. Each of
    its parts is a module of the package: ingest, queries, published results, all on one StoreConnection."""


def open_store(url: str, *, create: bool = True) -> ResultsStore:
    """Open the results store at ``url``, creating it (create=True) or upgrading its schema as needed.

    A URL of no kind of store is a StoreURLError; an unreachable store raises StoreUnavailableError naming
    the URL within a few seconds; with create=False a store that does not exist yet is an error too (for
    readers, where a mistyped URL should not look like an empty history)."""
    try:
        parsed = parse_store_url(url)
    except URLError as error:
        raise StoreURLError(str(error)) from None
    backend = store_backends()[parsed.drivername]
    store = ResultsStore(url, backend, backend.engine(parsed, url, create))
    try:
        store._migrate(create)
    except BaseException:
        store.close()
        raise
    return store
