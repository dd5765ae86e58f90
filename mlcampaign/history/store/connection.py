"""An open results store: its backend and engine, transactions that report database errors as StoreErrors,
and its schema brought to the newest version when it is opened (mlcampaign.history.store.migrations).
The store's ingest, queries and published results (``ResultsStore``) are built on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Self

import sqlalchemy
from sqlalchemy import func, inspect, select
from sqlalchemy.engine import Connection, Engine

from mlcampaign.history.store import migrations
from mlcampaign.history.store.backend import Backend
from mlcampaign.history.store.errors import SchemaVersionError, StoreError, StoreUnavailableError
from mlcampaign.history.store.tables import SCHEMA_VERSIONS, now_utc


def _schema_version(connection: Connection) -> int:
    """The store's schema version: the newest migration applied, 0 for a database without the schema."""
    if not inspect(connection).has_table("schema_version"):
        return 0
    return connection.execute(select(func.max(SCHEMA_VERSIONS.c.version))).scalar_one() or 0


class StoreConnection:
    """A store's engine, as readers and writers use it; close it when done."""

    def __init__(self, url: str, backend: Backend, engine: Engine) -> None:
        self.url = url
        self._backend = backend
        self._engine = engine
        self._reader = backend.reader(engine)
        self._writer = backend.writer(engine)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._engine.dispose()

    @contextlib.contextmanager
    def _database_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlalchemy.exc.OperationalError as error:
            raise StoreUnavailableError(f"results store {self.url}: {error.orig}") from error
        except sqlalchemy.exc.DBAPIError as error:
            raise StoreError(f"results store {self.url}: {error.orig}") from error

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Connection]:
        with self._database_errors(), self._reader.begin() as connection:
            yield connection

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Connection]:
        with self._database_errors(), self._writer.begin() as connection:
            yield connection

    # Schema versions.

    @property
    def schema_version(self) -> int:
        with self._reading() as connection:
            return _schema_version(connection)

    def _refuse_newer(self, version: int) -> None:
        known = migrations.MIGRATIONS[-1].VERSION
        if version > known:
            raise SchemaVersionError(
                f"results store {self.url} has schema version {version}, newer than the {known} this "
                "mlcampaign knows: use a newer mlcampaign with it (the store was left untouched)"
            )

    def _migrate(self, create: bool) -> None:
        with self._reading() as connection:
            version = _schema_version(connection)
        self._refuse_newer(version)
        if version == migrations.MIGRATIONS[-1].VERSION:
            return
        if version == 0 and not create:
            raise StoreUnavailableError(f"results store {self.url}: no store there (the database has no schema)")
        read_only = self._backend.read_only(self._engine)
        if read_only is not None:
            raise StoreUnavailableError(
                f"results store {self.url} has schema version {version}, older than the "
                f"{migrations.MIGRATIONS[-1].VERSION} this mlcampaign reads, and this user can only read it "
                f"({read_only}): upgrade it once where it can be written (any ingest or import does)"
            )
        with self._database_errors():
            self._backend.prepare_new(self._engine)
        with self._writing() as connection:
            self._backend.lock_migrations(connection)
            version = _schema_version(connection)  # another process may have migrated meanwhile
            self._refuse_newer(version)
            for migration in migrations.MIGRATIONS[version:]:
                migration.upgrade(connection)
                connection.execute(
                    sqlalchemy.insert(SCHEMA_VERSIONS).values(
                        version=migration.VERSION, applied_utc=now_utc(), description=migration.DESCRIPTION
                    )
                )
