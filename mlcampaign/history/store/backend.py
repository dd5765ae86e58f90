"""A kind of results store (SQLite, PostgreSQL): the one interface the store (mlcampaign.history.store) uses
for what differs between database systems. Each kind is one module of ``backends/`` that defines
``BACKEND = <Backend subclass>()``; store URLs find them there by scheme (mlcampaign.plan.urls.store_backends),
so a new kind of store is one module.
"""

from __future__ import annotations

from sqlalchemy import Table
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.sql.dml import Insert


class Backend:
    """What one kind of store does its own way; the store's SQL is otherwise the same on every kind."""

    # URL schemes (SQLAlchemy driver names) of this kind, and the URL form its errors show.
    drivernames: tuple[str, ...] = ()
    url_form: str = ""

    def check_url(self, url: URL, text: str) -> None:
        """Raise mlcampaign.plan.urls.URLError for a URL of this kind that names no store (``text``: the URL as
        given)."""

    def engine(self, url: URL, text: str, create: bool) -> Engine:
        """The engine of the store at ``url``; StoreUnavailableError where there is none to open (a store
        that does not exist yet is one only with ``create``)."""
        raise NotImplementedError

    def read_only(self, engine: Engine) -> str | None:
        """How a reader's engine reads a store it cannot write (e.g. "immutable=1"); None where it can write."""
        return None

    def reader(self, engine: Engine) -> Engine:
        """The engine as readers use it: every query of a read sees one snapshot."""
        return engine

    def writer(self, engine: Engine) -> Engine:
        """The engine as writers use it: a write transaction waits for another writer's."""
        return engine

    def prepare_new(self, engine: Engine) -> None:
        """Settings of a store made before its schema is created (outside any transaction)."""

    def lock_migrations(self, connection: Connection) -> None:
        """Make concurrent migrations of one store take turns, inside the migration's transaction."""

    def insert_or_skip(self, table: Table) -> Insert:
        """An INSERT of ``table`` that ``on_conflict_do_nothing()`` can follow."""
        raise NotImplementedError
