"""Names: of campaigns, runs, sites, systems, benchmarks and cells, one rule for all of them, wherever they come
from: campaign and system files (their schemas' ``x-name``, mlcampaign.plan.config_files), ``--config`` and the
profile's site at planning (mlcampaign.plan.runs), run manifests, records and bundles at ingest and import (the
record schema's ``x-name``; mlcampaign.history.store, mlcampaign.history.bundle).

Each name becomes a folder or file name (``results/<campaign>/runs/<run>/trials/<system>/<benchmark>/<cell>/``,
the dashboard's ``trends-<system>--<benchmark>.html``), a key that two sites' runs must agree on, and text that
pages and tables show. So a name is ASCII letters, digits, '.', '_' and '-', starting with a letter or digit,
and at most ``MAX_NAME_LENGTH`` characters: no markup, no path parts ('/', '..'), no spaces or control
characters.

Unicode is refused rather than normalised: names that differ only in Unicode normalisation (NFC 'é' against
NFD 'e' and a combining accent) or in script (Latin 'a' against Cyrillic U+0430) look the same and would be two folders,
two sites, two rows of one ranking. Every ASCII text is its own NFC form, so no two names are look-alikes.

``MAX_NAME_LENGTH``: the longest file name made of names is a trend page of the dashboard, two names and 14
characters (214 bytes at most), under the 255 bytes of NAME_MAX; a run id derived from a site's name
(mlcampaign.plan.runs.derived_run_id) adds 17 characters to it and is held to the same bound.
"""

from __future__ import annotations

import re
from typing import Any

MAX_NAME_LENGTH = 100
# As a JSON Schema pattern (a search: anchored, and `$` not before a final newline).
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]*$(?!\\n)"
NAME_RULE = "letters, digits, '.', '_' and '-' (ASCII), starting with a letter or digit"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# How much of a value that is not a name a message shows.
_SHOWN_CHARACTERS = 60


class InvalidNameError(ValueError):
    """A value that is not a name; the message names where it is, the value and what is wrong with it."""


def shown(value: Any) -> str:
    """A value as a message shows it: its repr, cut after _SHOWN_CHARACTERS characters."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARACTERS else f"{text[:_SHOWN_CHARACTERS]}… ({len(text)} characters)"


def name_problem(value: Any) -> str | None:
    """What makes ``value`` no name (module docstring), or None for a name."""
    if not isinstance(value, str):
        return f"{type(value).__name__}, not text"
    if len(value) > MAX_NAME_LENGTH:
        return f"{len(value)} characters, more than the {MAX_NAME_LENGTH} a name may have"
    foreign = next((character for character in value if not character.isascii()), None)
    if foreign is not None:
        return f"it holds {foreign!r} (U+{ord(foreign):04X}); a name is {NAME_RULE}, so that two names never look alike"
    if not _NAME.fullmatch(value):
        return f"a name is {NAME_RULE}"
    return None


def check_name(value: Any, where: str) -> str:
    """``value`` if it is a name; InvalidNameError naming ``where`` (e.g. "run.json: key 'site'") otherwise."""
    problem = name_problem(value)
    if problem is not None:
        raise InvalidNameError(f"{where}: value {shown(value)} is not a name: {problem}")
    return value
