"""Schema version 1: the schema_version table, one row per run (its manifest) and one row per
distinct record of a run (keyed by its content).

Column types are the ones both SQLite and PostgreSQL have (TEXT, INTEGER); JSON documents are kept
as their canonical text, so that a record reads back exactly as it was ingested and its key
(sha256 of that text) can be recomputed from what is stored. Times are ISO 8601 UTC text of one
fixed width (``2026-12-01T08:10:00.000000+00:00``), so that text order is time order.
"""

from sqlalchemy import Column, ForeignKey, Index, Integer, MetaData, PrimaryKeyConstraint, Table, Text
from sqlalchemy.engine import Connection

VERSION = 1
DESCRIPTION = "schema_version, runs and records"


def upgrade(connection: Connection) -> None:
    metadata = MetaData()
    Table(
        "schema_version",
        metadata,
        # autoincrement off: PostgreSQL would otherwise make an integer primary key a serial.
        Column("version", Integer, primary_key=True, autoincrement=False),
        Column("applied_utc", Text, nullable=False),
        Column("description", Text, nullable=False),
    )
    runs = Table(
        "runs",
        metadata,
        Column("run_id", Text, primary_key=True),
        Column("campaign", Text, nullable=False),
        Column("site", Text, nullable=False),
        Column("started_utc", Text, nullable=False),
        Column("workflow_commit", Text),
        Column("manifest_json", Text, nullable=False),
        Column("ingested_utc", Text, nullable=False),
    )
    Index("runs_by_campaign_site", runs.c.campaign, runs.c.site, runs.c.started_utc)
    records = Table(
        "records",
        metadata,
        Column("run_id", Text, ForeignKey("runs.run_id"), nullable=False),
        Column("content_sha256", Text, nullable=False),
        Column("system", Text, nullable=False),
        Column("benchmark", Text, nullable=False),
        Column("cell", Text, nullable=False),
        Column("trial", Integer, nullable=False),
        Column("replicate", Integer, nullable=False),
        Column("status", Text, nullable=False),
        Column("finished_utc", Text, nullable=False),
        Column("source_path", Text, nullable=False),
        Column("ingested_utc", Text, nullable=False),
        Column("record_json", Text, nullable=False),
        PrimaryKeyConstraint("run_id", "content_sha256"),
    )
    Index(
        "records_by_trial",
        records.c.run_id,
        records.c.system,
        records.c.benchmark,
        records.c.cell,
        records.c.trial,
        records.c.replicate,
    )
    # checkfirst off: a database that already has tables of these names is not a results store,
    # and creating ours must fail rather than adopt theirs.
    metadata.create_all(connection, checkfirst=False)
