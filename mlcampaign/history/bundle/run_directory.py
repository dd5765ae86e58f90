"""Reading a run folder for a bundle or an ingest: its manifest and records, each a regular file inside it
(never through a link, so that nothing from elsewhere travels with the run), each record in its own
trial's directory.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath

from mlcampaign.history.bundle import limits
from mlcampaign.history.bundle.layout import RECORD, RUN_MANIFEST, SUPERSEDED, BundleError, parse_json
from mlcampaign.history.bundle.members import check_record_place
from mlcampaign.history.store import RecordFile
from mlcampaign.plan import config_files


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


def read_run_directory(run_dir: Path) -> RunDirectory:
    """The manifest and records of the run in ``run_dir`` (``results/<campaign>/runs/<run_id>``, or a
    link to one such as ``results/<campaign>/latest``), each record in its own trial's directory."""
    run_dir = Path(run_dir)
    root = run_dir.resolve()
    if not (root / RUN_MANIFEST).is_file():
        raise BundleError(f"{run_dir}: not a run directory (no {RUN_MANIFEST})")
    manifest = parse_json(read_regular_file(root, PurePosixPath(RUN_MANIFEST)), str(run_dir / RUN_MANIFEST))
    if manifest.get("run_id") != root.name:
        raise BundleError(
            f"{run_dir / RUN_MANIFEST}: run_id {manifest.get('run_id')!r} is not the directory's name {root.name!r}"
        )
    current = sorted(root.glob(f"trials/*/*/*/*/{RECORD}"))
    records = []
    for path in current + sorted(root.glob(f"trials/*/*/*/*/{SUPERSEDED}/*.json")):
        relative = PurePosixPath(path.relative_to(root).as_posix())
        shown = run_dir / relative
        record = parse_json(read_regular_file(root, relative), str(shown))
        check_record_place(str(shown), relative.as_posix(), record, "")
        records.append(RecordFile(str(shown), record))
    return RunDirectory(run_dir, manifest, records)
