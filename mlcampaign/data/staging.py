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
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

import numpy as np

from mlcampaign.data.generators import GENERATORS
from mlcampaign.data.manifest import (
    CHUNK_BYTES,
    DatasetError,
    build_manifest,
    manifest_from_files,
    sha256_file,
    verify,
    write_manifest,
)
from mlcampaign.data.readers import FORMATS


def stage(dataset: dict, data_dir: Path, manifest_path: Path) -> dict:
    """Stage ``dataset`` (a benchmark config's ``dataset`` block) into ``data_dir``; return its manifest."""
    data_dir, manifest_path = Path(data_dir), Path(manifest_path)
    source = dataset["source"]
    tmp_dir = data_dir.with_name(data_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    started = time.perf_counter()
    if "generator" in source:
        generator = GENERATORS[source["generator"]]
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
    data_format = FORMATS[dataset["format"]]
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


def stage_to_node(dataset_dir: Path, manifest: dict, staging_dir: str | None) -> Path:
    """The directory a trial reads: a verified copy in ``staging_dir``, or ``dataset_dir`` verified in place.

    Processes of one node share the copy: the first to take the lock copies the manifest's files
    to a temporary sibling, verifies and renames it into place; later ones (and later trials)
    find it and verify it again, so a copy corrupted since is reported, never used.
    """
    dataset_dir = Path(dataset_dir)
    if staging_dir is None:
        verify(dataset_dir, manifest)
        return dataset_dir
    target = node_copy_dir(staging_dir, manifest)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir():
            verify(target, manifest)
        else:
            _copy_verified(dataset_dir, manifest, target)
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
