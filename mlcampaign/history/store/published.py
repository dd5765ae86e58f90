"""Published MLPerf HPC results in the results store: what one published run is (``PublishedRun``), the
tables that keep it (schema version 3, mlcampaign.history.store.migrations.v003_published_results), and the
store's ``ingest_published`` and ``published_results``.

A published run is one (round, submitter, system) of a results round: its systems description and its
result logs, each by (scaling, benchmark, file) in the round's layout, and the scores mlperf-logging
gives each (scaling, benchmark) folder. A log is kept once by its content (sha256 of its bytes): a log
present byte for byte in several rounds, or under several systems, is one record with several places.
Published runs are not trial records of this project and never pass through the record schema.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import sqlalchemy
from sqlalchemy import select
from sqlalchemy.engine import Connection

from mlcampaign.history.store.checks import json_differences
from mlcampaign.history.store.connection import StoreConnection
from mlcampaign.history.store.errors import PublishedRunConflictError
from mlcampaign.history.store.tables import (
    PUBLISHED_LOG_FILES,
    PUBLISHED_LOGS,
    PUBLISHED_RESULT_KEY,
    PUBLISHED_RUN_KEY,
    PUBLISHED_RUNS,
    PUBLISHED_SCORES,
    SUPERSEDED_PUBLISHED_RUNS,
    now_utc,
)
from mlcampaign.records.files import canonical_json


@dataclasses.dataclass(frozen=True)
class PublishedLog:
    """One result log of a published run: where it is in the run (scaling, benchmark folder, file name)
    and what was read from it (mlcampaign.records.mlperf.result_logs.log_record; ``record["sha256"]`` is its key)."""

    scaling: str
    benchmark: str
    file: str
    record: dict


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """One (round, submitter, system) of a results round: its systems JSON (``description``), where it
    was read from (``source``), its logs and one score per (scaling, benchmark) folder."""

    round: str
    submitter: str
    system: str
    source: str
    description: dict
    logs: list[PublishedLog]
    scores: list[dict]  # each with "scaling" and "benchmark"

    @property
    def key(self) -> tuple[str, str, str]:
        return self.round, self.submitter, self.system

    def files(self) -> set[tuple[str, str, str, str]]:
        """(scaling, benchmark, file, sha256) of every log: what the run is made of."""
        return {(log.scaling, log.benchmark, log.file, log.record["sha256"]) for log in self.logs}


@dataclasses.dataclass(frozen=True)
class PublishedIngestResult:
    round: str
    submitter: str
    system: str
    run_created: bool  # False: the run was stored already (with the same content, or superseded)
    logs_added: int  # distinct logs the store did not have
    logs_present: int  # distinct logs it had (in this run, or under another round or system)
    superseded: bool = False  # the stored content of the run was replaced (kept in superseded_published_runs)


class PublishedResults(StoreConnection):
    """What a store holds of published rounds: their runs, with scores and logs."""

    def ingest_published(self, run: PublishedRun, *, supersede: bool = False) -> PublishedIngestResult:
        """Add a published run (its description, the logs the store lacks, where each log is, its scores),
        atomically. A run already stored with the same description, logs and scores writes nothing; with other
        ones it is refused (PublishedRunConflictError naming what differs, stored and given), having written
        nothing, unless ``supersede``: then the stored content is kept in superseded_published_runs and the
        run's replaced by the given one."""
        identity = dict(zip(PUBLISHED_RUN_KEY, run.key, strict=True))
        description = canonical_json(run.description)
        logs = {log.record["sha256"]: canonical_json(log.record) for log in run.logs}
        now = now_utc()
        superseded = False
        with self._writing() as connection:
            created = connection.execute(
                self._backend.insert_or_skip(PUBLISHED_RUNS)
                .values(**identity, source=run.source, description_json=description, ingested_utc=now)
                .on_conflict_do_nothing()
                .returning(PUBLISHED_RUNS.c.round)
            ).scalar_one_or_none()
            if created is None:
                stored = self._stored_published_run(connection, run.key)
                differences = _published_differences(stored, run)
                if not differences:
                    return PublishedIngestResult(*run.key, False, 0, len(logs))
                if not supersede:
                    raise PublishedRunConflictError(
                        f"{run.source}: published run {'/'.join(run.key)} is already in results store {self.url} "
                        f"with other content: {'; '.join(differences)}. Import it with --supersede to replace it "
                        "(what the store holds of it is kept as superseded), or under another round name if it is "
                        "another round"
                    )
                self._supersede_published_run(connection, identity, stored, run, description, now)
                superseded = True
            present = set(
                connection.execute(
                    select(PUBLISHED_LOGS.c.content_sha256).where(PUBLISHED_LOGS.c.content_sha256.in_(list(logs)))
                ).scalars()
            )
            new_logs = [
                {"content_sha256": key, "record_json": text, "ingested_utc": now}
                for key, text in logs.items()
                if key not in present
            ]
            if new_logs:
                # Another import may store the same log meanwhile (a log shared by two rounds): skipped then.
                connection.execute(self._backend.insert_or_skip(PUBLISHED_LOGS).on_conflict_do_nothing(), new_logs)
            files = [
                identity | {"scaling": scaling, "benchmark": benchmark, "file": file, "content_sha256": key}
                for scaling, benchmark, file, key in sorted(run.files())
            ]
            if files:
                connection.execute(sqlalchemy.insert(PUBLISHED_LOG_FILES), files)
            scores = [
                identity
                | {"scaling": score["scaling"], "benchmark": score["benchmark"], "score_json": canonical_json(score)}
                for score in run.scores
            ]
            if scores:
                connection.execute(sqlalchemy.insert(PUBLISHED_SCORES), scores)
        return PublishedIngestResult(*run.key, not superseded, len(new_logs), len(logs) - len(new_logs), superseded)

    def _stored_published_run(self, connection: Connection, key: tuple) -> dict:
        """What the store holds of the published run ``key``: source, description, files, scores."""
        where = {
            table: [table.c[name] == value for name, value in zip(PUBLISHED_RUN_KEY, key, strict=True)]
            for table in (PUBLISHED_RUNS, PUBLISHED_LOG_FILES, PUBLISHED_SCORES)
        }
        source, description = connection.execute(
            select(PUBLISHED_RUNS.c.source, PUBLISHED_RUNS.c.description_json).where(*where[PUBLISHED_RUNS])
        ).one()
        columns = [PUBLISHED_LOG_FILES.c[name] for name in ("scaling", "benchmark", "file", "content_sha256")]
        files = sorted(tuple(row) for row in connection.execute(select(*columns).where(*where[PUBLISHED_LOG_FILES])))
        scores = [
            json.loads(text)
            for (text,) in connection.execute(
                select(PUBLISHED_SCORES.c.score_json)
                .where(*where[PUBLISHED_SCORES])
                .order_by(PUBLISHED_SCORES.c.scaling, PUBLISHED_SCORES.c.benchmark)
            )
        ]
        return {"source": source, "description": json.loads(description), "files": files, "scores": scores}

    def _supersede_published_run(
        self, connection: Connection, identity: dict, stored: dict, run: PublishedRun, description: str, now: str
    ) -> None:
        """Keep the stored content of a published run in superseded_published_runs, then clear its files and
        scores and give it the new source and description (its logs are added again by the caller)."""
        content = canonical_json(stored)
        connection.execute(
            self._backend.insert_or_skip(SUPERSEDED_PUBLISHED_RUNS)
            .values(
                **identity,
                content_sha256=hashlib.sha256(content.encode()).hexdigest(),
                content_json=content,
                superseded_utc=now,
            )
            .on_conflict_do_nothing()
        )
        for table in (PUBLISHED_LOG_FILES, PUBLISHED_SCORES):
            connection.execute(
                sqlalchemy.delete(table).where(*(table.c[name] == value for name, value in identity.items()))
            )
        connection.execute(
            sqlalchemy.update(PUBLISHED_RUNS)
            .where(*(PUBLISHED_RUNS.c[name] == value for name, value in identity.items()))
            .values(source=run.source, description_json=description, ingested_utc=now)
        )

    def published_log_records(self, keys: set[str]) -> dict[str, dict]:
        """The stored record of each of the logs ``keys`` (sha256 of their bytes) that the store holds."""
        if not keys:
            return {}
        with self._reading() as connection:
            rows = connection.execute(
                select(PUBLISHED_LOGS.c.content_sha256, PUBLISHED_LOGS.c.record_json).where(
                    PUBLISHED_LOGS.c.content_sha256.in_(sorted(keys))
                )
            )
            return {key: json.loads(text) for key, text in rows}

    def superseded_published_runs(self) -> list[dict]:
        """Every content a published run had before an import with supersede replaced it, oldest first: its key,
        ``superseded_utc`` and the content (source, description, files, scores)."""
        table = SUPERSEDED_PUBLISHED_RUNS
        with self._reading() as connection:
            rows = connection.execute(
                select(
                    *(table.c[name] for name in PUBLISHED_RUN_KEY), table.c.superseded_utc, table.c.content_json
                ).order_by(table.c.superseded_utc)
            )
            return [
                dict(zip(PUBLISHED_RUN_KEY, row[:3], strict=True)) | {"superseded_utc": row[3]} | json.loads(row[4])
                for row in rows
            ]

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
                        *(PUBLISHED_RUNS.c[name] for name in (*PUBLISHED_RUN_KEY, "source", "description_json"))
                    ).order_by(*(PUBLISHED_RUNS.c[name] for name in PUBLISHED_RUN_KEY))
                )
            }
            score_rows = connection.execute(
                select(
                    *(PUBLISHED_SCORES.c[name] for name in PUBLISHED_RUN_KEY), PUBLISHED_SCORES.c.score_json
                ).order_by(*(PUBLISHED_SCORES.c[name] for name in PUBLISHED_RESULT_KEY))
            )
            for *key, text in score_rows:
                runs[tuple(key)]["scores"].append(json.loads(text))
            files = PUBLISHED_LOG_FILES
            log_rows = connection.execute(
                select(*(files.c[name] for name in (*PUBLISHED_RESULT_KEY, "file")), PUBLISHED_LOGS.c.record_json)
                .select_from(files.join(PUBLISHED_LOGS, PUBLISHED_LOGS.c.content_sha256 == files.c.content_sha256))
                .order_by(*(files.c[name] for name in (*PUBLISHED_RESULT_KEY, "file")))
            )
            records: dict[str, dict] = {}  # a log stored once is read once
            for *key, scaling, benchmark, file, text in log_rows:
                record = records.setdefault(text, json.loads(text))
                runs[tuple(key)]["logs"].append(
                    {"scaling": scaling, "benchmark": benchmark, "file": file, "record": record}
                )
        return list(runs.values())


def _published_differences(stored: dict, run: PublishedRun) -> list[str]:
    """What differs between a stored published run (``_stored_published_run``) and ``run``: its systems
    description, its logs (file by file) and its scores (figure by figure, stored and given)."""
    differences = json_differences(stored["description"], run.description, "systems description: ")
    stored_files, given = set(stored["files"]), run.files()
    for scaling, benchmark, file, key in sorted(stored_files ^ given):
        state = "only in the store" if (scaling, benchmark, file, key) in stored_files else "not in the store"
        differences.append(f"{scaling}/{benchmark}/{file} (sha256 {key[:12]}…, {state})")
    stored_scores = {(score["scaling"], score["benchmark"]): score for score in stored["scores"]}
    given_scores = {(score["scaling"], score["benchmark"]): score for score in run.scores}
    for key in sorted(stored_scores.keys() | given_scores.keys()):
        prefix = f"{'/'.join(key)} score: "
        if key not in given_scores or key not in stored_scores:
            differences.append(f"{prefix}{'only in the store' if key in stored_scores else 'not in the store'}")
        else:
            differences += json_differences(stored_scores[key], given_scores[key], prefix)
    return differences
