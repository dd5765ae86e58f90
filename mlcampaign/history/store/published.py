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
    run_created: bool  # False: the run was stored already, with the same content (nothing written)
    logs_added: int  # distinct logs the store did not have
    logs_present: int  # distinct logs it had (in this run, or under another round or system)


class PublishedResults(StoreConnection):
    """What a store holds of published rounds: their runs, with scores and logs."""

    def ingest_published(self, run: PublishedRun) -> PublishedIngestResult:
        """Add a published run (its description, the logs the store lacks, where each log is, its scores),
        atomically. A run already stored with the same description and logs writes nothing; with other
        ones it is refused (PublishedRunConflictError naming what differs), having written nothing."""
        identity = dict(zip(PUBLISHED_RUN_KEY, run.key, strict=True))
        description = canonical_json(run.description)
        logs = {log.record["sha256"]: canonical_json(log.record) for log in run.logs}
        now = now_utc()
        with self._writing() as connection:
            created = connection.execute(
                self._backend.insert_or_skip(PUBLISHED_RUNS)
                .values(**identity, source=run.source, description_json=description, ingested_utc=now)
                .on_conflict_do_nothing()
                .returning(PUBLISHED_RUNS.c.round)
            ).scalar_one_or_none()
            if created is None:
                self._refuse_other_published_run(connection, run, description)
                return PublishedIngestResult(*run.key, False, 0, len(logs))
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
        return PublishedIngestResult(*run.key, True, len(new_logs), len(logs) - len(new_logs))

    def _refuse_other_published_run(self, connection: Connection, run: PublishedRun, description: str) -> None:
        where = [PUBLISHED_RUNS.c[name] == value for name, value in zip(PUBLISHED_RUN_KEY, run.key, strict=True)]
        stored = connection.execute(select(PUBLISHED_RUNS.c.description_json).where(*where)).scalar_one()
        file_where = [
            PUBLISHED_LOG_FILES.c[name] == value for name, value in zip(PUBLISHED_RUN_KEY, run.key, strict=True)
        ]
        stored_files = {
            tuple(row)
            for row in connection.execute(
                select(
                    *(PUBLISHED_LOG_FILES.c[name] for name in ("scaling", "benchmark", "file", "content_sha256"))
                ).where(*file_where)
            )
        }
        differences = []
        if stored != description:
            differences += json_differences(json.loads(stored), run.description, "systems description: ")
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
