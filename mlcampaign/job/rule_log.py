"""What the workflow's rule scripts (scripts/*.py) share: their log."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def rule_log(path: str | Path) -> Iterator[TextIO]:
    """The rule's log file, open for the body, with stdout and stderr redirected into it.

    An exception in the body is written to the log with its traceback before the log closes, and
    raised again so that the job fails (Snakemake then reports it too, naming the log)."""
    with open(path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            yield log
        except BaseException:
            traceback.print_exc(file=log)
            raise
