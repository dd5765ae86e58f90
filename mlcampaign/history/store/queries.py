"""Queries of the results store: its runs, a run's manifest (and those it superseded), runs' records in
attempt order (mlcampaign.history.store). Every row read is checked (DamagedStoreError).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from sqlalchemy import case, func, select

from mlcampaign.history.store.checks import RUN_IDENTITY, stored_manifest, stored_record
from mlcampaign.history.store.connection import StoreConnection
from mlcampaign.history.store.errors import UnknownRunError
from mlcampaign.history.store.tables import RECORDS, RUNS, SUPERSEDED_MANIFESTS, TRIAL_KEY
from mlcampaign.records.files import SUPERSEDED_DIR


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


class Queries(StoreConnection):
    """What a store tells of its runs."""

    def list_runs(self, *, campaign: str | None = None, site: str | None = None) -> list[RunSummary]:
        """The stored runs (of a campaign, at a site when given), oldest start first."""
        run_columns = [RUNS.c[name] for name in ("run_id", "campaign", "site", "started_utc", "workflow_commit")]
        query = (
            select(
                *run_columns,
                func.count(RECORDS.c.content_sha256),
                RUNS.c.ingested_utc,
                func.coalesce(func.max(RECORDS.c.ingested_utc), RUNS.c.ingested_utc),
            )
            .select_from(RUNS.outerjoin(RECORDS, RECORDS.c.run_id == RUNS.c.run_id))
            .group_by(*run_columns, RUNS.c.ingested_utc)
            .order_by(RUNS.c.started_utc, RUNS.c.run_id)
        )
        if campaign is not None:
            query = query.where(RUNS.c.campaign == campaign)
        if site is not None:
            query = query.where(RUNS.c.site == site)
        with self._reading() as connection:
            return [RunSummary(*row) for row in connection.execute(query)]

    def latest_runs(self, campaign: str) -> dict[str, RunSummary]:
        """The latest run (by start time) of ``campaign`` at every site that has one."""
        return {run.site: run for run in self.list_runs(campaign=campaign)}  # oldest first: the last wins

    def manifest(self, run_id: str) -> dict:
        """The manifest (run.json) of a stored run, as ingested."""
        with self._reading() as connection:
            stored = connection.execute(
                select(RUNS.c.manifest_json, *(RUNS.c[key] for key in RUN_IDENTITY)).where(RUNS.c.run_id == run_id)
            ).one_or_none()
        if stored is None:
            raise UnknownRunError(f"results store {self.url} has no run '{run_id}'")
        text, *identity = stored
        return stored_manifest(self.url, run_id, text, dict(zip(RUN_IDENTITY, identity, strict=True)))

    def superseded_manifests(self, run_id: str) -> list[SupersededManifest]:
        """The manifests a stored run had before its current one, oldest first."""
        query = (
            select(*(SUPERSEDED_MANIFESTS.c[name] for name in ("manifest_json", "superseded_utc", "superseded_by")))
            .where(SUPERSEDED_MANIFESTS.c.run_id == run_id)
            .order_by(SUPERSEDED_MANIFESTS.c.superseded_utc, SUPERSEDED_MANIFESTS.c.manifest_sha256)
        )
        self.manifest(run_id)  # UnknownRunError for a run the store does not have
        with self._reading() as connection:
            rows = connection.execute(query).all()
        return [SupersededManifest(stored_manifest(self.url, run_id, text), when, by) for text, when, by in rows]

    def records(self, run_ids: Iterable[str]) -> dict[str, list[dict]]:
        """The records of each run, as ingested, by trial key and then attempt (mlcampaign.history.store:
        a trial's current record, its run folder's record.json, comes last)."""
        run_ids = list(dict.fromkeys(run_ids))
        records: dict[str, list[dict]] = {run_id: [] for run_id in run_ids}
        with self._reading() as connection:
            stored = set(connection.execute(select(RUNS.c.run_id).where(RUNS.c.run_id.in_(run_ids))).scalars())
            missing = [run_id for run_id in run_ids if run_id not in stored]
            if missing:
                raise UnknownRunError(f"results store {self.url} has no run {', '.join(map(repr, missing))}")
            query = (
                select(RECORDS.c.run_id, RECORDS.c.content_sha256, RECORDS.c.record_json)
                .where(RECORDS.c.run_id.in_(run_ids))
                .order_by(
                    RECORDS.c.run_id,
                    *(RECORDS.c[name] for name in TRIAL_KEY),
                    # Records first seen as earlier attempts (superseded/), then those first seen as the
                    # folder's record.json, each by ingest: the last is the latest record.json.
                    case((RECORDS.c.source_path.like(f"%/{SUPERSEDED_DIR}/%"), 0), else_=1),
                    RECORDS.c.ingested_utc,
                    RECORDS.c.content_sha256,
                )
            )
            for run_id, key, text in connection.execute(query):
                records[run_id].append(stored_record(self.url, run_id, key, text))
        return records
