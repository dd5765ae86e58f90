"""The embedded store: one SQLite file (``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``).

Write-ahead logging lets readers work while a writer ingests; a writer takes the write lock when its
transaction begins (BEGIN IMMEDIATE) and waits up to SQLITE_LOCK_WAIT_S for another's, so concurrent
ingests take turns rather than fail.

A reader that cannot open the store as usual (the write-ahead log's shared-memory file cannot be created:
a store in a folder this user cannot write, a read-only mount) opens it read-only, and failing that
immutable: SQLite then reads the database file alone, assuming nobody writes it meanwhile, and does not see
what a writer has committed to the log but not yet copied into the file (READ_ONLY_MODES).
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path

import sqlalchemy
from sqlalchemy import Table, event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL, Connection, Engine

from mlcampaign.history.store.backend import Backend
from mlcampaign.history.store.errors import StoreUnavailableError
from mlcampaign.plan.urls import URLError

# How long an SQLite ingest waits for another process's ingest to commit before giving up.
SQLITE_LOCK_WAIT_S = 60
SQLITE_PAGE_BYTES = 16384
# How a reader opens a store it cannot open as usual, in order (SQLite URI parameters).
READ_ONLY_MODES = ("mode=ro", "immutable=1")
# Execution option that makes a transaction take the write lock at BEGIN (see _engine).
_WRITE_OPTION = "mlcampaign_sqlite_write"
# Execution option that holds the read-only mode a reader's engine opens the store in.
_READ_ONLY_OPTION = "mlcampaign_sqlite_read_only"


def _uri(path: Path, mode: str) -> str:
    return f"file:{urllib.parse.quote(str(path.absolute()))}?{mode}"


def _opens(path: Path, mode: str | None) -> bool:
    """Whether the store's schema can be read when it is opened as usual (None) or in ``mode``."""
    try:
        connection = sqlite3.connect(_uri(path, mode) if mode else path, uri=mode is not None)
    except sqlite3.Error:
        return False
    try:
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return True
    except sqlite3.Error:
        return False
    finally:
        connection.close()


def _engine(url: URL, read_only: str | None = None) -> Engine:
    if read_only is None:
        engine = sqlalchemy.create_engine(url, connect_args={"timeout": SQLITE_LOCK_WAIT_S})
    else:
        uri = _uri(Path(url.database), read_only)
        engine = sqlalchemy.create_engine(
            url,
            creator=lambda: sqlite3.connect(uri, uri=True, timeout=SQLITE_LOCK_WAIT_S, check_same_thread=False),
        )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _connection_record) -> None:
        # The sqlite3 module's own transactions start only before a write, so a transaction that
        # reads first (as ingest does) could not be made to take the write lock up front; with
        # them off, _on_begin below issues BEGIN itself.
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA foreign_keys = ON")

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # A writer waits for the write lock at BEGIN (up to SQLITE_LOCK_WAIT_S); taking it later,
        # after reading, fails at once when another writer committed in between.
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine.execution_options(**{_READ_ONLY_OPTION: read_only}) if read_only else engine


class SQLiteBackend(Backend):
    drivernames = ("sqlite",)
    url_form = "sqlite:///path/to/store.db"

    def check_url(self, url: URL, text: str) -> None:
        if url.database in (None, "", ":memory:"):
            raise URLError(f"store URL {text!r} names no file (an in-memory store keeps nothing); use {self.url_form}")

    def engine(self, url: URL, text: str, create: bool) -> Engine:
        path = Path(url.database)
        if not path.parent.is_dir():
            raise StoreUnavailableError(f"results store {text}: directory {str(path.parent)!r} does not exist")
        if not create and not path.is_file():
            raise StoreUnavailableError(f"results store {text}: no store there ({str(path)!r} does not exist)")
        if create or _opens(path, None):
            return _engine(url)
        mode = next((mode for mode in READ_ONLY_MODES if _opens(path, mode)), None)
        return _engine(url, mode)  # without a mode, its first query says why the store cannot be read

    def read_only(self, engine: Engine) -> str | None:
        return engine.get_execution_options().get(_READ_ONLY_OPTION)

    def writer(self, engine: Engine) -> Engine:
        return engine.execution_options(**{_WRITE_OPTION: True})

    def prepare_new(self, engine: Engine) -> None:
        # Both settings stay with the file, and neither can be made inside a transaction, hence the raw
        # connection. The page size applies to a new file only: a record row (~2 kB) leaves half of a
        # default 4 kB page empty, a 16 kB page holds seven (a store 40% smaller, and faster to write).
        raw = engine.raw_connection()
        try:
            raw.driver_connection.execute(f"PRAGMA page_size = {SQLITE_PAGE_BYTES}")
            raw.driver_connection.execute("PRAGMA journal_mode = WAL")
        finally:
            raw.close()

    def insert_or_skip(self, table: Table):
        return sqlite.insert(table)


BACKEND = SQLiteBackend()
