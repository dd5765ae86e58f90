"""Trial records: schema, atomic writing (and keeping a record that could not be written), reading.

Schema: ``mlcampaign/plan/schemas/record.schema.yaml`` (version in ``SCHEMA_VERSION``); records are built by
mlcampaign.records.builder, their provenance by mlcampaign.records.provenance.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TextIO

import jsonschema

from mlcampaign.plan.config_files import validator
from mlcampaign.plan.numbers import loads_json, non_finite_numbers

SCHEMA_VERSION = "1.2"


def canonical_json(document) -> str:
    """A document's JSON text with sorted keys, no spaces and ASCII only: its content, whatever its
    file's layout (the results store keeps and hashes records as this text)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def content_sha256(record: dict) -> str:
    """The sha256 of a record's content (``canonical_json``): its key in the results store."""
    return hashlib.sha256(canonical_json(record).encode()).hexdigest()


# A trial's earlier records (before it was run again) stay beside its record, named by content.
SUPERSEDED_DIR = "superseded"


def supersede(path: Path) -> Path | None:
    """Keep the record at ``path`` among its trial's earlier records (``SUPERSEDED_DIR``), before the
    trial runs again; the kept file, or None if there was no record (or not a readable one)."""
    try:
        record = loads_json(Path(path).read_text())
    except (OSError, ValueError):
        return None
    kept = Path(path).parent / SUPERSEDED_DIR / f"{content_sha256(record)}.json"
    write_json_atomic(record, kept)
    Path(path).unlink()
    return kept


def validate_record(record: dict) -> None:
    """Raise jsonschema.ValidationError unless ``record`` satisfies the record schema and every number in
    it is finite (a bound cannot refuse NaN: every comparison with it is false). The error's path is
    the key; a composition the schema words (``x-error``: status against failure) says it in words."""
    not_finite = next(non_finite_numbers(record), None)
    if not_finite is not None:
        path, value = not_finite
        raise jsonschema.ValidationError(f"{value!r} is not a finite number (JSON has no NaN or Infinity)", path=path)
    errors = list(validator("record").iter_errors(record))
    plain = [error for error in errors if not (error.validator == "oneOf" and "x-error" in error.schema)]
    if plain:
        raise jsonschema.exceptions.best_match(plain)
    if errors:
        raise jsonschema.ValidationError(errors[0].schema["x-error"], path=errors[0].absolute_path)


class RecordError(ValueError):
    """A record file that cannot be read, or whose content does not satisfy the record schema."""


def write_json_atomic(data: dict, path: Path) -> None:
    """Write JSON so that ``path`` either does not exist or holds the complete document (a failed
    write, e.g. on a full disk, leaves the previous file and no temporary one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# Where a record that could not be written (a full disk, a lost mount) is kept, on another file
# system than the results where possible: the trial job's next run writes it instead of training
# again (mlcampaign.job.supervisor). The job log holds a copy too.
RECOVERY_DIR = Path(
    os.environ.get("MLCAMPAIGN_RECOVERY_DIR")
    or Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "mlcampaign" / "unwritten"
)


def _recovery_path(record_path: Path) -> Path:
    digest = hashlib.sha256(str(Path(record_path).resolve()).encode()).hexdigest()[:24]
    return RECOVERY_DIR / f"{digest}.json"


def write_record(record: dict, path: Path, log: TextIO) -> None:
    """Validate ``record`` and write it atomically to ``path``. If that fails, say why in ``log``, keep
    the record in the log and in ``RECOVERY_DIR`` (``recovered_record`` finds it), then raise; a record
    the schema refuses is kept in the log (what was measured stays readable), then the error raised."""
    try:
        validate_record(record)
    except jsonschema.ValidationError as error:
        where = ".".join(map(str, error.absolute_path)) or "<top level>"
        print(f"the record for {path} is not a valid trial record: key '{where}': {error.message}", file=log)
        print(f"here it is: {json.dumps(record, sort_keys=True)}", file=log, flush=True)
        raise
    try:
        write_json_atomic(record, path)
    except OSError as error:
        print(f"could not write the record {path}: {error}", file=log)
        try:
            write_json_atomic(record, _recovery_path(path))
            print(f"the record is kept in {_recovery_path(path)}; the trial's next run writes it", file=log)
        except OSError as second:
            print(f"nor could it be kept in {RECOVERY_DIR} ({second}); here it is:", file=log)
        print(json.dumps(record, sort_keys=True), file=log, flush=True)
        raise


def recovered_record(path: Path, trial: dict) -> dict | None:
    """The record of ``trial`` (its spec's ``trial`` row) that ``write_record`` could not write to
    ``path`` and kept, if any; None otherwise."""
    kept = _recovery_path(path)
    try:
        record = loads_json(kept.read_text())
        validate_record(record)
    except (OSError, ValueError, jsonschema.ValidationError):
        return None
    same_trial = all(
        record["trial"][key] == trial[key] for key in ("system", "benchmark", "cell", "trial", "replicate")
    )
    return record if same_trial and record["trial"]["seed"] == trial["seed"] else None


def forget_recovered(path: Path) -> None:
    """Remove the kept copy of ``path``'s record (once the record is written)."""
    _recovery_path(path).unlink(missing_ok=True)


def read_record(path: Path) -> dict:
    """A record file, validated; RecordError naming the file and what is wrong with it."""
    try:
        with open(path) as handle:
            record = loads_json(handle.read())
    except (OSError, UnicodeDecodeError) as error:
        raise RecordError(f"{path}: cannot be read ({error})") from None
    except ValueError as error:
        raise RecordError(f"{path}: not valid JSON ({error})") from None
    try:
        validate_record(record)
    except jsonschema.ValidationError as error:
        where = ".".join(map(str, error.absolute_path)) or "<top level>"
        raise RecordError(f"{path}: not a valid trial record: key '{where}': {error.message}") from None
    return record
