"""Reading a run folder for a bundle or an ingest: its manifest and records, each a regular file inside it
(never through a link, so that nothing from elsewhere travels with the run), each record in its own
trial's directory; and its ingest into a store (``ingest_run_directory``: the ingest of ``mlcampaign ingest``
and of the workflow's ingest rule).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from mlcampaign.history.bundle import limits
from mlcampaign.history.bundle.layout import RECORD, RUN_MANIFEST, SUPERSEDED, BundleError, parse_json
from mlcampaign.history.bundle.members import check_record_place
from mlcampaign.history.store import IngestResult, RecordFile, ResultsStore
from mlcampaign.plan.runs import imported


@dataclasses.dataclass(frozen=True)
class RunDirectory:
    """A run's files in a results directory, read and parsed."""

    path: Path
    manifest: dict
    records: list[RecordFile]  # record.json of every trial, then superseded records


def read_regular_file(root: Path, relative: PurePosixPath) -> bytes:
    """The content of the regular file ``root/relative``, opened one folder at a time without following a
    link (so that nothing outside ``root`` is read, even if the folder changes meanwhile); BundleError
    naming a link on the way, a file that is not a regular file, or one larger than a bundle member may be."""
    path = root / relative
    try:
        descriptor = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        raise BundleError(f"{path}: cannot be read: {root}: {error.strerror}") from None
    try:
        for depth, part in enumerate(relative.parts):
            last = depth == len(relative.parts) - 1
            # O_NONBLOCK: opening a named pipe must not wait for a writer (it is refused below).
            flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            try:
                opened = os.open(part, flags, dir_fd=descriptor)
            except OSError as error:
                reached = root.joinpath(*relative.parts[: depth + 1])
                if error.errno in (errno.ELOOP, errno.ENOTDIR) and reached.is_symlink():
                    raise BundleError(
                        f"{reached}: a link (to {os.readlink(reached)!r}); a run's files are read as regular files, "
                        "never through a link, so that nothing from elsewhere travels with the run"
                    ) from None
                raise BundleError(f"{path}: cannot be read: {error.strerror}") from None
            os.close(descriptor)
            descriptor = opened
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise BundleError(f"{path}: not a regular file; a run's files are read as regular files only")
        if status.st_size > limits.MAX_MEMBER_BYTES:
            raise BundleError(
                f"{path}: {status.st_size} bytes, over the limit of a bundle member ({limits.MAX_MEMBER_BYTES} bytes)"
            )
        with open(descriptor, "rb", closefd=False) as handle:
            data = handle.read(limits.MAX_MEMBER_BYTES + 1)  # a file growing meanwhile is read no further
        if len(data) > limits.MAX_MEMBER_BYTES:
            raise BundleError(f"{path}: over the limit of a bundle member ({limits.MAX_MEMBER_BYTES} bytes)")
        return data
    finally:
        os.close(descriptor)


def read_run_directory(run_dir: Path, trials: Iterable[Path] | None = None) -> RunDirectory:
    """The manifest and records of the run in ``run_dir`` (``results/<campaign>/runs/<run_id>``, or a
    link to one such as ``results/<campaign>/latest``), each record in its own trial's directory. ``trials``:
    only the records of these trial folders (under ``run_dir``: the trials its workflow planned)."""
    run_dir = Path(run_dir)
    root = run_dir.resolve()
    if not (root / RUN_MANIFEST).is_file():
        raise BundleError(f"{run_dir}: not a run directory (no {RUN_MANIFEST})")
    manifest = parse_json(read_regular_file(root, PurePosixPath(RUN_MANIFEST)), str(run_dir / RUN_MANIFEST))
    if manifest.get("run_id") != root.name:
        raise BundleError(
            f"{run_dir / RUN_MANIFEST}: run_id {manifest.get('run_id')!r} is not the directory's name {root.name!r}"
        )
    folders = (
        ["trials/*/*/*/*"] if trials is None else [Path(trial).relative_to(run_dir).as_posix() for trial in trials]
    )
    current = sorted(path for folder in folders for path in root.glob(f"{folder}/{RECORD}"))
    superseded = sorted(path for folder in folders for path in root.glob(f"{folder}/{SUPERSEDED}/*.json"))
    records = []
    for path in current + superseded:
        relative = PurePosixPath(path.relative_to(root).as_posix())
        shown = run_dir / relative
        record = parse_json(read_regular_file(root, relative), str(shown))
        check_record_place(str(shown), relative.as_posix(), record, "")
        records.append(RecordFile(str(shown), record))
    return RunDirectory(run_dir, manifest, records)


def ingest_run_directory(run_dir: Path, store: ResultsStore, trials: Iterable[Path] | None = None) -> IngestResult:
    """Ingest the run in ``run_dir`` (``trials``: only these trial folders' records, as read_run_directory). A
    site's own run folder continues its run in the store: a re-run trial's record and a re-planned manifest
    supersede what the store holds (both kept). A folder an import wrote (mlcampaign.plan.runs.IMPORTED_MARKER)
    is another site's run: ingested as an import is, never superseding (SupersedeError)."""
    run = read_run_directory(run_dir, trials)
    return store.ingest(
        run.manifest, run.records, manifest_source=str(run.path / RUN_MANIFEST), supersede=not imported(run.path)
    )
