"""Reading a bundle: one pass over the archive, checking each member as it comes (members.check_member) and
its sha256 as it is read, then the whole (nothing missing, the archive ending where the file does, the run's
records and dataset manifests); memory holds the JSON members only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import tarfile
import zlib
from pathlib import Path
from typing import BinaryIO

from mlcampaign.history.bundle import limits
from mlcampaign.history.bundle.layout import (
    BUNDLE_INFO,
    CHECKSUMS,
    DATASET_MANIFEST,
    RUN_MANIFEST,
    BundleError,
    parse_json,
    run_prefix,
)
from mlcampaign.history.bundle.members import (
    Unpacked,
    check_datasets,
    check_listed,
    check_member,
    check_record_place,
    datasets_named,
    member_role,
    parse_checksums,
    parse_info,
)
from mlcampaign.history.store import RecordFile, check_run

_READ_CHUNK_BYTES = 2**20


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A bundle's verified content."""

    path: Path
    info: dict  # bundle.json
    manifest: dict
    records: list[RecordFile]  # paths are "<bundle>:<member>"
    members: tuple[str, ...]  # every member but SHA256SUMS and bundle.json: results-directory paths, in order
    checksums_sha256: str  # the sha256 of its SHA256SUMS: of its whole content

    @property
    def run_prefix(self) -> str:
        return run_prefix(self.manifest)


class _ArchiveStream:
    """The decompressed archive as tarfile reads it, counted: the member content being read (``reading``)
    against MAX_MEMBER_BYTES, everything against MAX_BUNDLE_BYTES, and what tarfile reads between two
    members (headers, long names) against MAX_HEADER_BYTES, so that no header makes it read on unbounded (limits)."""

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
        if self.total > limits.MAX_BUNDLE_BYTES:
            raise BundleError(
                f"{self._bundle_path}: over {limits.MAX_BUNDLE_BYTES} bytes decompressed, the limit of a bundle "
                f"({self.where()})"
            )
        if self.reading is None:
            self.between_members += len(data)
            if self.between_members > limits.MAX_HEADER_BYTES:
                raise BundleError(
                    f"{self._bundle_path}: over {limits.MAX_HEADER_BYTES} bytes of tar headers {self.where()}: "
                    "not a bundle, or damaged"
                )
        return data

    def where(self) -> str:
        if self.reading is not None:
            return f"in member '{self.reading}'"
        return f"after member '{self.last}'" if self.last else "before its first member"


def _stream_archive(handle: BinaryIO, bundle_path: Path, unpack_dir: Path | None) -> Unpacked:
    """Read the archive once, checking each member as it comes (check_member) and its sha256 as it is
    read; keep the JSON members, and write every member under ``unpack_dir`` when given."""
    found = Unpacked()
    counted = None
    try:
        with gzip.GzipFile(fileobj=handle, mode="rb") as stream:
            counted = _ArchiveStream(stream, bundle_path)
            with tarfile.open(fileobj=counted, mode="r|") as archive:
                for entry in archive:
                    role = check_member(bundle_path, entry, found)
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


def _take_member(bundle_path: Path, name: str, role: str | None, digest: str, data: bytes, found: Unpacked) -> None:
    """Verify a member read whole against SHA256SUMS, and keep what is needed of it."""
    if name == CHECKSUMS:
        found.listed = parse_checksums(bundle_path, data)
        found.checksums_sha256 = digest
        return
    if digest != found.listed[name]:
        raise BundleError(f"{bundle_path}: member '{name}' has sha256 {digest}, {CHECKSUMS} lists {found.listed[name]}")
    if name == BUNDLE_INFO:
        found.info = parse_info(bundle_path, data)
        found.prefix = f"{found.info['campaign']}/runs/{found.info['run_id']}"
        check_listed(bundle_path, found)
    elif role != "file":
        found.documents[name] = data


def read_bundle(bundle_path: Path, *, unpack_dir: Path | None = None) -> Bundle:
    """A bundle's content after verifying it whole (mlcampaign.history.bundle: reading a bundle); BundleError
    otherwise. ``unpack_dir``: an empty folder to write the bundle's members into while they are read (a bundle
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
    manifest = parse_json(found.documents[manifest_name], f"{bundle_path}: member '{manifest_name}'")
    for key in ("run_id", "campaign", "site"):
        if manifest.get(key) != info.get(key):
            raise BundleError(
                f"{bundle_path}: member '{manifest_name}': {key} {manifest.get(key)!r}, "
                f"but {BUNDLE_INFO} says {info.get(key)!r}"
            )
    records, datasets = [], {}
    for name, data in found.documents.items():
        where = f"{bundle_path}: member '{name}'"
        if member_role(name, prefix) == "record":
            record = parse_json(data, where)
            check_record_place(where, name, record, f"{prefix}/")
            records.append(RecordFile(f"{bundle_path}:{name}", record))
        elif name != manifest_name:
            datasets[name.split("/")[1]] = (where, parse_json(data, where))
    check_run(manifest, records, manifest_source=f"{bundle_path}:{manifest_name}")
    named = datasets_named(records)
    check_datasets(named, datasets, manifest["run_id"])
    if info.get("exported_from") == "run directory":
        unlisted = sorted(set(named) - set(datasets))
        if unlisted:
            raise BundleError(
                f"{bundle_path}: member 'datasets/{unlisted[0]}/{DATASET_MANIFEST}' is missing: the records name "
                f"dataset '{unlisted[0]}', and a bundle of a run directory carries the manifest of each"
            )
    members = tuple(name for name in found.names if name not in (CHECKSUMS, BUNDLE_INFO))
    return Bundle(bundle_path, info, manifest, records, members, found.checksums_sha256)
