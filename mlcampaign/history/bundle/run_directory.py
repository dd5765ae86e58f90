"""Reading a run folder for a bundle or an ingest: its manifest and records, each a regular file inside it
(never through a link, so that nothing from elsewhere travels with the run), each record in its own
trial's directory; and its ingest into a store (``ingest_run_directory``: the ingest of ``mlcampaign ingest``
and of the workflow's ingest rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from mlcampaign.history.bundle import limits
from mlcampaign.history.bundle.layout import RECORD, RUN_MANIFEST, SUPERSEDED, BundleError, parse_json
from mlcampaign.history.bundle.members import check_record_place
from mlcampaign.history.store import IngestResult, RecordFile, ResultsStore
from mlcampaign.plan import config_files
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
    naming a link on the way, a file that is not a regular file, or one larger than a bundle member may be
    (mlcampaign.plan.config_files.read_regular_file)."""
    path = root / relative
    over = f"over the limit of a bundle member ({limits.MAX_MEMBER_BYTES} bytes)"
    try:
        return config_files.read_regular_file(path, limits.MAX_MEMBER_BYTES, over, inside=root)
    except FileNotFoundError as error:
        raise BundleError(f"{path}: cannot be read: {error.strerror}") from None
    except config_files.ConfigError as error:
        raise BundleError(str(error)) from None


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
