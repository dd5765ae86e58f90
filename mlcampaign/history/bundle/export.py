"""Exporting a run as a bundle: from its run folder (with its MLPerf logs and dataset manifests) or from a
store. A bundle is written through a temporary file, so a bundle path never holds half a bundle.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import secrets
import tarfile
from pathlib import Path, PurePosixPath

from mlcampaign.history.bundle import limits
from mlcampaign.history.bundle.layout import (
    BUNDLE_FORMAT,
    BUNDLE_INFO,
    CHECKSUMS,
    DATASET_MANIFEST,
    MLLOG,
    RECORD,
    RUN_MANIFEST,
    SUPERSEDED,
    BundleError,
    json_member,
    parse_json,
    run_prefix,
    trial_directory,
)
from mlcampaign.history.bundle.members import check_datasets, datasets_named
from mlcampaign.history.bundle.run_directory import read_regular_file, read_run_directory
from mlcampaign.history.store import ResultsStore, check_run
from mlcampaign.records.files import content_sha256


def export_run_directory(run_dir: Path, bundle_path: Path, *, datasets_dir: Path | None = None) -> Path:
    """Write the run in ``run_dir`` as a bundle: run.json, every trial's records and MLPerf log, and
    the manifests of the datasets its records name (from ``datasets_dir``, by default the
    results directory's ``datasets/``). Refuses a run whose records fail the checks of ingest, and
    a file of the run that is a link or not a regular file."""
    run = read_run_directory(run_dir)
    check_run(run.manifest, run.records, manifest_source=str(run.path / RUN_MANIFEST))
    root = run.path.resolve()
    datasets_dir = Path(datasets_dir) if datasets_dir is not None else root.parents[2] / "datasets"
    prefix = run_prefix(run.manifest)
    payload = {f"{prefix}/{RUN_MANIFEST}": read_regular_file(root, PurePosixPath(RUN_MANIFEST))}
    for record_file in run.records:
        relative = Path(record_file.path).relative_to(run.path).as_posix()
        payload[f"{prefix}/{relative}"] = read_regular_file(root, PurePosixPath(relative))
    for mllog in sorted(root.glob(f"trials/*/*/*/*/{MLLOG}")):
        relative = mllog.relative_to(root).as_posix()
        payload[f"{prefix}/{relative}"] = read_regular_file(root, PurePosixPath(relative))
    named = datasets_named(run.records)
    manifests = {}
    for name in sorted(named):
        manifest_path = datasets_dir / name / DATASET_MANIFEST
        if not manifest_path.exists() and not manifest_path.is_symlink():
            raise BundleError(
                f"{manifest_path}: missing; the records of run '{run.manifest['run_id']}' name dataset '{name}'"
            )
        data = read_regular_file(datasets_dir, PurePosixPath(name, DATASET_MANIFEST))
        manifests[name] = (str(manifest_path), parse_json(data, str(manifest_path)))
        payload[f"datasets/{name}/{DATASET_MANIFEST}"] = data
    check_datasets(named, manifests, run.manifest["run_id"])
    return _write_bundle(bundle_path, run.manifest, payload, exported_from="run directory")


def export_store_run(store: ResultsStore, run_id: str, bundle_path: Path) -> Path:
    """Write a stored run as a bundle: its manifest and every record the store holds of it (a
    trial's current record as record.json, its earlier attempts under superseded/: the store's
    attempt order, mlcampaign.history.store). The store holds no MLPerf logs or dataset manifests,
    so the bundle has none."""
    manifest = store.manifest(run_id)
    prefix = run_prefix(manifest)
    payload = {f"{prefix}/{RUN_MANIFEST}": json_member(manifest)}
    by_trial: dict[str, list[dict]] = {}
    for record in store.records([run_id])[run_id]:
        by_trial.setdefault(trial_directory(record), []).append(record)
    for directory, records in by_trial.items():
        *earlier, current = records
        payload[f"{prefix}/{directory}/{RECORD}"] = json_member(current)
        for record in earlier:
            payload[f"{prefix}/{directory}/{SUPERSEDED}/{content_sha256(record)}.json"] = json_member(record)
    return _write_bundle(bundle_path, manifest, payload, exported_from="store")


def _write_bundle(bundle_path: Path, manifest: dict, payload: dict[str, bytes], *, exported_from: str) -> Path:
    info = {
        "bundle_format": BUNDLE_FORMAT,
        "run_id": manifest["run_id"],
        "campaign": manifest["campaign"],
        "site": manifest["site"],
        "exported_from": exported_from,
    }
    members = {BUNDLE_INFO: json_member(info), **dict(sorted(payload.items()))}
    for name, data in members.items():
        if len(data) > limits.MAX_MEMBER_BYTES:
            raise BundleError(
                f"{bundle_path}: member '{name}' would be {len(data)} bytes, over the limit of a bundle member "
                f"({limits.MAX_MEMBER_BYTES} bytes)"
            )
    # What a reader counts against MAX_BUNDLE_BYTES: each member's content in whole blocks, and its headers
    # (a pax header for a long name: at most three blocks).
    size = sum(
        3 * tarfile.BLOCKSIZE + -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE for data in members.values()
    )
    if len(members) + 1 > limits.MAX_MEMBERS or size > limits.MAX_BUNDLE_BYTES:
        raise BundleError(
            f"{bundle_path}: run '{manifest['run_id']}' would be a bundle of {len(members) + 1} members and about "
            f"{size} bytes, over the limits of a bundle ({limits.MAX_MEMBERS} members, {limits.MAX_BUNDLE_BYTES} bytes)"
        )
    checksums = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in members.items()).encode()
    bundle_path = Path(bundle_path)
    if bundle_path.is_dir():
        raise BundleError(
            f"{bundle_path}: a folder; name the bundle file to write (e.g. {bundle_path / manifest['run_id']}.tar.gz)"
        )
    if not bundle_path.parent.is_dir():
        raise BundleError(f"{bundle_path}: cannot be written: folder {str(bundle_path.parent)!r} does not exist")
    # A name no other process uses, created exclusively: removing it afterwards removes only what this wrote.
    partial = bundle_path.with_name(f".{bundle_path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(partial, "xb") as handle:
            # Fixed times and no file name in the gzip header: one run gives the same bytes each time.
            with (
                gzip.GzipFile(filename="", fileobj=handle, mode="wb", mtime=0) as stream,
                tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as archive,
            ):
                # The checksum list first, so that a reader that streams checks each member as it comes.
                for name, data in [(CHECKSUMS, checksums), *members.items()]:
                    entry = tarfile.TarInfo(name)
                    entry.size, entry.mode, entry.mtime = len(data), 0o644, 0
                    archive.addfile(entry, io.BytesIO(data))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, bundle_path)
    except OSError as error:
        raise BundleError(f"{bundle_path}: cannot be written ({error.strerror}); nothing was written") from None
    finally:
        partial.unlink(missing_ok=True)
    return bundle_path
