"""Published MLPerf HPC results in the results store: what one published run is (``PublishedRun``), the
tables that keep it (schema version 3, mlcampaign.history.store.migrations.v003_published_results) and
what the store's ``ingest_published`` and ``published_results`` return.

A published run is one (round, submitter, system) of a results round: its systems description and its
result logs, each by (scaling, benchmark, file) in the round's layout, and the scores mlperf-logging
gives each (scaling, benchmark) folder. A log is kept once by its content (sha256 of its bytes): a log
present byte for byte in several rounds, or under several systems, is one record with several places.
Published runs are not trial records of this project and never pass through the record schema.
"""

from __future__ import annotations

import dataclasses

from sqlalchemy import column, table

PUBLISHED_RUN_KEY = ("round", "submitter", "system")
PUBLISHED_RESULT_KEY = (*PUBLISHED_RUN_KEY, "scaling", "benchmark")

_PUBLISHED_RUNS = table(
    "published_runs", *(column(name) for name in (*PUBLISHED_RUN_KEY, "source", "description_json", "ingested_utc"))
)
_PUBLISHED_LOGS = table("published_logs", column("content_sha256"), column("record_json"), column("ingested_utc"))
_PUBLISHED_LOG_FILES = table(
    "published_log_files", *(column(name) for name in (*PUBLISHED_RESULT_KEY, "file", "content_sha256"))
)
_PUBLISHED_SCORES = table("published_scores", *(column(name) for name in (*PUBLISHED_RESULT_KEY, "score_json")))


@dataclasses.dataclass(frozen=True)
class PublishedLog:
    """One result log of a published run: where it is in the run (scaling, benchmark folder, file name)
    and what was read from it (mlcampaign.records.mlperf_results.log_record; ``record["sha256"]`` is its key)."""

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
