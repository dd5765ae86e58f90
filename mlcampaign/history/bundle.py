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

Reading a bundle streams it once, checking as it goes, before anything is used: SHA256SUMS and
bundle.json first, then each member's path (a plain relative path of this layout, of the run
bundle.json names), type (regular files only), size (MAX_MEMBER_BYTES, and MAX_BUNDLE_BYTES in all)
and sha256 while it is read; then nothing missing, the gzip stream ending with the archive (a file cut
at any byte, or with content after the archive's end, is refused), the records (record schema, run,
campaign, each in its own trial's directory) and the dataset manifests (each named by the records,
with the id they name). Every error is a BundleError (or the store's ManifestError / RecordError) naming
the bundle and the member; nothing is written then. Memory holds the JSON members only: an import into a
results directory unpacks into a temporary folder there, moved into place once all is verified.

A run folder is read without following links: its files must be regular files inside it (a link is
refused, naming it), so that nothing from elsewhere travels in a bundle. Writing a bundle goes through a
temporary file, so a bundle path never holds half a bundle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import filecmp
import gzip
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import stat
import tarfile
import tempfile
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
# Limits of what a bundle may hold (docs/history.md): what reading one costs is bounded by them, whatever
# the file says. A member is at most MAX_MEMBER_BYTES (an MLPerf log of a long training is a few MB; a
# run's manifest with 10 000 planned trials, about 10 MB); the archive, decompressed, at most
# MAX_BUNDLE_BYTES (with its tar headers); tar headers between two members (long names) at most
# MAX_HEADER_BYTES; members at most MAX_MEMBERS (a 30 000-trial run, with its logs and earlier records).
# Exports keep to the same limits, so that every bundle written can be read.
MAX_MEMBER_BYTES = 64 * 2**20
MAX_BUNDLE_BYTES = 2**30
MAX_HEADER_BYTES = 2**20
MAX_MEMBERS = 100_000
_READ_CHUNK_BYTES = 2**20
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
    members: tuple[str, ...]  # every member but SHA256SUMS and bundle.json: results-directory paths, in order

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


def _json_member(document: dict) -> bytes:
    """A JSON member as the workflow writes JSON files (mlcampaign.records.files.write_json_atomic)."""
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def _parse_json(data: bytes, where: str) -> dict:
    """A JSON object from a file or member; BundleError naming ``where`` for anything else."""
    try:
        document = json.loads(data)
    except ValueError as error:
        raise BundleError(f"{where} is not JSON: {error}") from None
    except RecursionError:
        raise BundleError(f"{where} is not JSON this reader takes: nested too deeply") from None
    if not isinstance(document, dict):
        raise BundleError(f"{where} is not a JSON object")
    return document


# Reading a run folder: regular files inside it only.


def _read_regular_file(root: Path, relative: PurePosixPath) -> bytes:
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
        if status.st_size > MAX_MEMBER_BYTES:
            raise BundleError(
                f"{path}: {status.st_size} bytes, over the limit of a bundle member ({MAX_MEMBER_BYTES} bytes)"
            )
        with open(descriptor, "rb", closefd=False) as handle:
            data = handle.read(MAX_MEMBER_BYTES + 1)  # a file growing meanwhile is read no further
        if len(data) > MAX_MEMBER_BYTES:
            raise BundleError(f"{path}: over the limit of a bundle member ({MAX_MEMBER_BYTES} bytes)")
        return data
    finally:
        os.close(descriptor)


def _check_record_place(where: str, name: str, record: dict, prefix: str) -> None:
    """A record file lies in its own trial's directory (``name``: its path relative to the directory of
    ``prefix``, the run's), and a superseded one is named by its content."""
    try:
        directory = f"{prefix}{trial_directory(record)}/"
    except (KeyError, TypeError):
        directory = None  # no trial block: the record schema check names the problem
    if directory is not None and not name.startswith(directory):
        raise BundleError(f"{where} is not in its record's trial directory '{directory}'")
    superseded = PurePosixPath(name)
    if superseded.parent.name == SUPERSEDED and superseded.stem != content_sha256(record):
        raise BundleError(f"{where} is not named by its content (sha256 {content_sha256(record)})")


def read_run_directory(run_dir: Path) -> RunDirectory:
    """The manifest and records of the run in ``run_dir`` (``results/<campaign>/runs/<run_id>``, or a
    link to one such as ``results/<campaign>/latest``), each record in its own trial's directory."""
    run_dir = Path(run_dir)
    root = run_dir.resolve()
    if not (root / RUN_MANIFEST).is_file():
        raise BundleError(f"{run_dir}: not a run directory (no {RUN_MANIFEST})")
    manifest = _parse_json(_read_regular_file(root, PurePosixPath(RUN_MANIFEST)), str(run_dir / RUN_MANIFEST))
    if manifest.get("run_id") != root.name:
        raise BundleError(
            f"{run_dir / RUN_MANIFEST}: run_id {manifest.get('run_id')!r} is not the directory's name {root.name!r}"
        )
    current = sorted(root.glob(f"trials/*/*/*/*/{RECORD}"))
    records = []
    for path in current + sorted(root.glob(f"trials/*/*/*/*/{SUPERSEDED}/*.json")):
        relative = PurePosixPath(path.relative_to(root).as_posix())
        shown = run_dir / relative
        record = _parse_json(_read_regular_file(root, relative), str(shown))
        _check_record_place(str(shown), relative.as_posix(), record, "")
        records.append(RecordFile(str(shown), record))
    return RunDirectory(run_dir, manifest, records)


def _check_datasets(named: dict[str, str], manifests: dict[str, tuple[str, dict]], run_id: str) -> None:
    """Each dataset manifest (name -> (where it is, its content)) is of a dataset the run's records name
    (``named``: name -> id), with the id they name."""
    for name, (where, manifest) in manifests.items():
        if name not in named:
            raise BundleError(f"{where}: dataset '{name}' is not named by any record of run '{run_id}'")
        if manifest.get("dataset_id") != named[name]:
            raise BundleError(
                f"{where}: dataset id {manifest.get('dataset_id')!r}, but the records of run '{run_id}' name "
                f"'{name}' with id {named[name]!r} (the dataset changed since the run)"
            )


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
    payload = {f"{prefix}/{RUN_MANIFEST}": _read_regular_file(root, PurePosixPath(RUN_MANIFEST))}
    for record_file in run.records:
        relative = Path(record_file.path).relative_to(run.path).as_posix()
        payload[f"{prefix}/{relative}"] = _read_regular_file(root, PurePosixPath(relative))
    for mllog in sorted(root.glob(f"trials/*/*/*/*/{MLLOG}")):
        relative = mllog.relative_to(root).as_posix()
        payload[f"{prefix}/{relative}"] = _read_regular_file(root, PurePosixPath(relative))
    named = _datasets_named(run.records)
    manifests = {}
    for name in sorted(named):
        manifest_path = datasets_dir / name / DATASET_MANIFEST
        if not manifest_path.exists() and not manifest_path.is_symlink():
            raise BundleError(
                f"{manifest_path}: missing; the records of run '{run.manifest['run_id']}' name dataset '{name}'"
            )
        data = _read_regular_file(datasets_dir, PurePosixPath(name, DATASET_MANIFEST))
        manifests[name] = (str(manifest_path), _parse_json(data, str(manifest_path)))
        payload[f"datasets/{name}/{DATASET_MANIFEST}"] = data
    _check_datasets(named, manifests, run.manifest["run_id"])
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
    for name, data in members.items():
        if len(data) > MAX_MEMBER_BYTES:
            raise BundleError(
                f"{bundle_path}: member '{name}' would be {len(data)} bytes, over the limit of a bundle member "
                f"({MAX_MEMBER_BYTES} bytes)"
            )
    # What a reader counts against MAX_BUNDLE_BYTES: each member's content in whole blocks, and its headers
    # (a pax header for a long name: at most three blocks).
    size = sum(
        3 * tarfile.BLOCKSIZE + -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE for data in members.values()
    )
    if len(members) + 1 > MAX_MEMBERS or size > MAX_BUNDLE_BYTES:
        raise BundleError(
            f"{bundle_path}: run '{manifest['run_id']}' would be a bundle of {len(members) + 1} members and about "
            f"{size} bytes, over the limits of a bundle ({MAX_MEMBERS} members, {MAX_BUNDLE_BYTES} bytes)"
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


# Reading a bundle.


class _ArchiveStream:
    """The decompressed archive as tarfile reads it, counted: the member content being read (``reading``)
    against MAX_MEMBER_BYTES, everything against MAX_BUNDLE_BYTES, and what tarfile reads between two
    members (headers, long names) against MAX_HEADER_BYTES, so that no header makes it read on unbounded."""

    def __init__(self, stream: BinaryIO, bundle_path: Path) -> None:
        self._stream = stream
        self._bundle_path = bundle_path
        self.total = 0
        self.between_members = 0
        self.reading: str | None = None
        self.last: str | None = None  # the member read last

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.total += len(data)
        if self.total > MAX_BUNDLE_BYTES:
            raise BundleError(
                f"{self._bundle_path}: over {MAX_BUNDLE_BYTES} bytes decompressed, the limit of a bundle "
                f"({self.where()})"
            )
        if self.reading is None:
            self.between_members += len(data)
            if self.between_members > MAX_HEADER_BYTES:
                raise BundleError(
                    f"{self._bundle_path}: over {MAX_HEADER_BYTES} bytes of tar headers {self.where()}: "
                    "not a bundle, or damaged"
                )
        return data

    def where(self) -> str:
        if self.reading is not None:
            return f"in member '{self.reading}'"
        return f"after member '{self.last}'" if self.last else "before its first member"


@dataclasses.dataclass
class _Unpacked:
    """What streaming a bundle found: its checksum list, its JSON members, every member's name."""

    listed: dict[str, str] = dataclasses.field(default_factory=dict)  # member -> sha256, from SHA256SUMS
    documents: dict[str, bytes] = dataclasses.field(default_factory=dict)  # the JSON members
    names: dict[str, None] = dataclasses.field(default_factory=dict)  # every member read, in order
    info: dict | None = None
    prefix: str | None = None


def _member_role(name: str, prefix: str) -> str | None:
    """A member's role by its path: "record", "json" (run.json, a dataset manifest), "file" (an MLPerf
    log), or None (no bundle of the run has it)."""
    parts = name.split("/")
    if name == f"{prefix}/{RUN_MANIFEST}":
        return "json"
    if len(parts) == 3 and parts[0] == "datasets" and parts[2] == DATASET_MANIFEST:
        return "json"
    if not name.startswith(f"{prefix}/trials/"):
        return None
    in_trial = parts[len(prefix.split("/")) + 5 :]  # after trials/<system>/<benchmark>/<cell>/trial<k>-rep<r>/
    if in_trial == [RECORD]:
        return "record"
    if len(in_trial) == 2 and in_trial[0] == SUPERSEDED and _SHA256_NAME.fullmatch(in_trial[1]):
        return "record"
    return "file" if in_trial == [MLLOG] else None


def _check_member(bundle_path: Path, entry: tarfile.TarInfo, found: _Unpacked) -> str | None:
    """Check a member before its content is read: its name, type, size and place in the bundle. Its
    role (_member_role; None for SHA256SUMS and bundle.json)."""
    name = entry.name
    if any(part in ("", ".", "..") for part in name.split("/")) or "\\" in name:
        raise BundleError(f"{bundle_path}: member '{name}' is not a plain relative path")
    if not entry.isfile() or entry.issparse():
        raise BundleError(f"{bundle_path}: member '{name}' is not a regular file")
    if name in found.names:
        raise BundleError(f"{bundle_path}: member '{name}' appears twice")
    if len(found.names) >= MAX_MEMBERS:
        raise BundleError(f"{bundle_path}: more than {MAX_MEMBERS} members, the limit of a bundle")
    if entry.size > MAX_MEMBER_BYTES:
        raise BundleError(
            f"{bundle_path}: member '{name}' is {entry.size} bytes, over the limit of a bundle member "
            f"({MAX_MEMBER_BYTES} bytes)"
        )
    expected = [CHECKSUMS, BUNDLE_INFO][len(found.names)] if len(found.names) < 2 else None
    if expected is not None and name != expected:
        if name == CHECKSUMS or CHECKSUMS not in found.names:
            raise BundleError(f"{bundle_path}: member '{CHECKSUMS}' is not first: not a bundle, or damaged")
        raise BundleError(f"{bundle_path}: member '{BUNDLE_INFO}' is missing (it comes after {CHECKSUMS})")
    if name != CHECKSUMS and name not in found.listed:
        raise BundleError(f"{bundle_path}: member '{name}' is not listed in {CHECKSUMS}")
    if expected is not None:
        return None
    role = _member_role(name, found.prefix)
    if role is None:
        raise BundleError(f"{bundle_path}: member '{name}' is not part of a bundle of run '{found.info.get('run_id')}'")
    return role


def _parse_checksums(bundle_path: Path, data: bytes) -> dict[str, str]:
    listed = {}
    for number, line in enumerate(data.decode(errors="replace").splitlines(), start=1):
        match = _CHECKSUM_LINE.fullmatch(line)
        if match is None:
            raise BundleError(
                f"{bundle_path}: member '{CHECKSUMS}' line {number} is not '<sha256>  <member>': {line!r}"
            )
        listed[match.group(2)] = match.group(1)
    return listed


def _parse_info(bundle_path: Path, data: bytes) -> dict:
    info = _parse_json(data, f"{bundle_path}: member '{BUNDLE_INFO}'")
    if info.get("bundle_format") != BUNDLE_FORMAT:
        raise BundleError(
            f"{bundle_path}: member '{BUNDLE_INFO}': bundle_format {info.get('bundle_format')!r}; this "
            f"mlcampaign reads format {BUNDLE_FORMAT}"
        )
    for key in ("run_id", "campaign"):
        if not isinstance(info.get(key), str) or "/" in info[key] or info[key] in ("", ".", ".."):
            raise BundleError(f"{bundle_path}: member '{BUNDLE_INFO}': {key} {info.get(key)!r} is not a name")
    return info


def _stream_archive(handle: BinaryIO, bundle_path: Path, unpack_dir: Path | None) -> _Unpacked:
    """Read the archive once, checking each member as it comes (_check_member) and its sha256 as it is
    read; keep the JSON members, and write every member under ``unpack_dir`` when given."""
    found = _Unpacked()
    counted = None
    try:
        with gzip.GzipFile(fileobj=handle, mode="rb") as stream:
            counted = _ArchiveStream(stream, bundle_path)
            with tarfile.open(fileobj=counted, mode="r|") as archive:
                for entry in archive:
                    role = _check_member(bundle_path, entry, found)
                    counted.reading, counted.between_members = entry.name, 0
                    unpacked = unpack_dir / entry.name if unpack_dir is not None and role is not None else None
                    digest, data = _read_member(bundle_path, archive, entry, keep=role != "file", unpacked=unpacked)
                    counted.reading, counted.last = None, entry.name
                    found.names[entry.name] = None
                    _take_member(bundle_path, entry.name, role, digest, data, found)
            # tar stops at its end-of-archive blocks: what follows in the stream may be the rest of its last
            # record (zeros), then gzip's length and CRC trailer, which shows whether the file was cut.
            rest = stream.read(tarfile.RECORDSIZE + 1)
            if len(rest) > tarfile.RECORDSIZE or rest.strip(b"\0"):
                raise BundleError(f"{bundle_path}: content after the end of its tar archive: not a bundle, or damaged")
    except (EOFError, OSError, tarfile.TarError, zlib.error) as error:
        where = counted.where() if counted is not None else "before its first member"
        raise BundleError(f"{bundle_path}: truncated or damaged {where} ({error})") from None
    return found


class _UnpackedFile:
    """A member's file in the unpacking folder, written unbuffered (a full disk fails the write, not a later
    flush); a failure to write it is a BundleError naming the member and the file."""

    def __init__(self, bundle_path: Path, name: str, path: Path) -> None:
        self._where = f"{bundle_path}: member '{name}' cannot be unpacked into {path}"
        self._path = path

    def __enter__(self) -> _UnpackedFile:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self._path, "xb", buffering=0)
        except OSError as error:
            raise BundleError(f"{self._where}: {error}") from None
        return self

    def write(self, data: bytes) -> None:
        remaining = memoryview(data)
        try:
            while remaining:  # a write may take part of the data (the disk filling up): the next one fails
                remaining = remaining[self._file.write(remaining) :]
        except OSError as error:
            raise BundleError(f"{self._where}: {error}") from None

    def __exit__(self, *exc_info) -> None:
        self._file.close()


def _read_member(
    bundle_path: Path, archive: tarfile.TarFile, entry: tarfile.TarInfo, *, keep: bool, unpacked: Path | None
) -> tuple[str, bytes]:
    """A member's sha256, and its content if ``keep``; written to ``unpacked`` as it is read, if given."""
    digest = hashlib.sha256()
    chunks, size = [], 0
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(_UnpackedFile(bundle_path, entry.name, unpacked)) if unpacked else None
        content = archive.extractfile(entry)
        while chunk := content.read(_READ_CHUNK_BYTES):
            size += len(chunk)
            digest.update(chunk)
            if keep:
                chunks.append(chunk)
            if target is not None:
                target.write(chunk)
    if size != entry.size:
        raise tarfile.ReadError(f"{size} of {entry.size} bytes")
    return digest.hexdigest(), b"".join(chunks)


def _take_member(bundle_path: Path, name: str, role: str | None, digest: str, data: bytes, found: _Unpacked) -> None:
    """Verify a member read whole against SHA256SUMS, and keep what is needed of it."""
    if name == CHECKSUMS:
        found.listed = _parse_checksums(bundle_path, data)
        return
    if digest != found.listed[name]:
        raise BundleError(f"{bundle_path}: member '{name}' has sha256 {digest}, {CHECKSUMS} lists {found.listed[name]}")
    if name == BUNDLE_INFO:
        found.info = _parse_info(bundle_path, data)
        found.prefix = f"{found.info['campaign']}/runs/{found.info['run_id']}"
    elif role != "file":
        found.documents[name] = data


def read_bundle(bundle_path: Path, *, unpack_dir: Path | None = None) -> Bundle:
    """A bundle's content after verifying it whole (see the module docstring); BundleError otherwise.
    ``unpack_dir``: an empty folder to write the bundle's members into while they are read (a bundle
    that fails verification leaves them there: the caller removes the folder)."""
    bundle_path = Path(bundle_path)
    try:
        with open(bundle_path, "rb") as handle:
            found = _stream_archive(handle, bundle_path, unpack_dir)
    except OSError as error:  # opening the file (_stream_archive reports what goes wrong inside it)
        raise BundleError(f"{bundle_path}: cannot be read: {error}") from None
    if CHECKSUMS not in found.names:
        raise BundleError(f"{bundle_path}: member '{CHECKSUMS}' is missing: not a bundle, or damaged")
    if found.info is None:
        raise BundleError(f"{bundle_path}: member '{BUNDLE_INFO}' is missing")
    missing = [name for name in found.listed if name not in found.names]
    if missing:
        raise BundleError(f"{bundle_path}: member '{missing[0]}' is listed in {CHECKSUMS} but missing from the bundle")
    info, prefix = found.info, found.prefix
    manifest_name = f"{prefix}/{RUN_MANIFEST}"
    if manifest_name not in found.documents:
        raise BundleError(f"{bundle_path}: member '{manifest_name}' (the run manifest bundle.json names) is missing")
    manifest = _parse_json(found.documents[manifest_name], f"{bundle_path}: member '{manifest_name}'")
    for key in ("run_id", "campaign", "site"):
        if manifest.get(key) != info.get(key):
            raise BundleError(
                f"{bundle_path}: member '{manifest_name}': {key} {manifest.get(key)!r}, "
                f"but {BUNDLE_INFO} says {info.get(key)!r}"
            )
    records, datasets = [], {}
    for name, data in found.documents.items():
        where = f"{bundle_path}: member '{name}'"
        if _member_role(name, prefix) == "record":
            record = _parse_json(data, where)
            _check_record_place(where, name, record, f"{prefix}/")
            records.append(RecordFile(f"{bundle_path}:{name}", record))
        elif name != manifest_name:
            datasets[name.split("/")[1]] = (where, _parse_json(data, where))
    check_run(manifest, records, manifest_source=f"{bundle_path}:{manifest_name}")
    named = _datasets_named(records)
    _check_datasets(named, datasets, manifest["run_id"])
    if info.get("exported_from") == "run directory":
        unlisted = sorted(set(named) - set(datasets))
        if unlisted:
            raise BundleError(
                f"{bundle_path}: member 'datasets/{unlisted[0]}/{DATASET_MANIFEST}' is missing: the records name "
                f"dataset '{unlisted[0]}', and a bundle of a run directory carries the manifest of each"
            )
    members = tuple(name for name in found.names if name not in (CHECKSUMS, BUNDLE_INFO))
    return Bundle(bundle_path, info, manifest, records, members)


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
