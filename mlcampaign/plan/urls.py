"""Results store URLs: the default store, what a store URL may be, and URLs in messages.

Store URLs:
    sqlite:///relative/path.db      embedded store, relative to the working directory
    sqlite:////absolute/path.db     (SQLAlchemy's form: a fourth slash starts an absolute path)
    postgresql://user@host:port/dbname   a PostgreSQL server (driver: psycopg 3)
A URL never holds a password (it lives in campaign files under version control): libpq takes it from
the environment (PGPASSWORD, PGPASSFILE / ~/.pgpass; PGUSER, PGHOST, ... fill in what the URL leaves out).

``parse_store_url`` checks a URL when a campaign is planned and when a store is opened: it is of a kind of
store there is a backend for. The backends are the results store's (mlcampaign.history.store.backend, a
layer above this one), one module each in ``STORE_BACKENDS_PACKAGE``, reached by name: a new kind of
store is one module there. A URL refused is a ``URLError``; the store re-raises it as its StoreURLError.

URLs in messages: a password in a URL (a results store's, in a campaign file or on the command line) is
never shown. Every error that can carry a store URL (URLError, mlcampaign.plan.config_files.ConfigError,
mlcampaign.history.store.StoreError, whatever the CLI prints) goes through ``mask_passwords``.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

# The results store of a campaign that names none (the campaign schema's history.store, x-default) and of
# the command line without --store or MLCAMPAIGN_STORE.
DEFAULT_STORE_URL = "sqlite:///results/history.db"
# The kinds of results store: each module there defines BACKEND (a mlcampaign.history.store.backend.Backend).
STORE_BACKENDS_PACKAGE = "mlcampaign.history.store.backends"

MASK = "***"
# The password of a URL's user information (scheme://user:password@host): the text between the
# user's ':' and the last '@' before the host (a password may hold '@'; it never holds '/', a space
# or the quotes that delimit the URL in a message). An empty one hides nothing.
_USERINFO_PASSWORD = re.compile(r"(?P<before>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@'\"]*:)[^\s/'\"]+@")
# A password given as a query parameter (?password=..., &password=...).
_QUERY_PASSWORD = re.compile(r"(?P<before>[?&]password=)[^&\s'\"]+", re.IGNORECASE)


def mask_passwords(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``MASK``."""
    text = _USERINFO_PASSWORD.sub(rf"\g<before>{MASK}@", text)
    return _QUERY_PASSWORD.sub(rf"\g<before>{MASK}", text)


class URLError(ValueError):
    """A store URL is malformed, of an unsupported kind, names no store, or embeds a password."""

    def __init__(self, message: str) -> None:
        # The message names the URL as given (one with a password is refused, and named).
        super().__init__(mask_passwords(message))


@functools.cache
def store_backends() -> dict[str, Any]:
    """Every kind of results store (its backend, BACKEND of its module), by URL scheme."""
    package = importlib.import_module(STORE_BACKENDS_PACKAGE)
    kinds = {}
    for entry in pkgutil.iter_modules(package.__path__):
        backend = importlib.import_module(f"{STORE_BACKENDS_PACKAGE}.{entry.name}").BACKEND
        kinds |= dict.fromkeys(backend.drivernames, backend)
    return kinds


def url_forms() -> str:
    """The URL forms of every kind of store, for error messages."""
    return " or ".join(dict.fromkeys(backend.url_form for backend in store_backends().values()))


def parse_store_url(url: str) -> URL:
    """The SQLAlchemy URL of a store URL; URLError for other kinds and for embedded passwords."""
    # Imported here: every reader of config files imports this module (a trial's too), few parse a URL.
    import sqlalchemy

    try:
        parsed = sqlalchemy.make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError) as error:
        raise URLError(f"store URL {url!r} is not a URL ({error}); use {url_forms()}") from None
    if parsed.password is not None or "password" in parsed.query:
        raise URLError(
            f"store URL {url!r} embeds a password: store URLs live in "
            "campaign files under version control; remove it and give it in the environment instead "
            "(PGPASSWORD, or a PGPASSFILE / ~/.pgpass entry)"
        )
    backend = store_backends().get(parsed.drivername)
    if backend is None:
        raise URLError(f"store URL {url!r} is not of a supported kind; use {url_forms()}")
    backend.check_url(parsed, url)
    return parsed
