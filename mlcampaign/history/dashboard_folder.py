"""The dashboard's folder (mlcampaign.history.dashboard): written whole or not at all, and only where a dashboard
is. The site is built in a temporary folder beside ``out_dir`` and replaces it once complete. Only a dashboard is
replaced: a folder that holds the marker file a build writes (MARKER, listing the files of that build) and
nothing else, a dashboard built before the marker (its pages and assets only), or an empty folder. Anything else
at ``out_dir`` (a results folder, a file someone added to the site) is refused, naming it, and nothing is
removed."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from mlcampaign.history.merge import HistoryError

# The file that marks a folder as a dashboard this module built: {"campaign", "built_utc", "files"}.
MARKER = ".mlcampaign-dashboard.json"
ASSETS = ("assets/plotly.min.js", "assets/dashboard.js", "assets/dashboard.css")
# The files of a dashboard built before the marker (a site's own folder, replaced by its next build).
_UNMARKED_PAGE = re.compile(r"index\.html|runs\.html|system-[A-Za-z0-9._-]+\.html|trends-[A-Za-z0-9._-]+\.html")


def _entries(folder: Path) -> list[str]:
    """Everything under ``folder`` (files, links, folders), as relative POSIX paths; links are not followed."""
    entries = []
    for directory, folders, files in os.walk(folder):
        relative = Path(directory).relative_to(folder)
        entries += [(relative / name).as_posix() for name in [*folders, *files]]
    return sorted(entries)


def refuse_unless_dashboard(target: Path) -> None:
    """HistoryError unless ``target`` is absent, an empty folder, or a dashboard (module docstring)."""
    if not target.exists() and not target.is_symlink():
        return
    if not target.is_dir():
        raise HistoryError(f"{target}: not a folder; the dashboard is written only to a new folder or a dashboard's")
    entries = _entries(target)
    if not entries:
        return
    marker = target / MARKER
    if marker.is_file() and not marker.is_symlink():
        try:
            built = set(json.loads(marker.read_text())["files"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise HistoryError(f"{marker}: not a dashboard's marker ({error}); nothing was removed") from None
        what = f"files of the dashboard built there (listed in {MARKER})"
    else:
        built = {entry for entry in entries if _UNMARKED_PAGE.fullmatch(entry) or entry in ASSETS}
        what = f"pages and assets of a dashboard (it has no {MARKER})"
    allowed = built | {MARKER} | {Path(name).parent.as_posix() for name in built}
    other = [entry for entry in entries if entry not in allowed or (target / entry).is_symlink()]
    if other or not built:
        found = f"{len(other)} other entries, e.g. '{other[0]}'" if other else "no dashboard page"
        raise HistoryError(
            f"{target}: not a dashboard this command built, so it is not replaced ({found}; only the {what} "
            "may be there); nothing was removed. Give --out a new or empty folder, or this dashboard's own"
        )


def replace_directory(built: Path, target: Path) -> None:
    """Put the finished site ``built`` at ``target``; an older site there is removed only after the
    new one is complete, so a failed build leaves it as it was."""
    if not target.exists():
        os.replace(built, target)
        return
    # An empty folder of this process's own, for the old site to be renamed over (rename replaces an empty folder).
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.replace(target, retired)
    try:
        os.replace(built, target)
    except OSError:
        os.replace(retired, target)
        raise
    shutil.rmtree(retired)
