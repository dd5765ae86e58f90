"""The store's checks of a run before its ingest: its manifest files a run (names, numbers, a start), its
records satisfy the record schema and belong to it, each of a system of the run's own site (``check_run``: every
check that needs no store; bundles and run folders use it too); and of every row read back (``stored_manifest``,
``stored_record``: DamagedStoreError). A run against what a store, or a results folder, holds of it:
mlcampaign.history.store.superseding. The rules are the package's (mlcampaign.history.store).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from mlcampaign.history.store.errors import DamagedStoreError, ManifestError, RecordError
from mlcampaign.history.store.tables import RUNS, TRIAL_KEY, now_utc, utc_text
from mlcampaign.plan.names import InvalidNameError, check_name
from mlcampaign.plan.numbers import loads_json, non_finite_numbers
from mlcampaign.plan.runs import CLOCK_TOLERANCE
from mlcampaign.records.files import canonical_json
from mlcampaign.records.schema import record_schema_error

# What makes a run the one it is: a manifest under a stored run's id with other values of these is
# another run (refused); with the same, it is the run planned again (its config changed), and
# replaces the stored manifest.
RUN_IDENTITY = ("campaign", "site", "started_utc")
DAMAGED_REMEDY = (
    "the store was changed outside mlcampaign: restore it from a backup, or delete the run's rows and ingest "
    "the run again from its folder or bundle"
)


@dataclasses.dataclass(frozen=True)
class RecordFile:
    """A record and the file it was read from (the file is named in error messages and kept)."""

    path: str
    record: dict


@dataclasses.dataclass(frozen=True)
class RunRow:
    """What the runs table holds of a manifest."""

    run_id: str
    campaign: str
    site: str
    started_utc: str
    workflow_commit: str | None
    manifest_json: str
    source: str

    @classmethod
    def from_manifest(cls, manifest: Any, source: str) -> RunRow:
        if not isinstance(manifest, dict):
            raise ManifestError(f"{source}: a run manifest is a JSON object, not {type(manifest).__name__}")
        run_id = manifest.get("run_id")
        try:
            for key in ("run_id", "campaign"):
                check_name(manifest.get(key), f"{source}: key '{key}'")
            for key in ("site", "started_utc"):
                if not isinstance(manifest.get(key), str) or not manifest[key]:
                    raise ManifestError(
                        f"{source}: run '{run_id}': key '{key}': value {manifest.get(key)!r} is not text"
                    )
            check_name(manifest["site"], f"{source}: run '{run_id}': key 'site'")
        except InvalidNameError as error:
            raise ManifestError(str(error)) from None
        try:
            started = utc_text(manifest["started_utc"])
        except ValueError as error:
            raise ManifestError(f"{source}: run '{run_id}': key 'started_utc': {error}") from None
        commit = manifest.get("workflow_commit")
        if commit is not None and not isinstance(commit, str):
            raise ManifestError(f"{source}: run '{run_id}': key 'workflow_commit': value {commit!r} is not text")
        try:
            not_finite = next(non_finite_numbers(manifest), None)
            text = canonical_json(manifest)
        except RecursionError:
            raise ManifestError(f"{source}: run '{run_id}': the manifest is nested too deeply") from None
        if not_finite is not None:
            path, value = not_finite
            raise ManifestError(
                f"{source}: run '{run_id}': key '{'.'.join(map(str, path))}': value {value!r} is not a finite number "
                "(JSON has no NaN or Infinity)"
            )
        return cls(run_id, manifest["campaign"], manifest["site"], started, commit, text, source)


# A run's records.


def _check_belongs_to_run(record_file: RecordFile, run: RunRow) -> None:
    """A record's run block (schema 1.1) and its trial's campaign must be the manifest's run and campaign."""
    record = record_file.record
    trial = record.get("trial")
    campaign = trial.get("campaign") if isinstance(trial, dict) else None
    if campaign is not None and campaign != run.campaign:
        raise RecordError(
            f"{record_file.path}: the record's key 'trial.campaign' names campaign {campaign!r}, not campaign "
            f"'{run.campaign}' of run '{run.run_id}' ({run.source})"
        )
    block = record.get("run")
    if block is None:
        return
    named = (block.get("id"), block.get("site")) if isinstance(block, dict) else (block, None)
    if named != (run.run_id, run.site):
        raise RecordError(
            f"{record_file.path}: the record's run block names run {named[0]!r} at site {named[1]!r}, "
            f"not run '{run.run_id}' at site '{run.site}' of {run.source}"
        )


def distinct_records(records: Iterable[RecordFile], run: RunRow) -> dict[str, tuple[RecordFile, str]]:
    """The records by content key (a record given twice is one), each with its canonical JSON."""
    distinct = {}
    for record_file in records:
        if not isinstance(record_file.record, dict):
            raise RecordError(f"{record_file.path}: a record is a JSON object, not {type(record_file.record).__name__}")
        _check_belongs_to_run(record_file, run)
        try:
            text = canonical_json(record_file.record)
        except RecursionError:
            raise RecordError(f"{record_file.path}: the record is nested too deeply") from None
        distinct.setdefault(hashlib.sha256(text.encode()).hexdigest(), (record_file, text))
    return distinct


def trial_key(row: dict) -> tuple:
    return tuple(row[name] for name in TRIAL_KEY)


def record_row(run_id: str, key: str, record_file: RecordFile, text: str, now: str) -> dict:
    """The records-table row of a record, after checking it against the record schema."""
    record = record_file.record
    problem = record_schema_error(record)
    if problem is not None:
        raise RecordError(f"{record_file.path}: the record does not satisfy the record schema {problem}")
    try:
        finished = utc_text(record["provenance"]["finished_utc"])
    except ValueError as error:
        raise RecordError(f"{record_file.path}: key 'provenance.finished_utc': {error}") from None
    trial = record["trial"]
    return {
        "run_id": run_id,
        "content_sha256": key,
        "system": trial["system"],
        "benchmark": trial["benchmark"],
        "cell": trial["cell"],
        "trial": trial["trial"],
        "replicate": trial["replicate"],
        "status": record["status"],
        "finished_utc": finished,
        "source_path": record_file.path,
        "ingested_utc": now,
        "record_json": text,
    }


def _system_site(manifest: dict, system: Any) -> Any:
    """The site the run manifest's ``systems`` gives ``system`` (None where it gives none)."""
    systems = manifest.get("systems")
    declared = systems.get(system) if isinstance(systems, dict) and isinstance(system, str) else None
    return declared.get("site") if isinstance(declared, dict) else None


def check_sites(manifest: dict, run: RunRow, records: Iterable[RecordFile]) -> None:
    """A run holds its own site's trials: every trial its plan marks ``at_site`` and every record is of a system
    that the manifest's ``systems`` puts at the run's site (ManifestError, RecordError naming both sites).
    Two sites' runs that both claim a trial could not be merged (mlcampaign.history.merge)."""
    plan = manifest.get("plan")
    for position, row in enumerate(plan if isinstance(plan, list) else []):
        if isinstance(row, dict) and row.get("at_site") and _system_site(manifest, row.get("system")) != run.site:
            raise ManifestError(
                f"{run.source}: run '{run.run_id}': key 'plan.{position}': a trial of system {row.get('system')!r} "
                f"at site {_system_site(manifest, row.get('system'))!r} (key 'systems'), marked at_site in a run "
                f"of site '{run.site}': a run plans its own site's trials only"
            )
    for record_file in records:
        trial = record_file.record.get("trial") if isinstance(record_file.record, dict) else None
        system = trial.get("system") if isinstance(trial, dict) else None
        if system is not None and _system_site(manifest, system) != run.site:
            raise RecordError(
                f"{record_file.path}: the record's system {system!r} is at site {_system_site(manifest, system)!r} "
                f"(key 'systems' of {run.source}), not at site '{run.site}' of run '{run.run_id}': a run holds its "
                "own site's trials only"
            )


def check_run(manifest: dict, records: Iterable[RecordFile], *, manifest_source: str = "run manifest") -> None:
    """Make every check ingest makes, without a store: the manifest files a run, every record
    satisfies the record schema, belongs to that run and is of a system of its site. Raises ManifestError or
    RecordError."""
    run = RunRow.from_manifest(manifest, manifest_source)
    distinct = distinct_records(records, run)
    now = now_utc()
    for key, (record_file, text) in distinct.items():
        record_row(run.run_id, key, record_file, text, now)
    check_sites(manifest, run, [record_file for record_file, _ in distinct.values()])


# A run against the runs the store holds (and what a results folder holds: mlcampaign.history.store.superseding).


def json_differences(stored: Any, given: Any, prefix: str = "", holder: str = "the store") -> list[str]:
    """Where two JSON documents differ, as dotted key paths (with both values where they are scalars); ``stored``
    is what ``holder`` holds.

    Values are compared as canonical JSON, for which 1 and 1.0, or 1 and true, differ as in the store."""
    if isinstance(stored, dict) and isinstance(given, dict):
        differences = []
        for key in sorted(stored.keys() | given.keys()):
            path = f"{prefix}{key}"
            if key not in stored or key not in given:
                differences.append(f"{path} ({'only in' if key in stored else 'not in'} {holder})")
            elif canonical_json(stored[key]) != canonical_json(given[key]):
                differences.extend(json_differences(stored[key], given[key], f"{path}.", holder))
        return differences
    path = prefix.removesuffix(".") or "<top level>"
    if isinstance(stored, dict | list) or isinstance(given, dict | list):
        return [path]
    return [f"{path} ({stored!r} in {holder}, {given!r} given)"]


def check_start(run: RunRow) -> None:
    """ManifestError for a new run that starts in the future of this machine's clock (by more than
    CLOCK_TOLERANCE): it would be its site's latest run for good (mlcampaign.history.store: time)."""
    now = datetime.datetime.now(datetime.UTC)
    if run.started_utc > utc_text((now + CLOCK_TOLERANCE).isoformat()):
        raise ManifestError(
            f"{run.source}: run '{run.run_id}': key 'started_utc': value '{run.started_utc}' is after this "
            f"machine's clock ({now.isoformat(timespec='seconds')}): a run cannot start in the future; the clock "
            "of the machine that started it was ahead. Runs are ordered by their start, and this one would be "
            "its site's latest for good: correct that clock and start a new run"
        )


def new_run_problems(connection: Connection, url: str, run: RunRow, *, refuse_older: bool = False) -> list[str]:
    """For a run the store (at ``url``) does not hold yet: ManifestError if it starts in the future of
    this machine's clock; a warning (with ``refuse_older``: ManifestError) if it starts before the
    latest stored run of its campaign at its site (mlcampaign.history.store: time)."""
    stored = select(RUNS.c.run_id).where(RUNS.c.run_id == run.run_id)
    if connection.execute(stored).scalar_one_or_none() is not None:
        return []
    check_start(run)
    latest = connection.execute(
        select(RUNS.c.run_id, RUNS.c.started_utc)
        .where(RUNS.c.campaign == run.campaign, RUNS.c.site == run.site)
        .order_by(RUNS.c.started_utc.desc(), RUNS.c.run_id.desc())
        .limit(1)
    ).one_or_none()
    if latest is None or latest.started_utc <= run.started_utc:
        return []
    problem = (
        f"{run.source}: run '{run.run_id}' starts at {run.started_utc}, before run '{latest.run_id}' of campaign "
        f"'{run.campaign}' at site '{run.site}' (started {latest.started_utc}) in results store {url}: runs "
        "are ordered by their start, so trends and regression checks put it before that run"
    )
    if refuse_older:
        raise ManifestError(
            f"{problem}; this machine's clock is behind, or that run's start is in the future: correct the clock"
        )
    return [f"{problem} (a run sent late is fine; a clock that was behind is not)"]


# Rows read back.


def stored_manifest(url: str, run_id: str, text: str, identity: dict | None = None) -> dict:
    """A run's stored manifest, parsed; DamagedStoreError unless it files the run of its row (``identity``:
    the row's RUN_IDENTITY columns, where read)."""
    where = f"results store {url}: run '{run_id}': column runs.manifest_json"
    try:
        manifest = loads_json(text)
        filed = RunRow.from_manifest(manifest, "the stored manifest")
    except (ValueError, RecursionError, ManifestError) as error:
        raise DamagedStoreError(f"{where} is damaged ({error}); {DAMAGED_REMEDY}") from None
    row = {"run_id": run_id} | (identity or {})
    found = {key: getattr(filed, key) for key in row}
    if found != row:
        raise DamagedStoreError(f"{where} is damaged: it files run {found}, not the row's {row}; {DAMAGED_REMEDY}")
    return manifest


def stored_record(url: str, run_id: str, key: str, text: str) -> dict:
    """A stored record, parsed; DamagedStoreError unless its text is the content its key was computed from."""
    where = f"results store {url}: run '{run_id}': the record with content_sha256 {key}"
    if hashlib.sha256(text.encode()).hexdigest() != key:
        raise DamagedStoreError(
            f"{where}: its record_json is not the record ingested (its sha256 differs); {DAMAGED_REMEDY}"
        )
    try:
        record = loads_json(text)
    except (ValueError, RecursionError) as error:
        raise DamagedStoreError(f"{where}: its record_json is not JSON ({error}); {DAMAGED_REMEDY}") from None
    if not isinstance(record, dict):
        raise DamagedStoreError(f"{where}: its record_json is not a JSON object; {DAMAGED_REMEDY}")
    return record
