"""Run bundles: one file that carries a run's results from one site (or store) to another.

    from mlcampaign.history import bundle

    bundle.export_run_directory(Path("results/epcc-2024/runs/2026w48"), Path("2026w48.tar.gz"))
    bundle.export_store_run(store, "2026w48", Path("2026w48.tar.gz"))
    bundle.import_into_store(Path("2026w48.tar.gz"), store)          # -> store.IngestResult
    bundle.import_into_results(Path("2026w48.tar.gz"), Path("results"))   # -> [paths written]
    bundle.read_bundle(Path("2026w48.tar.gz"))                       # -> Bundle, every checksum verified
    bundle.read_run_directory(Path("results/epcc-2024/runs/2026w48"))    # -> RunDirectory (for ingest)

A bundle is a gzip-compressed tar archive whose members mirror the results directory:

    SHA256SUMS                                  sha256 of every other member (`sha256sum -c` format)
    bundle.json                                 {"bundle_format": 1, "run_id", "campaign", "site", "exported_from"}
    <campaign>/runs/<run_id>/run.json           the run manifest
    <campaign>/runs/<run_id>/trials/<system>/<benchmark>/<cell>/trial<k>-rep<r>/
        record.json                             the trial's current record (its latest)
        superseded/<content sha256>.json        its earlier records (a store keeps them; see below)
        mllog.txt                               its MLPerf log (run-directory exports: a store keeps no logs)
    datasets/<name>/manifest.json               the manifest of each dataset the records name (run directories)

Reading a bundle checks everything before anything is used: the gzip stream to its end (so a file
cut at any byte is refused), every member against SHA256SUMS (none missing, none unlisted, no other
content), the member layout, and the records (record schema, run). Every error is a BundleError (or
the store's ManifestError / RecordError) naming the bundle and the member; nothing is written then.
Writing a bundle goes through a temporary file, so a bundle path never holds half a bundle.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from mlcampaign.history.store import IngestResult, RecordFile, ResultsStore, check_run
from mlcampaign.records.files import content_sha256

BUNDLE_FORMAT = 1
CHECKSUMS = "SHA256SUMS"
BUNDLE_INFO = "bundle.json"
RUN_MANIFEST = "run.json"
RECORD = "record.json"
MLLOG = "mllog.txt"
SUPERSEDED = "superseded"
DATASET_MANIFEST = "manifest.json"
_CHECKSUM_LINE = re.compile(r"([0-9a-f]{64})  (.+)")
_SHA256_NAME = re.compile(r"[0-9a-f]{64}\.json")


class BundleError(RuntimeError):
    """A bundle (or run directory) is damaged, incomplete or conflicts with what is there already."""


@dataclasses.dataclass(frozen=True)
class RunDirectory:
    """A run's files in a results directory, read and parsed."""

    path: Path
    manifest: dict
    records: list[RecordFile]  # record.json of every trial, then superseded records


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A bundle's verified content."""

    path: Path
    info: dict  # bundle.json
    manifest: dict
    records: list[RecordFile]  # paths are "<bundle>:<member>"
    payload: dict[str, bytes]  # every member but SHA256SUMS and bundle.json: results-directory path -> bytes

    @property
    def run_prefix(self) -> str:
        return run_prefix(self.manifest)


def run_prefix(manifest: dict) -> str:
    """Where a run's files are, relative to the results directory: ``<campaign>/runs/<run_id>``."""
    return f"{manifest['campaign']}/runs/{manifest['run_id']}"


def trial_directory(record: dict) -> str:
    """A record's trial directory under its run's: ``trials/<system>/<benchmark>/<cell>/trial<k>-rep<r>``
    (the workflow's trial rule writes there)."""
    trial = record["trial"]
    cell = f"{trial['system']}/{trial['benchmark']}/{trial['cell']}"
    return f"trials/{cell}/trial{trial['trial']}-rep{trial['replicate']}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json_member(document: dict) -> bytes:
    """A JSON member as the workflow writes JSON files (mlcampaign.records.files.write_json_atomic)."""
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def _read_json(path: Path) -> dict:
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise BundleError(f"{path}: cannot be read as JSON: {error}") from None
    if not isinstance(document, dict):
        raise BundleError(f"{path}: not a JSON object")
    return document


def read_run_directory(run_dir: Path) -> RunDirectory:
    """The manifest and records of the run in ``run_dir`` (``results/<campaign>/runs/<run_id>``)."""
    run_dir = Path(run_dir)
    manifest_path = run_dir / RUN_MANIFEST
    if not manifest_path.is_file():
        raise BundleError(f"{run_dir}: not a run directory (no {RUN_MANIFEST})")
    manifest = _read_json(manifest_path)
    if manifest.get("run_id") != run_dir.name:
        raise BundleError(f"{manifest_path}: run_id {manifest.get('run_id')!r} is not the directory's name")
    current = sorted(run_dir.glob(f"trials/*/*/*/*/{RECORD}"))
    paths = current + sorted(run_dir.glob(f"trials/*/*/*/*/{SUPERSEDED}/*.json"))
    records = [RecordFile(str(path), _read_json(path)) for path in paths]
    return RunDirectory(run_dir, manifest, records)


def export_run_directory(run_dir: Path, bundle_path: Path, *, datasets_dir: Path | None = None) -> Path:
    """Write the run in ``run_dir`` as a bundle: run.json, every trial's records and MLPerf log, and
    the manifests of the datasets its records name (from ``datasets_dir``, by default the
    results directory's ``datasets/``). Refuses a run whose records fail the checks of ingest."""
    run = read_run_directory(run_dir)
    check_run(run.manifest, run.records, manifest_source=str(run.path / RUN_MANIFEST))
    datasets_dir = Path(datasets_dir) if datasets_dir is not None else run.path.absolute().parents[2] / "datasets"
    prefix = run_prefix(run.manifest)
    payload = {f"{prefix}/{RUN_MANIFEST}": (run.path / RUN_MANIFEST).read_bytes()}
    for record_file in run.records:
        path = Path(record_file.path)
        payload[f"{prefix}/{path.relative_to(run.path).as_posix()}"] = path.read_bytes()
    for mllog in sorted(run.path.glob(f"trials/*/*/*/*/{MLLOG}")):
        payload[f"{prefix}/{mllog.relative_to(run.path).as_posix()}"] = mllog.read_bytes()
    for name, dataset_id in sorted(_datasets_named(run.records).items()):
        manifest_path = datasets_dir / name / DATASET_MANIFEST
        if not manifest_path.is_file():
            raise BundleError(
                f"{manifest_path}: missing; the records of run '{run.manifest['run_id']}' name dataset '{name}'"
            )
        found = _read_json(manifest_path).get("dataset_id")
        if found != dataset_id:
            raise BundleError(
                f"{manifest_path}: dataset id {found!r}, but the records of run '{run.manifest['run_id']}' "
                f"name '{name}' with id {dataset_id!r} (the dataset changed since the run)"
            )
        payload[f"datasets/{name}/{DATASET_MANIFEST}"] = manifest_path.read_bytes()
    return _write_bundle(bundle_path, run.manifest, payload, exported_from="run directory")


def _datasets_named(records: list[RecordFile]) -> dict[str, str]:
    """Dataset name -> id named by the records; BundleError if one name comes with two ids."""
    named: dict[str, tuple[str, str]] = {}
    for record_file in records:
        dataset = record_file.record["dataset"]
        seen = named.setdefault(dataset["name"], (dataset["dataset_id"], record_file.path))
        if seen[0] != dataset["dataset_id"]:
            raise BundleError(
                f"{record_file.path}: dataset '{dataset['name']}' has id {dataset['dataset_id']!r}, "
                f"but {seen[1]} names id {seen[0]!r}: one manifest cannot serve both"
            )
    return {name: dataset_id for name, (dataset_id, _) in named.items()}


def export_store_run(store: ResultsStore, run_id: str, bundle_path: Path) -> Path:
    """Write a stored run as a bundle: its manifest and every record the store holds of it (a
    trial's current record as record.json, its earlier attempts under superseded/: the store's
    attempt order, mlcampaign.history.store). The store holds no MLPerf logs or dataset manifests,
    so the bundle has none."""
    manifest = store.manifest(run_id)
    prefix = run_prefix(manifest)
    payload = {f"{prefix}/{RUN_MANIFEST}": _json_member(manifest)}
    by_trial: dict[str, list[dict]] = {}
    for record in store.records([run_id])[run_id]:
        by_trial.setdefault(trial_directory(record), []).append(record)
    for directory, records in by_trial.items():
        *earlier, current = records
        payload[f"{prefix}/{directory}/{RECORD}"] = _json_member(current)
        for record in earlier:
            payload[f"{prefix}/{directory}/{SUPERSEDED}/{content_sha256(record)}.json"] = _json_member(record)
    return _write_bundle(bundle_path, manifest, payload, exported_from="store")


def _write_bundle(bundle_path: Path, manifest: dict, payload: dict[str, bytes], *, exported_from: str) -> Path:
    info = {
        "bundle_format": BUNDLE_FORMAT,
        "run_id": manifest["run_id"],
        "campaign": manifest["campaign"],
        "site": manifest["site"],
        "exported_from": exported_from,
    }
    members = {BUNDLE_INFO: _json_member(info), **dict(sorted(payload.items()))}
    checksums = "".join(f"{_sha256(data)}  {name}\n" for name, data in members.items()).encode()
    bundle_path = Path(bundle_path)
    partial = bundle_path.with_name(f".{bundle_path.name}.{os.getpid()}.tmp")
    try:
        with open(partial, "wb") as handle:
            # Fixed times and no file name in the gzip header: one run gives the same bytes each time.
            with (
                gzip.GzipFile(filename="", fileobj=handle, mode="wb", mtime=0) as stream,
                tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as archive,
            ):
                # The checksum list first, so that a reader that streams could check each member as it comes.
                for name, data in [(CHECKSUMS, checksums), *members.items()]:
                    entry = tarfile.TarInfo(name)
                    entry.size, entry.mode, entry.mtime = len(data), 0o644, 0
                    archive.addfile(entry, io.BytesIO(data))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, bundle_path)
    finally:
        partial.unlink(missing_ok=True)
    return bundle_path


def _read_members(bundle_path: Path) -> dict[str, bytes]:
    """Every member of a bundle, read to the end of its gzip stream; BundleError naming the member
    where it is damaged or ends early."""
    try:
        with open(bundle_path, "rb") as handle:
            return _read_archive(handle, bundle_path)
    except OSError as error:  # opening the file (_read_archive reports what goes wrong inside it)
        raise BundleError(f"{bundle_path}: cannot be read: {error}") from None


def _read_archive(handle: BinaryIO, bundle_path: Path) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    reading = None  # the member whose content is being read, None between members
    try:
        with gzip.GzipFile(fileobj=handle, mode="rb") as stream:
            with tarfile.open(fileobj=stream, mode="r:") as archive:
                for entry in archive:
                    name = entry.name
                    if not entry.isfile():
                        raise BundleError(f"{bundle_path}: member '{name}' is not a regular file")
                    if name in members:
                        raise BundleError(f"{bundle_path}: member '{name}' appears twice")
                    reading = name
                    data = archive.extractfile(entry).read()
                    if len(data) != entry.size:
                        raise tarfile.ReadError(f"{len(data)} of {entry.size} bytes")
                    members[name], reading = data, None
            # tar stops at its end-of-archive blocks; the rest of the stream (padding and gzip's
            # length and CRC trailer) shows whether the file was cut after the last member.
            stream.read()
    except (EOFError, OSError, tarfile.TarError, zlib.error) as error:
        if reading is not None:
            where = f"in member '{reading}'"
        elif members:
            where = f"after member '{list(members)[-1]}'"
        else:
            where = "before its first member"
        raise BundleError(f"{bundle_path}: truncated or damaged {where} ({error})") from None
    return members


def _verify_checksums(bundle_path: Path, members: dict[str, bytes]) -> None:
    if CHECKSUMS not in members:
        raise BundleError(f"{bundle_path}: member '{CHECKSUMS}' is missing: not a bundle, or damaged")
    listed = {}
    for number, line in enumerate(members[CHECKSUMS].decode(errors="replace").splitlines(), start=1):
        match = _CHECKSUM_LINE.fullmatch(line)
        if match is None:
            raise BundleError(
                f"{bundle_path}: member '{CHECKSUMS}' line {number} is not '<sha256>  <member>': {line!r}"
            )
        listed[match.group(2)] = match.group(1)
    for name, digest in listed.items():
        if name not in members:
            raise BundleError(f"{bundle_path}: member '{name}' is listed in {CHECKSUMS} but missing from the bundle")
        if _sha256(members[name]) != digest:
            raise BundleError(
                f"{bundle_path}: member '{name}' has sha256 {_sha256(members[name])}, {CHECKSUMS} lists {digest}"
            )
    unlisted = [name for name in members if name != CHECKSUMS and name not in listed]
    if unlisted:
        raise BundleError(f"{bundle_path}: member '{unlisted[0]}' is not listed in {CHECKSUMS}")


def _check_member_name(bundle_path: Path, name: str) -> None:
    """A member name must be a plain relative path, so that unpacking it stays in the results directory."""
    if any(part in ("", ".", "..") for part in name.split("/")) or "\\" in name:
        raise BundleError(f"{bundle_path}: member '{name}' is not a plain relative path")


def read_bundle(bundle_path: Path) -> Bundle:
    """A bundle's content after verifying it whole (see the module docstring); BundleError otherwise."""
    bundle_path = Path(bundle_path)
    members = _read_members(bundle_path)
    _verify_checksums(bundle_path, members)
    for name in members:
        _check_member_name(bundle_path, name)

    def parsed(name: str) -> dict:
        try:
            document = json.loads(members[name])
        except ValueError as error:
            raise BundleError(f"{bundle_path}: member '{name}' is not JSON: {error}") from None
        if not isinstance(document, dict):
            raise BundleError(f"{bundle_path}: member '{name}' is not a JSON object")
        return document

    if BUNDLE_INFO not in members:
        raise BundleError(f"{bundle_path}: member '{BUNDLE_INFO}' is missing")
    info = parsed(BUNDLE_INFO)
    if info.get("bundle_format") != BUNDLE_FORMAT:
        raise BundleError(
            f"{bundle_path}: member '{BUNDLE_INFO}': bundle_format {info.get('bundle_format')!r}; this "
            f"mlcampaign reads format {BUNDLE_FORMAT}"
        )
    manifest_name = f"{info.get('campaign')}/runs/{info.get('run_id')}/{RUN_MANIFEST}"
    if manifest_name not in members:
        raise BundleError(f"{bundle_path}: member '{manifest_name}' (the run manifest bundle.json names) is missing")
    manifest = parsed(manifest_name)
    for key in ("run_id", "campaign", "site"):
        if manifest.get(key) != info.get(key):
            raise BundleError(
                f"{bundle_path}: member '{manifest_name}': {key} {manifest.get(key)!r}, "
                f"but {BUNDLE_INFO} says {info.get(key)!r}"
            )
    prefix = run_prefix(manifest)
    records = []
    for name in members:
        role = _member_role(name, prefix)
        if role is None:
            raise BundleError(f"{bundle_path}: member '{name}' is not part of a bundle of run '{manifest['run_id']}'")
        if role == "record":
            record = parsed(name)
            _check_record_place(bundle_path, name, record, prefix)
            records.append(RecordFile(f"{bundle_path}:{name}", record))
    check_run(manifest, records, manifest_source=f"{bundle_path}:{manifest_name}")
    payload = {name: data for name, data in members.items() if name not in (CHECKSUMS, BUNDLE_INFO)}
    return Bundle(bundle_path, info, manifest, records, payload)


def _member_role(name: str, prefix: str) -> str | None:
    """A member's role by its path: "record", "file" (any other member a bundle has), or None (no bundle has it)."""
    parts = name.split("/")
    if name in (CHECKSUMS, BUNDLE_INFO, f"{prefix}/{RUN_MANIFEST}"):
        return "file"
    if len(parts) == 3 and parts[0] == "datasets" and parts[2] == DATASET_MANIFEST:
        return "file"
    if not name.startswith(f"{prefix}/trials/"):
        return None
    in_trial = parts[len(prefix.split("/")) + 5 :]  # after trials/<system>/<benchmark>/<cell>/trial<k>-rep<r>/
    if in_trial == [RECORD]:
        return "record"
    if len(in_trial) == 2 and in_trial[0] == SUPERSEDED and _SHA256_NAME.fullmatch(in_trial[1]):
        return "record"
    return "file" if in_trial == [MLLOG] else None


def _check_record_place(bundle_path: Path, name: str, record: dict, prefix: str) -> None:
    """A record member lies in its own trial's directory, and a superseded one is named by its content."""
    try:
        directory = f"{prefix}/{trial_directory(record)}/"
    except (KeyError, TypeError):
        directory = None  # no trial block: the record schema check names the problem
    if directory is not None and not name.startswith(directory):
        raise BundleError(f"{bundle_path}: member '{name}' is not in its record's trial directory '{directory}'")
    superseded = PurePosixPath(name)
    if superseded.parent.name == SUPERSEDED and superseded.stem != content_sha256(record):
        raise BundleError(
            f"{bundle_path}: member '{name}' is not named by its content (sha256 {content_sha256(record)})"
        )


def import_into_store(bundle_path: Path, store: ResultsStore) -> IngestResult:
    """Ingest a bundle's run into ``store``, after verifying the whole bundle."""
    bundle = read_bundle(bundle_path)
    return store.ingest(
        bundle.manifest, bundle.records, manifest_source=f"{bundle.path}:{bundle.run_prefix}/{RUN_MANIFEST}"
    )


def import_into_results(bundle_path: Path, results_dir: Path) -> list[Path]:
    """Unpack a bundle's run into ``results_dir`` (its run directory, and datasets/<name>/manifest.json),
    so that the workflow can analyse it there. A file already there with the same content is left
    as it is; one with other content is refused (before anything is written). Returns the files written."""
    bundle = read_bundle(bundle_path)
    results_dir = Path(results_dir)
    pending = {}
    for name, data in bundle.payload.items():
        target = results_dir / name
        if target.is_symlink() or target.exists():
            if not target.is_file() or target.read_bytes() != data:
                raise BundleError(
                    f"{bundle.path}: member '{name}' differs from {target}, which is there already; "
                    "nothing was written (move that file away to import this bundle)"
                )
            continue
        pending[target] = data
    for target, data in pending.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        partial.write_bytes(data)
        os.replace(partial, target)
    return list(pending)
