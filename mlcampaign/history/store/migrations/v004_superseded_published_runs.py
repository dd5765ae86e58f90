"""Schema version 4: the superseded_published_runs table, where a published run's stored content goes when an
import with ``--supersede`` replaces it (a round re-imported with another score, e.g. a scaling.json added), so
that the store keeps what it held of the run, as it keeps every manifest of its own runs (version 2).
"""

from sqlalchemy import Column, ForeignKeyConstraint, Index, MetaData, PrimaryKeyConstraint, Table, Text
from sqlalchemy.engine import Connection

VERSION = 4
DESCRIPTION = "superseded_published_runs: every content a published run had before its current one"

_RUN_KEY = ("round", "submitter", "system")


def upgrade(connection: Connection) -> None:
    metadata = MetaData()
    # The published_runs table as version 3 made it, for the foreign key (only its key is needed).
    Table("published_runs", metadata, *(Column(name, Text) for name in _RUN_KEY), PrimaryKeyConstraint(*_RUN_KEY))
    superseded = Table(
        "superseded_published_runs",
        metadata,
        *(Column(name, Text, nullable=False) for name in _RUN_KEY),
        Column("content_sha256", Text, nullable=False),
        # The run as it was: {"source", "description", "files": [[scaling, benchmark, file, sha256]], "scores"}.
        Column("content_json", Text, nullable=False),
        Column("superseded_utc", Text, nullable=False),
        PrimaryKeyConstraint(*_RUN_KEY, "content_sha256"),
        ForeignKeyConstraint(list(_RUN_KEY), [f"published_runs.{name}" for name in _RUN_KEY]),
    )
    Index("superseded_published_runs_by_run", *(superseded.c[name] for name in _RUN_KEY), superseded.c.superseded_utc)
    metadata.create_all(connection, tables=[superseded], checkfirst=False)
