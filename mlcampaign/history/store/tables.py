"""The store's tables as its queries use them, for the newest schema version (their definitions, with
types and keys, are in the migrations), and the form of every time they hold (``utc_text``).
"""

from __future__ import annotations

import datetime

from sqlalchemy import column, table

SCHEMA_VERSIONS = table("schema_version", column("version"), column("applied_utc"), column("description"))
RUNS = table(
    "runs",
    column("run_id"),
    column("campaign"),
    column("site"),
    column("started_utc"),
    column("workflow_commit"),
    column("manifest_json"),
    column("ingested_utc"),
)
SUPERSEDED_MANIFESTS = table(
    "superseded_manifests",
    column("run_id"),
    column("manifest_sha256"),
    column("manifest_json"),
    column("superseded_utc"),
    column("superseded_by"),
)
RECORDS = table(
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
# A record's trial: the records-table columns that name it.
TRIAL_KEY = ("system", "benchmark", "cell", "trial", "replicate")

# Published MLPerf HPC results (mlcampaign.history.store.published): a run, and a result of it.
PUBLISHED_RUN_KEY = ("round", "submitter", "system")
PUBLISHED_RESULT_KEY = (*PUBLISHED_RUN_KEY, "scaling", "benchmark")
PUBLISHED_RUNS = table(
    "published_runs", *(column(name) for name in (*PUBLISHED_RUN_KEY, "source", "description_json", "ingested_utc"))
)
PUBLISHED_LOGS = table("published_logs", column("content_sha256"), column("record_json"), column("ingested_utc"))
PUBLISHED_LOG_FILES = table(
    "published_log_files", *(column(name) for name in (*PUBLISHED_RESULT_KEY, "file", "content_sha256"))
)
PUBLISHED_SCORES = table("published_scores", *(column(name) for name in (*PUBLISHED_RESULT_KEY, "score_json")))
SUPERSEDED_PUBLISHED_RUNS = table(
    "superseded_published_runs",
    *(column(name) for name in (*PUBLISHED_RUN_KEY, "content_sha256", "content_json", "superseded_utc")),
)


def utc_text(value: str) -> str:
    """An ISO 8601 time with a UTC offset as fixed-width UTC text, whose text order is time order.

    Raises ValueError for text that is not such a time (a time without offset is ambiguous)."""
    instant = datetime.datetime.fromisoformat(value)
    if instant.tzinfo is None:
        raise ValueError(f"time {value!r} has no UTC offset")
    return instant.astimezone(datetime.UTC).isoformat(timespec="microseconds")


def now_utc() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


def after(text: str) -> str:
    """The utc_text one microsecond after ``text``."""
    instant = datetime.datetime.fromisoformat(text) + datetime.timedelta(microseconds=1)
    return instant.isoformat(timespec="microseconds")
