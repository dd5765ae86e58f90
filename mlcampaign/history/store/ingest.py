"""Ingest into the results store: a run's manifest and records, atomically (the rules are the package's,
mlcampaign.history.store), and the check of a planned run against the runs the store holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable

import sqlalchemy
from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from mlcampaign.history.store.checks import (
    RecordFile,
    RunRow,
    check_sites,
    distinct_records,
    new_run_problems,
    record_row,
    stored_manifest,
)
from mlcampaign.history.store.connection import StoreConnection
from mlcampaign.history.store.errors import RunConflictError
from mlcampaign.history.store.superseding import HeldRun, admit, held_manifest_replaced
from mlcampaign.history.store.tables import RECORDS, RUNS, SUPERSEDED_MANIFESTS, TRIAL_KEY, after, now_utc

# How an import supersedes a stored run (SupersedeError's message).
SUPERSEDE_REMEDY = (
    "To supersede the stored run with this one, import with --supersede (the store keeps the earlier manifest "
    "and records)"
)


@dataclasses.dataclass(frozen=True)
class IngestResult:
    run_id: str
    run_created: bool  # the run was not in the store before this ingest
    records_added: int  # distinct records the store did not have
    records_present: int  # distinct records it already had (nothing written for them)
    manifest_superseded: bool = False  # the stored manifest was replaced (and kept in superseded_manifests)
    trials_superseded: int = 0  # trials the store had records of that gained a record
    warnings: tuple[str, ...] = ()  # what was ingested but is suspect (a new run older than its site's latest)


def _stored_trials(connection: Connection, run_id: str) -> set[tuple]:
    """The keys of the trials the store has records of in a run."""
    query = select(*(RECORDS.c[name] for name in TRIAL_KEY)).where(RECORDS.c.run_id == run_id).distinct()
    return {tuple(row) for row in connection.execute(query)}


def _record_keys(connection: Connection, run_id: str) -> set[str]:
    query = select(RECORDS.c.content_sha256).where(RECORDS.c.run_id == run_id)
    return set(connection.execute(query).scalars())


class Ingest(StoreConnection):
    """What a store adds: runs and their records."""

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
        Without, either is a SupersedeError (mlcampaign.history.store.superseding). Raises ManifestError,
        RecordError, RunConflictError or SupersedeError, having written nothing."""
        run = RunRow.from_manifest(manifest, manifest_source)
        distinct = distinct_records(records, run)
        # Checks and schema validation happen before the write transaction, so that the write lock
        # is held only for the writing; the store only grows, so records missing now are a
        # superset of those missing then.
        with self._reading() as connection:
            held = self._held(connection, run.run_id, lock=False)
            held_manifest_replaced(run, held)  # another run under its id: refused before any work
            warnings = new_run_problems(connection, self.url, run)
            last_ingest = connection.execute(
                select(func.max(RECORDS.c.ingested_utc)).where(RECORDS.c.run_id == run.run_id)
            ).scalar_one_or_none()
        # The records' ingest order is their trials' attempt order (mlcampaign.history.store: time): it must
        # not go back when this machine's clock is behind the one that ingested the run before.
        now = max(now_utc(), after(last_ingest)) if last_ingest else now_utc()
        present = held.record_keys if held is not None else frozenset()
        rows = [
            record_row(run.run_id, key, record_file, text, now)
            for key, (record_file, text) in distinct.items()
            if key not in present
        ]
        check_sites(manifest, run, [record_file for record_file, _ in distinct.values()])
        with self._writing() as connection:
            created = self._insert_run(connection, run, now)
            # The run's row lock (PostgreSQL; SQLite's writer holds the database's) makes ingests of
            # one run take turns, so what is read next is exact.
            admitted = admit(run, rows, self._held(connection, run.run_id, lock=True), supersede=supersede)
            if admitted.replaced is not None:
                self._replace_manifest(connection, run, admitted.replaced, now)
            if admitted.new_rows:
                connection.execute(sqlalchemy.insert(RECORDS), admitted.new_rows)
        return IngestResult(
            run.run_id,
            created,
            len(admitted.new_rows),
            len(distinct) - len(admitted.new_rows),
            manifest_superseded=admitted.replaced is not None,
            trials_superseded=len(admitted.superseded_trials),
            warnings=tuple(warnings),
        )

    def _held(self, connection: Connection, run_id: str, *, lock: bool) -> HeldRun | None:
        """What the store holds of run ``run_id`` (``lock``: its row, until the transaction ends), or None."""
        query = select(RUNS.c.manifest_json).where(RUNS.c.run_id == run_id)
        text = connection.execute(query.with_for_update() if lock else query).scalar_one_or_none()
        if text is None:
            return None
        return HeldRun(
            place=f"results store {self.url}",
            holder="the store",
            manifest_json=text,
            manifest=lambda: stored_manifest(self.url, run_id, text),
            record_keys=frozenset(_record_keys(connection, run_id)),
            trials=frozenset(_stored_trials(connection, run_id)),
            remedy=SUPERSEDE_REMEDY,
        )

    def _insert_run(self, connection: Connection, run: RunRow, now: str) -> bool:
        """Add the run's row unless the store has it; whether it was added."""
        created = connection.execute(
            self._backend.insert_or_skip(RUNS)
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
            .returning(RUNS.c.run_id)
        ).scalar_one_or_none()
        return created is not None

    def _replace_manifest(self, connection: Connection, run: RunRow, replaced: str, now: str) -> None:
        """The same run, planned again since (a config changed within the run), or an import that supersedes
        it: its newest manifest, the one it replaces kept."""
        connection.execute(
            self._backend.insert_or_skip(SUPERSEDED_MANIFESTS)
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
            sqlalchemy.update(RUNS)
            .where(RUNS.c.run_id == run.run_id)
            .values(manifest_json=run.manifest_json, workflow_commit=run.workflow_commit)
        )

    def check_planned_run(self, run_id: str, campaign: str, site: str, started_utc: str, *, new: bool) -> None:
        """Before any trial of a run trains, what its ingest would refuse (mlcampaign.history.store: time):
        its id stored as another run (RunConflictError naming that run's campaign, site and start), a start in
        the future; and for a ``new`` run, a start before the latest stored run of its campaign at its
        site (ManifestError)."""
        source = f"run '{run_id}' of campaign '{campaign}' at site '{site}' (--config run)"
        identity = {"run_id": run_id, "campaign": campaign, "site": site, "started_utc": started_utc}
        run = RunRow.from_manifest(identity, source)
        with self._reading() as connection:
            stored = connection.execute(
                select(RUNS.c.campaign, RUNS.c.site, RUNS.c.started_utc).where(RUNS.c.run_id == run_id)
            ).one_or_none()
            if stored is not None and tuple(stored) != (run.campaign, run.site, run.started_utc):
                raise RunConflictError(
                    f"{source}: run id '{run_id}' is already in results store {self.url} as a run of campaign "
                    f"'{stored.campaign}' at site '{stored.site}', started {stored.started_utc}; a run id names one "
                    "run: name another (--config run=<id>, or run=new)"
                )
            new_run_problems(connection, self.url, run, refuse_older=new)
