"""Importing a bundle, verified whole first: into a results store (its run ingested), or into a results
folder (unpacked beside it, moved into place once verified). Both make the same checks of the run against what
is held of its id already (mlcampaign.history.store.superseding.admit: one run per id, no superseding unless a
store import asks for it); a results folder holds the run folders of its campaigns.

An import into a results folder never writes into a run folder this site produced: it writes only run folders
that it creates, marked with mlcampaign.plan.runs.IMPORTED_MARKER (written first, holding the bundle's
bundle.json and the sha256 of its checksum list), which the workflow never continues or ingests as its own.
A file there with other content is refused; importing the same bundle again completes an import that was cut
short.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from mlcampaign.history.bundle.layout import RUN_MANIFEST, BundleError, parse_json
from mlcampaign.history.bundle.reading import Bundle, read_bundle
from mlcampaign.history.bundle.run_directory import read_regular_file, read_run_directory
from mlcampaign.history.store import IngestResult, RecordFile, ResultsStore
from mlcampaign.history.store.checks import RunRow, check_start, distinct_records, record_row, trial_key
from mlcampaign.history.store.superseding import HeldRun, admit
from mlcampaign.history.store.tables import now_utc
from mlcampaign.plan.runs import IMPORTED_MARKER, imported
from mlcampaign.records.files import canonical_json, write_json_atomic

# How a run imported into a results folder would be superseded there (SupersedeError's message).
RESULTS_REMEDY = (
    "An import into a results folder never replaces a run's files: import this bundle into the store "
    "(with --supersede), or into another results folder"
)


def import_into_store(bundle_path: Path, store: ResultsStore, *, supersede: bool = False) -> IngestResult:
    """Ingest a bundle's run into ``store``, after verifying the whole bundle. ``supersede``: the bundle's
    manifest may replace the stored run's and its records may be re-runs of stored trials (the store
    keeps both: ResultsStore.ingest); without, such a bundle is refused (SupersedeError)."""
    bundle = read_bundle(bundle_path)
    return store.ingest(
        bundle.manifest,
        bundle.records,
        manifest_source=f"{bundle.path}:{bundle.run_prefix}/{RUN_MANIFEST}",
        supersede=supersede,
    )


def import_into_results(bundle_path: Path, results_dir: Path) -> list[Path]:
    """Unpack a bundle's run into ``results_dir`` (its run directory, and datasets/<name>/manifest.json),
    so that another site's run can be read there. The run is checked against what ``results_dir`` holds of its id
    as a store import checks it (``_check_against_results``); a file already there with the same content is
    left as it is; one with other content, or a link on the way to it, is refused (before anything is written).
    The bundle is unpacked into a temporary folder in ``results_dir`` first, and its files are moved into
    place once it is verified whole, after the run folder's IMPORTED_MARKER. Returns the files written."""
    bundle_path, results_dir = Path(bundle_path), Path(results_dir)
    created = not results_dir.exists()
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".mlcampaign-import-", dir=results_dir))
    except OSError as error:
        raise BundleError(f"{results_dir}: cannot import into it: {error}") from None
    try:
        bundle = read_bundle(bundle_path, unpack_dir=staging)
        marker = results_dir / bundle.run_prefix / IMPORTED_MARKER
        pending = [name for name in bundle.members if not _already_there(bundle, results_dir, staging, name)]
        _check_against_results(bundle, results_dir)
        written = []
        if not marker.exists():
            mark = {"bundle": bundle.info, "checksums_sha256": bundle.checksums_sha256, "imported_utc": now_utc()}
            write_json_atomic(mark, marker)
            written.append(marker)
        for name in pending:
            target = results_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / name, target)
            written.append(target)
        return written
    except OSError as error:
        raise BundleError(
            f"{bundle_path}: cannot be imported into {results_dir} ({error}); no file of it is half-written, and "
            "importing it again once the cause is fixed completes the import"
        ) from None
    finally:
        shutil.rmtree(staging)
        if created and not any(results_dir.iterdir()):
            results_dir.rmdir()


def _check_against_results(bundle: Bundle, results_dir: Path) -> None:
    """Make the checks of a store import against what ``results_dir`` holds of the bundle's run id (a run folder
    of that id in any campaign): refused if that folder is one this site produced (no IMPORTED_MARKER), if it
    is another run, or if the bundle would supersede it (admit, without superseding); a new run, if it starts
    in the future. The same bundle again (its marker names its checksum list) completes its import."""
    run = RunRow.from_manifest(bundle.manifest, f"{bundle.path}:{bundle.run_prefix}/{RUN_MANIFEST}")
    held = None
    for folder in sorted(results_dir.glob(f"*/runs/{run.run_id}")):
        if not imported(folder):
            raise BundleError(
                f"{bundle.path}: run '{run.run_id}' would be written into {folder}, a run folder this site produced "
                f"(it has no {IMPORTED_MARKER}): an import never writes into one; nothing was written. Import the "
                "bundle into the store, or into another results folder"
            )
        if _loads_marker(folder).get("checksums_sha256") == bundle.checksums_sha256:
            return  # this bundle's import, cut short: what is there is checked file by file (_already_there)
        if (folder / RUN_MANIFEST).is_file():
            held = _held_in(folder, results_dir)
            break
    if held is None:
        check_start(run)
    admit(run, _rows(run, bundle.records), held, supersede=False)


def _rows(run: RunRow, records: list[RecordFile]) -> list[dict]:
    """The records-table rows of a run's records (mlcampaign.history.store.checks.record_row: schema checked)."""
    now = now_utc()
    return [
        record_row(run.run_id, key, file, text, now) for key, (file, text) in distinct_records(records, run).items()
    ]


def _loads_marker(folder: Path) -> dict:
    return parse_json(read_regular_file(folder, PurePosixPath(IMPORTED_MARKER)), str(folder / IMPORTED_MARKER))


def _held_in(folder: Path, results_dir: Path) -> HeldRun:
    """What an imported run folder holds (as ``admit`` compares it with a bundle)."""
    run = read_run_directory(folder)
    rows = _rows(RunRow.from_manifest(run.manifest, str(folder / RUN_MANIFEST)), run.records)
    return HeldRun(
        place=f"results folder {results_dir} ({folder})",
        holder="the results folder",
        manifest_json=canonical_json(run.manifest),
        manifest=lambda: run.manifest,
        record_keys=frozenset(row["content_sha256"] for row in rows),
        trials=frozenset(trial_key(row) for row in rows),
        remedy=RESULTS_REMEDY,
    )


def _already_there(bundle: Bundle, results_dir: Path, staging: Path, name: str) -> bool:
    """Whether the member ``name`` is in ``results_dir`` already, with the same content; BundleError if a
    different file is there, or a link on the way (writing through it would leave the results directory)."""
    parts = PurePosixPath(name).parts
    for depth in range(1, len(parts) + 1):
        path = results_dir.joinpath(*parts[:depth])
        if path.is_symlink():
            raise BundleError(
                f"{bundle.path}: member '{name}' would be written through {path}, a link (to "
                f"{os.readlink(path)!r}); nothing was written (an import writes inside the results directory only)"
            )
        if not path.exists():
            return False
    target = results_dir / name
    if not target.is_file() or not filecmp.cmp(staging / name, target, shallow=False):
        raise BundleError(
            f"{bundle.path}: member '{name}' differs from {target}, which is there already; "
            "nothing was written (move that file away to import this bundle)"
        )
    return True
