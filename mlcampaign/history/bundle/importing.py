"""Importing a bundle, verified whole first: into a results store (its run ingested), or into a results
folder (unpacked beside it, moved into place once verified; a file there with other content is refused).
"""

from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from mlcampaign.history.bundle.layout import RUN_MANIFEST, BundleError
from mlcampaign.history.bundle.reading import Bundle, read_bundle
from mlcampaign.history.store import IngestResult, ResultsStore


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
    so that the workflow can analyse it there. A file already there with the same content is left
    as it is; one with other content, or a link on the way to it, is refused (before anything is written).
    The bundle is unpacked into a temporary folder in ``results_dir`` first, and its files are moved into
    place once it is verified whole. Returns the files written."""
    bundle_path, results_dir = Path(bundle_path), Path(results_dir)
    created = not results_dir.exists()
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".mlcampaign-import-", dir=results_dir))
    except OSError as error:
        raise BundleError(f"{results_dir}: cannot import into it: {error}") from None
    try:
        bundle = read_bundle(bundle_path, unpack_dir=staging)
        pending = [name for name in bundle.members if not _already_there(bundle, results_dir, staging, name)]
        written = []
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
