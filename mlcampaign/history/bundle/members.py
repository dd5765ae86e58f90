"""The checks of a bundle's members, each before its content is read (its path, type, size and place in
the bundle: ``check_member``) and of what they hold (the checksum list, bundle.json, each record in its own
trial's directory, the dataset manifests the records name). Run folders are checked alike.

The checksum list comes first and bounds the rest before any other member is read: how many members there
are (``parse_checksums``), and, once bundle.json names the run, that each is a member of its run
(``check_listed``); every later member must be listed, once.
"""

from __future__ import annotations

import dataclasses
import re
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
    parse_json,
    trial_directory,
)
from mlcampaign.history.store import RecordFile
from mlcampaign.plan.names import InvalidNameError, check_name
from mlcampaign.records.files import content_sha256

_CHECKSUM_LINE = re.compile(r"([0-9a-f]{64})  (.+)")
_SHA256_NAME = re.compile(r"[0-9a-f]{64}\.json")


@dataclasses.dataclass
class Unpacked:
    """What streaming a bundle found: its checksum list, its JSON members, every member's name."""

    listed: dict[str, str] = dataclasses.field(default_factory=dict)  # member -> sha256, from SHA256SUMS
    documents: dict[str, bytes] = dataclasses.field(default_factory=dict)  # the JSON members
    names: dict[str, None] = dataclasses.field(default_factory=dict)  # every member read, in order
    info: dict | None = None
    prefix: str | None = None
    checksums_sha256: str | None = None


def member_role(name: str, prefix: str) -> str | None:
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


def _check_plain(bundle_path: Path, name: str) -> None:
    if any(part in ("", ".", "..") for part in name.split("/")) or "\\" in name:
        raise BundleError(f"{bundle_path}: member '{name}' is not a plain relative path")


def _role(bundle_path: Path, name: str, found: Unpacked) -> str:
    """The role of a member of the run that bundle.json names (member_role); BundleError for none."""
    role = member_role(name, found.prefix)
    if role is None:
        raise BundleError(f"{bundle_path}: member '{name}' is not part of a bundle of run '{found.info.get('run_id')}'")
    return role


def check_member(bundle_path: Path, entry: tarfile.TarInfo, found: Unpacked) -> str | None:
    """Check a member before its content is read: its name, type, size and place in the bundle. Its
    role (member_role; None for SHA256SUMS and bundle.json)."""
    name = entry.name
    _check_plain(bundle_path, name)
    if not entry.isfile() or entry.issparse():
        raise BundleError(f"{bundle_path}: member '{name}' is not a regular file")
    if name in found.names:
        raise BundleError(f"{bundle_path}: member '{name}' appears twice")
    if entry.size > limits.MAX_MEMBER_BYTES:
        raise BundleError(
            f"{bundle_path}: member '{name}' is {entry.size} bytes, over the limit of a bundle member "
            f"({limits.MAX_MEMBER_BYTES} bytes)"
        )
    expected = [CHECKSUMS, BUNDLE_INFO][len(found.names)] if len(found.names) < 2 else None
    if expected is not None and name != expected:
        if name == CHECKSUMS or CHECKSUMS not in found.names:
            raise BundleError(f"{bundle_path}: member '{CHECKSUMS}' is not first: not a bundle, or damaged")
        raise BundleError(f"{bundle_path}: member '{BUNDLE_INFO}' is missing (it comes after {CHECKSUMS})")
    if name != CHECKSUMS and name not in found.listed:
        raise BundleError(f"{bundle_path}: member '{name}' is not listed in {CHECKSUMS}")
    return None if expected is not None else _role(bundle_path, name, found)


def parse_checksums(bundle_path: Path, data: bytes) -> dict[str, str]:
    """The checksum list: member -> sha256. It comes first, so that what it lists is bounded before any other
    member is read: at most MAX_MEMBERS members with itself, each listed once."""
    lines = data.decode(errors="replace").splitlines()
    if len(lines) + 1 > limits.MAX_MEMBERS:
        raise BundleError(
            f"{bundle_path}: member '{CHECKSUMS}' lists {len(lines)} members: with itself, more than "
            f"{limits.MAX_MEMBERS} members, the limit of a bundle; refused before any of them was read"
        )
    listed = {}
    for number, line in enumerate(lines, start=1):
        match = _CHECKSUM_LINE.fullmatch(line)
        if match is None:
            raise BundleError(
                f"{bundle_path}: member '{CHECKSUMS}' line {number} is not '<sha256>  <member>': {line[:200]!r}"
            )
        if match.group(2) in listed:
            raise BundleError(f"{bundle_path}: member '{CHECKSUMS}' line {number} lists '{match.group(2)}' again")
        listed[match.group(2)] = match.group(1)
    return listed


def check_listed(bundle_path: Path, found: Unpacked) -> None:
    """Every member the checksum list names is a plain relative path of the run bundle.json names: checked once
    bundle.json is read, before any other member."""
    for name in found.listed:
        if name != BUNDLE_INFO:
            _check_plain(bundle_path, name)
            _role(bundle_path, name, found)


def parse_info(bundle_path: Path, data: bytes) -> dict:
    info = parse_json(data, f"{bundle_path}: member '{BUNDLE_INFO}'")
    if info.get("bundle_format") != BUNDLE_FORMAT:
        raise BundleError(
            f"{bundle_path}: member '{BUNDLE_INFO}': bundle_format {info.get('bundle_format')!r}; this "
            f"mlcampaign reads format {BUNDLE_FORMAT}"
        )
    try:
        for key in ("run_id", "campaign", "site"):
            check_name(info.get(key), f"{bundle_path}: member '{BUNDLE_INFO}': key '{key}'")
    except InvalidNameError as error:
        raise BundleError(str(error)) from None
    return info


def check_record_place(where: str, name: str, record: dict, prefix: str) -> None:
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


def datasets_named(records: list[RecordFile]) -> dict[str, str]:
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


def check_datasets(named: dict[str, str], manifests: dict[str, tuple[str, dict]], run_id: str) -> None:
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
