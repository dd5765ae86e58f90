"""Results store URLs: the default store, what a store URL may be, and URLs in messages.

Store URLs:
    sqlite:///relative/path.db      embedded store, relative to the working directory
    sqlite:////absolute/path.db     (SQLAlchemy's form: a fourth slash starts an absolute path)
    postgresql://user@host:port/dbname   a PostgreSQL server (driver: psycopg 3)
A URL never holds a password (it lives in campaign files under version control): libpq takes it from
the environment (PGPASSWORD, PGPASSFILE / ~/.pgpass; PGUSER, PGHOST, ... fill in what the URL leaves out).

``parse_store_url`` checks a URL when a campaign is read (``mlcampaign check`` and planning,
mlcampaign.plan.config.load_campaign) and when a store is opened: it holds no password and is of a kind of
store there is a backend for. The backends are the results store's (mlcampaign.history.store.backend, a
layer above this one), one module each in ``STORE_BACKENDS_PACKAGE``, reached by name: a new kind of
store is one module there. A URL refused is a ``URLError``; the store re-raises it as its StoreURLError.

URLs in messages and outputs: a password in a URL (a results store's, in a campaign file, on the command line
or in MLCAMPAIGN_STORE) is never shown, in any form: with '/', '@', ':', '%', spaces or quotes in it, or given
as a query parameter (``password=``, ``sslpassword=``, ...). A URL the code knows is shown by ``shown_url``,
which finds the password as the driver does (SQLAlchemy's ``make_url``): a refusal names the URL so
(URLError), and a URL is refused whenever ``shown_url`` would hide a part of it, so that an open store's URL
(its ``url``, in messages and outputs) holds no secret. Neither help texts, defaults nor logs carry a URL
given by the user. Every error that may quote a URL in other words (mlcampaign.plan.config_files.ConfigError,
mlcampaign.history.store.StoreError, whatever the CLI prints) goes through ``mask_passwords`` as well.
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
# Query parameters that carry a secret: libpq's password and sslpassword, and any other spelling of one.
_SECRET_PARAMETER = re.compile(r"pass(word|wd|phrase)?|secret|token", re.IGNORECASE)
# Free text (mask_passwords): the password of a URL's user information (scheme://user:password@host), the text
# between the user's ':' and the last '@' before the host, up to a space, '/' or quote; and a secret parameter.
_USERINFO_PASSWORD = re.compile(r"(?P<before>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@'\"]*:)[^\s/'\"]+@")
_QUERY_PASSWORD = re.compile(
    r"(?P<before>[?&][A-Za-z_]*(?:pass(?:word|wd|phrase)?|secret|token)[A-Za-z_]*=)[^&\s'\"]+", re.IGNORECASE
)


def mask_passwords(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``MASK``: a last guard for text that may quote
    a URL (an error of the database driver, a message built elsewhere). A URL this project knows is shown by
    ``shown_url`` instead, which finds the password as the driver does, whatever characters it holds."""
    text = _USERINFO_PASSWORD.sub(rf"\g<before>{MASK}@", text)
    return _QUERY_PASSWORD.sub(rf"\g<before>{MASK}", text)


def _shown_query(pairs: list[tuple[str, str]]) -> str:
    """A URL's query as shown: a secret parameter's value as MASK, and nothing after it (a secret holding '&' is
    split into parameters that are part of it)."""
    shown = []
    for key, value in pairs:
        if _SECRET_PARAMETER.search(key):
            shown.append(f"{key}={MASK}")
            break
        shown.append(f"{key}={value}" if value or not key else key)
    return "&".join(shown)


def _unparsed_url(url: str) -> str:
    """A text that SQLAlchemy does not parse as a URL (a port that is not a number), shown: whatever follows
    the ':' of its user information up to its last '@' as MASK, and its query as _shown_query shows it."""
    scheme, separator, rest = url.partition("://")
    userinfo, at, address = rest.rpartition("@")
    if at and ":" in userinfo:
        userinfo = f"{userinfo.split(':', 1)[0]}:{MASK}"
    address, question, query = address.partition("?")
    if question:
        query = _shown_query([tuple(pair.partition("=")[::2]) for pair in query.split("&")])
    return f"{scheme}{separator}{userinfo}{at}{address}{question}{query}"


def shown_url(url: str) -> str:
    """A store URL as messages and outputs show it (``url`` itself when it holds no secret). Its parts are found
    as SQLAlchemy's ``make_url`` finds them for the driver: the password (whatever characters it holds; one
    holding an unescaped '@' ends at the host's last '@') and the values of secret query parameters (password,
    sslpassword, ...) are shown as MASK."""
    import sqlalchemy

    try:
        parsed = sqlalchemy.make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return _unparsed_url(url)
    host = parsed.host or ""
    # make_url ends a password at its first '@': with an unescaped '@' in it, the rest is in the host.
    cut = parsed.password is not None and "@" in host
    pairs = [
        (key, value)
        for key, values in parsed.query.items()
        for value in ((values,) if isinstance(values, str) else values)
    ]
    if parsed.password is None and not any(_SECRET_PARAMETER.search(key) for key, _ in pairs):
        return url
    shown = parsed.set(host=host.rpartition("@")[2] if cut else parsed.host, query={})
    query = _shown_query(pairs)
    return shown.render_as_string(hide_password=True) + (f"?{query}" if query else "")


def holds_secret(url: str) -> bool:
    """Whether a store URL holds a password or a secret query parameter (``shown_url`` hides them)."""
    return shown_url(url) != url


class URLError(ValueError):
    """A store URL is malformed, of an unsupported kind, names no store, or embeds a password."""

    def __init__(self, message: str) -> None:
        # The message names the URL as shown_url shows it; mask_passwords guards the rest of its text.
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

    if not url.isprintable():
        raise URLError(f"store URL {shown_url(url)!r} holds a line break or another control character")
    try:
        parsed = sqlalchemy.make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError) as error:
        # What the parser says quotes the URL: only where the URL shows whole.
        detail = f" ({error})" if shown_url(url) == url else ""
        raise URLError(f"store URL {shown_url(url)!r} is not a URL{detail}; use {url_forms()}") from None
    if holds_secret(url):
        raise URLError(
            f"store URL {shown_url(url)!r} embeds a password: store URLs live in campaign files under version "
            "control; remove it and give it in the environment instead (PGPASSWORD, or a PGPASSFILE / ~/.pgpass "
            "entry)"
        )
    backend = store_backends().get(parsed.drivername)
    if backend is None:
        raise URLError(f"store URL {url!r} is not of a supported kind; use {url_forms()}")
    backend.check_url(parsed, url)
    return parsed
