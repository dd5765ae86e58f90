"""Staging, in two steps.

1. ``stage`` (the workflow's ``stage_dataset`` rule, once per dataset): source -> files +
   manifest. The source is a generator, which writes the dataset in its real format, or a path
   on the system's filesystem (``$VARIABLES`` expanded), from which the selected subset of each
   split (``subset``: a seeded random choice of files, e.g. the published 2048/512 "mini" sets)
   and the format's shared files (DeepCAM's ``stats.h5``) are copied. The manifest holds a
   sha256 per file; its hash is the dataset id. Files are written to a temporary sibling
   directory and renamed into place only once the manifest is complete, so an interrupted
   staging never leaves a directory that looks finished.
2. ``stage_to_node`` (every trial, before training): a verified copy of the staged dataset in
   the system's ``staging_dir`` (node-local scratch), or, without one, a verification in place.
   Any missing, corrupted or unexpected file is reported by name before training starts.
   Hashing is done once per node per run: a note beside the verified files records the run, the
   dataset id and every file's path, size, mtime and inode; a later trial of the same run on the
   same node whose files still show the same metadata reads them without hashing them again (as
   git's index trusts unchanged metadata). A changed, added or removed file changes the metadata, so
   it is hashed and reported; what metadata cannot show (a file rewritten with its size and mtime
   restored, or decayed on disk) is found by the first trial of the next run.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import numpy as np

from mlcampaign.data.manifest import (
    CHUNK_BYTES,
    DATA_DIR,
    ID_FILE,
    IGNORED_NAMES,
    MANIFEST_FILE,
    DatasetError,
    build_manifest,
    manifest_from_files,
    sha256_file,
    verify,
    write_dataset_id,
    write_manifest,
)
from mlcampaign.plan.registry import data_formats, generators


def stage_into(dataset: dict, root: Path) -> dict:
    """Stage ``dataset`` as the workflow does: its data, manifest and id file in ``root`` (the
    ``stage_dataset`` rule's outputs; trials take ``root / ID_FILE``). Returns the manifest."""
    root = Path(root)
    manifest = stage(dataset, root / DATA_DIR, root / MANIFEST_FILE)
    write_dataset_id(manifest, root / ID_FILE)
    return manifest


def stage(dataset: dict, data_dir: Path, manifest_path: Path) -> dict:
    """Stage ``dataset`` (a benchmark config's ``dataset`` block) into ``data_dir``; return its manifest."""
    data_dir, manifest_path = Path(data_dir), Path(manifest_path)
    source = dataset["source"]
    tmp_dir = data_dir.with_name(data_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    started = time.perf_counter()
    if "generator" in source:
        generator = generators()[source["generator"]]
        if dataset["format"] not in generator.formats:
            raise DatasetError(
                f"dataset '{dataset['name']}': key 'source.generator': value '{source['generator']}' writes "
                f"{list(generator.formats)}, not format '{dataset['format']}'"
            )
        generator.write(tmp_dir, dataset["format"], **source.get("options", {}))
        manifest = build_manifest(tmp_dir, dataset["name"], dataset["format"])
    else:
        origin = source_path(dataset)
        selected = select_files(origin, dataset)
        files = [_copy_hashed(origin / relative, tmp_dir / relative) | {"path": relative} for relative in selected]
        manifest = manifest_from_files(files, dataset["name"], dataset["format"])
        verify(tmp_dir, manifest)
    manifest["source"] = source
    manifest["staging"] = {"seconds": time.perf_counter() - started, "host": socket.gethostname()}
    shutil.rmtree(data_dir, ignore_errors=True)
    tmp_dir.rename(data_dir)
    tmp_manifest = manifest_path.with_name(manifest_path.name + ".tmp")
    write_manifest(manifest, tmp_manifest)
    tmp_manifest.rename(manifest_path)
    return manifest


def source_path(dataset: dict) -> Path:
    """The dataset's source directory, ``$VARIABLES`` expanded, or DatasetError naming the key and value."""
    text = dataset["source"]["path"]
    expanded = os.path.expandvars(text)
    unset = re.findall(r"\$\{?(\w+)", expanded)
    if unset:
        raise DatasetError(
            f"dataset '{dataset['name']}': key 'source.path': value '{text}' uses unset environment variable(s) {unset}"
        )
    origin = Path(expanded).expanduser()
    if not origin.is_dir():
        raise DatasetError(
            f"dataset '{dataset['name']}': key 'source.path': value '{text}': {origin} is not a directory"
        )
    return origin


def select_files(origin: Path, dataset: dict) -> list[str]:
    """Relative paths of the files to stage: each split's files (or a seeded subset) and the shared files."""
    data_format = data_formats()[dataset["format"]]
    subset = dataset["source"].get("subset", {})
    rng = np.random.default_rng(subset.get("seed", 0))
    selected = []
    for split, directory in data_format.split_dirs.items():
        files = sorted(p.relative_to(origin).as_posix() for p in (origin / directory).rglob("*") if p.is_file())
        if not files:
            raise DatasetError(f"dataset '{dataset['name']}': {origin / directory} (split '{split}') has no files")
        wanted = subset.get(split)
        if wanted is not None:
            if wanted > len(files):
                raise DatasetError(
                    f"dataset '{dataset['name']}': key 'source.subset.{split}': value {wanted} exceeds the "
                    f"{len(files)} files in {origin / directory}"
                )
            files = [files[i] for i in sorted(rng.choice(len(files), size=wanted, replace=False))]
        selected += files
    for name in data_format.shared_files:
        if not (origin / name).is_file():
            raise DatasetError(
                f"dataset '{dataset['name']}': {origin / name} is missing (format '{dataset['format']}')"
            )
        selected.append(name)
    return selected


def source_digest(dataset: dict, cache_path: Path) -> str:
    """Content hash of the files ``stage`` copies from a path source (paths and sha256s).

    The workflow plans with it, so that a changed source file re-stages the dataset while a
    touched, copied or re-mounted one does not. Each file's sha256 is cached in ``cache_path``
    under its size, mtime and inode (as git's index does): planning hashes only the files whose
    metadata changed since, and a touched file hashes to what it did before.
    """
    origin = source_path(dataset)
    cache_path = Path(cache_path)
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    hashes, fresh_cache = [], {}
    for relative in select_files(origin, dataset):
        stat = (origin / relative).stat()
        key = f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"
        entry = cache.get(relative)
        sha256 = entry["sha256"] if entry and entry["stat"] == key else sha256_file(origin / relative)
        fresh_cache[relative] = {"stat": key, "sha256": sha256}
        hashes.append([relative, sha256])
    if fresh_cache != cache:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = cache_path.with_name(f"{cache_path.name}.tmp{os.getpid()}")
        tmp_path.write_text(json.dumps(fresh_cache, sort_keys=True))
        tmp_path.replace(cache_path)
    canonical = json.dumps(hashes, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _copy_hashed(source: Path, destination: Path) -> dict:
    """Copy one file, hashing what was read; its manifest entry (sha256 and size)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(source, "rb") as reader, open(destination, "wb") as writer:
        while chunk := reader.read(CHUNK_BYTES):
            digest.update(chunk)
            writer.write(chunk)
    return {"sha256": digest.hexdigest(), "bytes": destination.stat().st_size}


def node_copy_dir(staging_dir: str, manifest: dict) -> Path:
    """Where a dataset lives in a staging directory: named by dataset name and id."""
    return Path(os.path.expandvars(staging_dir)).expanduser() / f"{manifest['name']}-{manifest['dataset_id']}"


def launch_id(environ=os.environ) -> str | None:
    """What the processes of one launch share, whatever their rank: torchrun's run id, or the Slurm job
    step; None where the launcher gives none."""
    if environ.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun-{environ['TORCHELASTIC_RUN_ID']}"
    if environ.get("SLURM_JOB_ID") and environ.get("SLURM_STEP_ID"):
        return f"slurm-{environ['SLURM_JOB_ID']}.{environ['SLURM_STEP_ID']}"
    return None


# A file modified this shortly before its metadata was read may change again within one tick of a coarse
# filesystem clock (1-2 s on some network filesystems) without its mtime moving (git's "racily clean" files):
# a verification of such files is not reused.
RACY_MARGIN_NS = 2_000_000_000


def _files_state(root: Path) -> tuple[str, int]:
    """(digest of the path, size, mtime and inode of every file under ``root``, newest mtime in ns)."""
    entries, newest = [], 0
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file() and p.name not in IGNORED_NAMES):
        stat = path.stat()
        entries.append([path.relative_to(root).as_posix(), stat.st_size, stat.st_mtime_ns, stat.st_ino])
        newest = max(newest, stat.st_mtime_ns)
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest(), newest


def _read_note(path: Path) -> dict:
    """The verification note at ``path`` ({} where there is none or it is unreadable: verify again)."""
    try:
        note = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return note if isinstance(note, dict) else {}


def _verified_in_run(note: dict, manifest: dict, run: str | None, files: str) -> bool:
    """Whether ``note`` says this dataset was hashed in ``run`` with its files' metadata still ``files``."""
    return (
        run is not None
        and note.get("run") == run
        and (note.get("dataset_id"), note.get("files"))
        == (
            manifest["dataset_id"],
            files,
        )
    )


def _write_note(path: Path, manifest: dict, launch: str | None, run: str | None, state: tuple[str, int], read_ns: int):
    """Record a verification (atomically); ``state`` = ``_files_state`` read at ``read_ns``, before hashing. A
    note that cannot be written costs the next trial a verification, nothing else."""
    files, newest = state
    reusable = newest < read_ns - RACY_MARGIN_NS
    note = {
        "dataset_id": manifest["dataset_id"],
        "launch": launch,
        "run": run if reusable else None,
        "files": files,
        "host": socket.gethostname(),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp_path.write_text(json.dumps(note, sort_keys=True) + "\n")
        tmp_path.replace(path)
    except OSError as error:
        print(f"note: the dataset's verification could not be noted in {path} ({error})", file=sys.stderr)


def in_place_note(dataset_dir: Path) -> Path:
    """Where this node notes its verification of ``dataset_dir`` in place (one file per host, beside it)."""
    dataset_dir = Path(dataset_dir)
    return dataset_dir.with_name(f"{dataset_dir.name}.verified") / f"{socket.gethostname()}.json"


def stage_to_node(
    dataset_dir: Path, manifest: dict, staging_dir: str | None, launch: str | None = None, run: str | None = None
) -> Path:
    """The directory a trial reads: a verified copy in ``staging_dir``, or ``dataset_dir`` verified in place.

    Processes of one node share the copy: the first to take the lock copies the manifest's files
    to a temporary sibling, verifies and renames it into place, or verifies the copy it finds (a
    copy corrupted since an earlier trial is reported, never used). The other processes of the same
    ``launch`` (``launch_id``) then find it verified for them and read it without hashing it again.
    With ``run`` (the campaign and run id), the files already hashed in that run on this node are not
    hashed again while their metadata is unchanged (the module's docstring says what that misses).
    """
    dataset_dir = Path(dataset_dir)
    if staging_dir is None:
        note_path = in_place_note(dataset_dir)
        read_ns = time.time_ns()
        state = _files_state(dataset_dir)
        if _verified_in_run(_read_note(note_path), manifest, run, state[0]):
            return dataset_dir
        verify(dataset_dir, manifest)
        if run is not None:
            _write_note(note_path, manifest, launch, run, state, read_ns)
        return dataset_dir
    target = node_copy_dir(staging_dir, manifest)
    target.parent.mkdir(parents=True, exist_ok=True)
    note_path = target.with_name(f"{target.name}.verified")
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        note = _read_note(note_path)
        if launch is not None and note.get("launch") == launch and note.get("dataset_id") == manifest["dataset_id"]:
            return target
        if target.is_dir():
            read_ns = time.time_ns()
            state = _files_state(target)
            if not _verified_in_run(note, manifest, run, state[0]):
                verify(target, manifest)
        else:
            _copy_verified(dataset_dir, manifest, target)
            read_ns = time.time_ns()
            state = _files_state(target)  # just written: too recent for a later trial to trust (RACY_MARGIN_NS)
        _write_note(note_path, manifest, launch, run, state, read_ns)
    return target


def _copy_verified(dataset_dir: Path, manifest: dict, target: Path) -> None:
    tmp_dir = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    try:
        for entry in manifest["files"]:
            source, destination = dataset_dir / entry["path"], tmp_dir / entry["path"]
            if not source.is_file():
                raise DatasetError(f"dataset '{manifest['name']}' ({manifest['dataset_id']}): missing file {source}")
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
        verify(tmp_dir, manifest)
        tmp_dir.rename(target)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
