"""Schema version 3: published MLPerf HPC results beside the project's runs (mlcampaign.history.store.published).

- ``published_runs``: one row per (round, submitter, system), with its systems JSON and where it was read;
- ``published_logs``: one row per distinct result log, keyed by the sha256 of its bytes (a log present in
  several rounds is one row), with what was read from it;
- ``published_log_files``: where each log is: (round, submitter, system, scaling, benchmark, file);
- ``published_scores``: mlperf-logging's score of each (round, submitter, system, scaling, benchmark).
"""

from sqlalchemy import Column, ForeignKey, ForeignKeyConstraint, MetaData, PrimaryKeyConstraint, Table, Text
from sqlalchemy.engine import Connection

VERSION = 3
DESCRIPTION = "published_runs, published_logs, published_log_files and published_scores"

_RUN_KEY = ("round", "submitter", "system")
_RESULT_KEY = (*_RUN_KEY, "scaling", "benchmark")


def upgrade(connection: Connection) -> None:
    metadata = MetaData()
    Table(
        "published_runs",
        metadata,
        *(Column(name, Text, nullable=False) for name in _RUN_KEY),
        Column("source", Text, nullable=False),
        Column("description_json", Text, nullable=False),
        Column("ingested_utc", Text, nullable=False),
        PrimaryKeyConstraint(*_RUN_KEY),
    )
    Table(
        "published_logs",
        metadata,
        Column("content_sha256", Text, primary_key=True),
        Column("record_json", Text, nullable=False),
        Column("ingested_utc", Text, nullable=False),
    )
    Table(
        "published_log_files",
        metadata,
        *(Column(name, Text, nullable=False) for name in (*_RESULT_KEY, "file")),
        Column("content_sha256", Text, ForeignKey("published_logs.content_sha256"), nullable=False),
        PrimaryKeyConstraint(*_RESULT_KEY, "file"),
        ForeignKeyConstraint(list(_RUN_KEY), [f"published_runs.{name}" for name in _RUN_KEY]),
    )
    Table(
        "published_scores",
        metadata,
        *(Column(name, Text, nullable=False) for name in _RESULT_KEY),
        Column("score_json", Text, nullable=False),
        PrimaryKeyConstraint(*_RESULT_KEY),
        ForeignKeyConstraint(list(_RUN_KEY), [f"published_runs.{name}" for name in _RUN_KEY]),
    )
    # checkfirst off, as in version 1: tables of these names that are not ours must not be adopted.
    metadata.create_all(connection, checkfirst=False)
