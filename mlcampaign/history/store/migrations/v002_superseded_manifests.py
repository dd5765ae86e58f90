"""Schema version 2: the superseded_manifests table, where a run's manifest goes when a newer one replaces
it (the run planned again with a changed config, or an import with ``--supersede``), so that the store
keeps every manifest a run had, as it keeps every record.
"""

from sqlalchemy import Column, ForeignKey, Index, MetaData, PrimaryKeyConstraint, Table, Text
from sqlalchemy.engine import Connection

VERSION = 2
DESCRIPTION = "superseded_manifests: every manifest a run had before its current one"


def upgrade(connection: Connection) -> None:
    metadata = MetaData()
    # The runs table as version 1 made it, for the foreign key (only its key is needed).
    Table("runs", metadata, Column("run_id", Text, primary_key=True))
    superseded = Table(
        "superseded_manifests",
        metadata,
        Column("run_id", Text, ForeignKey("runs.run_id"), nullable=False),
        Column("manifest_sha256", Text, nullable=False),
        Column("manifest_json", Text, nullable=False),
        Column("superseded_utc", Text, nullable=False),
        Column("superseded_by", Text, nullable=False),
        PrimaryKeyConstraint("run_id", "manifest_sha256"),
    )
    Index("superseded_manifests_by_run", superseded.c.run_id, superseded.c.superseded_utc)
    metadata.create_all(connection, tables=[superseded], checkfirst=False)
