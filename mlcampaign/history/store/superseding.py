"""A run against what a results store, or a results folder, already holds of its id: the one check that the
store's ingest (so ``mlcampaign ingest`` and ``mlcampaign import``) and an import into a results folder
(``mlcampaign import --results``, mlcampaign.history.bundle) both make, ``admit``:

- one run per id: a manifest under a held run's id with other values of RUN_IDENTITY is another run
  (RunConflictError naming what differs);
- superseding only when asked: another manifest of the run (its config changed, or a bundle says otherwise),
  or a record of a trial that has other records held, is a SupersedeError naming the differences, unless the
  caller supersedes (the run's own workflow continuing it; an import with ``--supersede``, into a store only).

What is held is a ``HeldRun``: where it is held (named in messages), its manifest, its records' content keys
and trial keys, and how one would supersede it there. A run held nowhere yet is checked for its start
(mlcampaign.history.store.checks.check_start) by its caller, as the store does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from mlcampaign.history.store.checks import RUN_IDENTITY, RunRow, json_differences, trial_key
from mlcampaign.history.store.errors import RunConflictError, SupersedeError

# How many of a manifest's differences a refusal names.
SHOWN_DIFFERENCES = 5


@dataclasses.dataclass(frozen=True)
class HeldRun:
    """What a store or a results folder holds of a run id."""

    place: str  # where it is held, as messages name it: "results store <url>", "results folder <path>"
    holder: str  # the same in a phrase: "the store", "the results folder"
    manifest_json: str  # the manifest held, canonical JSON
    manifest: Callable[[], dict]  # the manifest held, parsed (read where the run's manifest differs from it)
    record_keys: frozenset[str]  # content keys of the records held
    trials: frozenset[tuple]  # trial keys (mlcampaign.history.store.tables.TRIAL_KEY) of the records held
    remedy: str  # how to supersede it there, if one means to


@dataclasses.dataclass(frozen=True)
class Admission:
    """What an ingest or import of a run adds to what is held."""

    replaced: str | None  # the manifest held, where the run's manifest replaces it
    new_rows: list[dict]  # the rows (mlcampaign.history.store.checks.record_row) of records not held
    superseded_trials: frozenset[tuple]  # trials held with other records that gain a record


def held_manifest_replaced(run: RunRow, held: HeldRun | None) -> str | None:
    """The manifest held, where ``run``'s manifest differs from it (the run planned again, or a bundle that
    says otherwise); None where it is the same, or nothing is held. RunConflictError where what is held is
    another run (another campaign, site or start)."""
    if held is None or held.manifest_json == run.manifest_json:
        return None
    held_manifest, given = held.manifest(), json.loads(run.manifest_json)
    held_identity = {key: held_manifest.get(key) for key in RUN_IDENTITY}
    given_identity = {key: given.get(key) for key in RUN_IDENTITY}
    if held_identity != given_identity:
        differences = json_differences(held_identity, given_identity, holder=held.holder)
        raise RunConflictError(
            f"{run.source}: run '{run.run_id}' is already in {held.place} as another run; they "
            f"differ in: {'; '.join(differences)}. A run id names one run: give this run another id"
        )
    return held.manifest_json


def admit(run: RunRow, rows: list[dict], held: HeldRun | None, *, supersede: bool) -> Admission:
    """What of ``run`` and its records' ``rows`` is new to ``held`` (None: nothing held under its id). Refuses
    another run under the id (RunConflictError) and, without ``supersede``, a changed manifest or a trial that
    would gain a record (SupersedeError), each naming what differs; the caller has written nothing then."""
    if held is None:
        return Admission(None, rows, frozenset())
    replaced = held_manifest_replaced(run, held)
    new_rows = [row for row in rows if row["content_sha256"] not in held.record_keys]
    superseded = held.trials & {trial_key(row) for row in new_rows}
    if not supersede and (replaced is not None or superseded):
        raise SupersedeError(_refusal(run, held, replaced is not None, superseded))
    return Admission(replaced, new_rows, superseded)


def _refusal(run: RunRow, held: HeldRun, manifest_differs: bool, trials: frozenset[tuple]) -> str:
    """Why an ingest or import that was not asked to supersede is refused: the manifest it would replace, the
    trials that would get another record."""
    reasons = []
    if manifest_differs:
        differences = json_differences(held.manifest(), json.loads(run.manifest_json), holder=held.holder)
        shown = "; ".join(differences[:SHOWN_DIFFERENCES])
        more = f" and {len(differences) - SHOWN_DIFFERENCES} more" if len(differences) > SHOWN_DIFFERENCES else ""
        reasons.append(f"its manifest differs from the stored one in: {shown}{more}")
    if trials:
        system, benchmark, cell, trial, replicate = min(trials)
        reasons.append(
            f"{len(trials)} trial(s) {held.holder} has records of would get another record "
            f"(e.g. {system}/{benchmark}/{cell} trial {trial} replicate {replicate})"
        )
    return (
        f"{run.source}: run '{run.run_id}' is in {held.place}, and {' and '.join(reasons)}: nothing was written. "
        f"{held.remedy}"
    )
