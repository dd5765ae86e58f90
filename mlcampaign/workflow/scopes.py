"""The records an aggregation scope reads (rules/analysis.smk): ``analysis`` reads the record of every planned
trial, ``partial`` the records that exist when Snakemake starts, and shows the planned trials without one
as not run, or as failed where their record cannot be read or Slurm killed their job."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Sequence

import pandas as pd

from mlcampaign.job.slurm_accounting import killed_trials
from mlcampaign.plan.campaign import TRIAL_KEYS
from mlcampaign.records.files import RecordError, read_record


@dataclasses.dataclass(frozen=True)
class ScopeRecords:
    records: list[dict]
    # Outcomes of planned trials without a readable record (build_tables' known_outcomes); None: every
    # planned trial has its record (the analysis scope).
    known_outcomes: pd.DataFrame | None


def existing_records(paths: Sequence[str]) -> list[str]:
    """The partial scope's records: those of ``paths`` (every planned trial's) that exist now."""
    return [path for path in paths if os.path.exists(path)]


def records_state(paths: Sequence[str]) -> str:
    """A digest of the existing records' paths and modification times: a new or rewritten record
    re-runs the partial aggregation (a params trigger)."""
    state = "\n".join(f"{path} {os.path.getmtime(path)}" for path in existing_records(paths))
    return hashlib.sha256(state.encode()).hexdigest()[:16]


def scope_records(
    plan: pd.DataFrame,
    trial_dirs: Sequence[str],
    inputs: Sequence[str],
    existing: Sequence[str],
    say: Callable[[str], None],
) -> ScopeRecords:
    """The records of a scope. ``inputs``: every planned trial's record (the analysis scope: one that
    cannot be read stops it, named), or none (the partial scope: ``existing``, the records that exist,
    read from ``trial_dirs``, each planned trial's directory in ``plan`` order; one that cannot be read
    shows as a failure of its trial, saying so; a trial without a record may have had its job killed
    by Slurm). ``say`` is told of each record left out, as it is."""
    if inputs:
        return ScopeRecords([read_record(path) for path in inputs], None)
    by_key = dict(zip(plan[TRIAL_KEYS].itertuples(index=False, name=None), trial_dirs, strict=True))
    existing, records, unreadable = set(existing), [], {}
    for key, directory in by_key.items():
        if f"{directory}/record.json" in existing:
            try:
                records.append(read_record(f"{directory}/record.json"))
            except RecordError as error:
                say(f"skipped: {error}")
                unreadable[key] = {"failure_reason": "error", "failure_message": f"unreadable record: {error}"}
    recorded = {tuple(record["trial"][key] for key in TRIAL_KEYS) for record in records} | set(unreadable)
    killed = killed_trials({key: path for key, path in by_key.items() if key not in recorded})
    known = pd.DataFrame(
        [dict(zip(TRIAL_KEYS, key, strict=True)) | outcome for key, outcome in unreadable.items()] + killed
    )
    return ScopeRecords(records, known)
