"""Dataset manifests: a sha256 per file, and a dataset id that is the hash of the manifest.

The dataset id depends on file contents and relative paths only, so touching, copying or
re-cloning leaves it unchanged while any change of content changes it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath

from mlcampaign.plan.numbers import loads_json

MANIFEST_VERSION = 1
# A staged dataset (the workflow's results/datasets/<name>/): its files, manifest and id file.
DATA_DIR, MANIFEST_FILE, ID_FILE = "data", "manifest.json", "dataset_id"
CHUNK_BYTES = 1 << 20
# Snakemake marks directory() outputs with this file; it is not part of the dataset.
IGNORED_NAMES = frozenset({".snakemake_timestamp"})


class DatasetError(RuntimeError):
    """A staged dataset is missing files or a file's content does not match its manifest."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(root: Path, name: str, data_format: str) -> dict:
    """Hash every file under ``root`` (sorted by relative path) into a manifest."""
    root = Path(root)
    files = [
        {"path": path.relative_to(root).as_posix(), "sha256": sha256_file(path), "bytes": path.stat().st_size}
        for path in _dataset_files(root)
    ]
    if not files:
        raise DatasetError(f"{root}: dataset '{name}' has no files")
    return manifest_from_files(files, name, data_format)


def manifest_from_files(files: list[dict], name: str, data_format: str) -> dict:
    """A manifest of file entries (``path``, ``sha256``, ``bytes``), sorted by path, with its dataset id."""
    files = sorted(files, key=lambda entry: PurePosixPath(entry["path"]))  # the order of _dataset_files
    manifest = {"manifest_version": MANIFEST_VERSION, "name": name, "format": data_format, "files": files}
    manifest["dataset_id"] = dataset_id(manifest)
    return manifest


def _dataset_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in IGNORED_NAMES)


def dataset_id(manifest: dict) -> str:
    """Hash of the content-bearing part of a manifest (format and per-file paths and hashes)."""
    canonical = json.dumps(
        {"format": manifest["format"], "files": [[f["path"], f["sha256"]] for f in manifest["files"]]},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def write_manifest(manifest: dict, path: Path) -> None:
    Path(path).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def write_dataset_id(manifest: dict, path: Path) -> None:
    """The id file: the dataset id alone, which trials depend on (small, so Snakemake compares its
    checksum: re-staging identical content re-runs no trial)."""
    Path(path).write_text(manifest["dataset_id"] + "\n")


def staged_paths(id_path: Path) -> tuple[Path, Path]:
    """The files directory and manifest of the staged dataset whose id file is ``id_path``."""
    root = Path(id_path).parent
    return root / DATA_DIR, root / MANIFEST_FILE


def read_manifest(path: Path) -> dict:
    """A staged dataset's manifest; DatasetError naming the file if it is missing, unreadable or not one."""
    try:
        manifest = loads_json(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise DatasetError(f"{path}: the dataset manifest cannot be read ({error}); stage the dataset again") from None
    except ValueError as error:
        raise DatasetError(
            f"{path}: the dataset manifest is not valid JSON ({error}); stage the dataset again"
        ) from None
    if not isinstance(manifest, dict) or not {"name", "dataset_id", "files"} <= set(manifest):
        raise DatasetError(f"{path}: not a dataset manifest (no name, dataset_id and files); stage the dataset again")
    return manifest


def read_dataset_id(path: Path) -> str:
    """The dataset id in a staged dataset's id file (``write_dataset_id``)."""
    try:
        return Path(path).read_text().strip()
    except OSError as error:
        raise DatasetError(f"{path}: the dataset id file cannot be read ({error})") from None


def verify(root: Path, manifest: dict) -> None:
    """Raise DatasetError naming every missing, corrupted or unexpected file under ``root``."""
    root = Path(root)
    problems = []
    expected = {entry["path"] for entry in manifest["files"]}
    for entry in manifest["files"]:
        path = root / entry["path"]
        if not path.is_file():
            problems.append(f"missing file {path}")
        elif path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            problems.append(f"corrupted file {path} (sha256 differs from the manifest)")
    extra = [p.relative_to(root).as_posix() for p in _dataset_files(root)] if root.is_dir() else []
    problems += [f"unexpected file {root / p}" for p in extra if p not in expected]
    if problems:
        raise DatasetError(
            f"dataset '{manifest['name']}' ({manifest['dataset_id']}) at {root} does not match its manifest:\n  "
            + "\n  ".join(problems)
        )
