"""A kind of results store (SQLite, PostgreSQL): the one interface the store (mlcampaign.history.store) uses
for what differs between database systems. Each kind is one module of ``backends/`` that defines
``BACKEND = <Backend subclass>()``; the store finds them there, so a new kind of store is one module.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from sqlalchemy import Table
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.sql.dml import Insert


class Backend:
    """What one kind of store does its own way; the store's SQL is otherwise the same on every kind."""

    # URL schemes (SQLAlchemy driver names) of this kind, and the URL form its errors show.
    drivernames: tuple[str, ...] = ()
    url_form: str = ""

    def check_url(self, url: URL, text: str) -> None:
        """Raise StoreURLError for a URL of this kind that names no store (``text``: the URL as given)."""

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


BACKENDS_PACKAGE = f"{__package__}.backends"


@functools.cache
def backend_kinds() -> dict[str, Backend]:
    """Every kind of store, by URL scheme."""
    package = importlib.import_module(BACKENDS_PACKAGE)
    kinds = {}
    for entry in pkgutil.iter_modules(package.__path__):
        backend = importlib.import_module(f"{BACKENDS_PACKAGE}.{entry.name}").BACKEND
        kinds |= dict.fromkeys(backend.drivernames, backend)
    return kinds


def url_forms() -> str:
    """The URL forms of every kind of store, for error messages."""
    return " or ".join(dict.fromkeys(backend.url_form for backend in backend_kinds().values()))
