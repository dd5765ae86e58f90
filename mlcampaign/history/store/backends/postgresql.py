"""A PostgreSQL server (``postgresql://user@host:port/dbname``; driver: psycopg 3), for a centre's shared store.

A URL never holds a password: libpq takes it from the environment (PGPASSWORD, PGPASSFILE / ~/.pgpass;
PGUSER, PGHOST, ... fill in what the URL leaves out). Readers see one snapshot across their queries
(REPEATABLE READ); writers stay READ COMMITTED, so that after waiting for a run's row lock they see the
records the other ingest committed.
"""

from __future__ import annotations

import os

import sqlalchemy
from sqlalchemy import Table, func, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Connection, Engine

from mlcampaign.history.store.backend import Backend

# A server that does not answer within this many seconds is reported unreachable (PGCONNECT_TIMEOUT,
# when set, wins: it is libpq's own setting).
CONNECT_TIMEOUT_S = 5
# Serialises migrations of one database across processes (any constant; "mlcamp" in ASCII).
MIGRATION_LOCK_KEY = 0x6D6C63616D70


def _engine(url: URL) -> Engine:
    connect_args = {} if "PGCONNECT_TIMEOUT" in os.environ else {"connect_timeout": CONNECT_TIMEOUT_S}
    return sqlalchemy.create_engine(url.set(drivername="postgresql+psycopg"), connect_args=connect_args)


class PostgreSQLBackend(Backend):
    drivernames = ("postgresql", "postgresql+psycopg")
    url_form = "postgresql://user@host:port/dbname"

    def engine(self, url: URL, text: str, create: bool) -> Engine:
        return _engine(url)

    def reader(self, engine: Engine) -> Engine:
        return engine.execution_options(isolation_level="REPEATABLE READ")

    def lock_migrations(self, connection: Connection) -> None:
        connection.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))

    def insert_or_skip(self, table: Table):
        return postgresql.insert(table)


BACKEND = PostgreSQLBackend()
