"""URLs in messages: a password in a URL (a results store's, in a campaign file or on the command line)
is never shown. Every error that can carry a store URL (mlcampaign.plan.config_files.ConfigError,
mlcampaign.history.store.StoreError, whatever the CLI prints) goes through ``mask_passwords``.
"""

from __future__ import annotations

import re

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
