"""What changed in the stack with a change: what differs between the records of a cell in two runs, in
their flattened provenance, system, benchmark, dataset and distributed blocks, and in the runs' system
and benchmark configs and workflow commit. Per-trial noise is left out: the keys of NOISE_KEYS, and any
key whose value differs between the trials of one cell in one run."""

from __future__ import annotations

import fnmatch
import functools
import json
from collections.abc import Callable, Mapping, Sequence

# Record blocks that describe how a trial ran (not what it measured).
STACK_BLOCKS = ("provenance", "system", "benchmark", "dataset", "distributed")
# Flattened keys that differ from trial to trial whatever the stack (times, hosts, job ids).
NOISE_KEYS = (
    "provenance.started_utc",
    "provenance.finished_utc",
    "provenance.hostname",
    "provenance.command_line",
    "provenance.scheduler_job_id",
    "provenance.environment.*JOB*ID*",
    "provenance.environment.*NODELIST*",
    "provenance.environment.*STEP_ID",
    "provenance.environment.*TASK_PID",
    "provenance.environment.*PROCID",
    "provenance.environment.MASTER_ADDR",
    "provenance.environment.MASTER_PORT",
    "distributed.ranks",
    "distributed.weights_consistent",
)


def _flatten(block: dict, prefix: str, into: dict) -> None:
    """A JSON object's values under dotted keys, nested objects flattened too; lists as JSON text
    (hashable, comparable)."""
    for key, value in block.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            _flatten(value, name, into)
        else:
            into[name] = json.dumps(value) if isinstance(value, list) else value


@functools.cache
def _is_noise(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in NOISE_KEYS)


def cell_fingerprints(runs: Sequence[Mapping], by_run: Mapping[str, Sequence[Mapping]]) -> dict[tuple, dict]:
    """(run id, system, benchmark, cell) -> flattened stack key -> value, per-trial noise left out
    (module docstring); ``by_run``: the current records of each run (merge.records_by_run)."""
    cells: dict[tuple, list[dict]] = {}
    for run_id, records in by_run.items():
        for record in records:
            flat: dict = {}
            for block in STACK_BLOCKS:
                _flatten(record[block], block, flat)
            trial = record["trial"]
            key = (run_id, trial["system"], trial["benchmark"], trial["cell"])
            cells.setdefault(key, []).append({name: value for name, value in flat.items() if not _is_noise(name)})
    absent = object()  # a key that some trials of a cell have and others lack varies too
    varying = set()
    for first, *others in cells.values():
        for other in others:
            if other != first:
                varying.update(
                    key for key in first.keys() | other.keys() if first.get(key, absent) != other.get(key, absent)
                )
    manifests = {manifest["run_id"]: manifest for manifest in runs}
    fingerprints = {}
    for (run_id, system, benchmark, cell), (first, *_) in cells.items():
        fingerprint = {key: value for key, value in first.items() if key not in varying}
        manifest = manifests[run_id]
        fingerprint["run.workflow_commit"] = manifest.get("workflow_commit")
        _flatten(manifest.get("systems", {}).get(system, {}), "system_config", fingerprint)
        _flatten(manifest["benchmarks"].get(benchmark, {}), f"benchmark_config.{benchmark}", fingerprint)
        fingerprints[(run_id, system, benchmark, cell)] = fingerprint
    return fingerprints


def system_fingerprints(cells: Mapping[tuple, Mapping]) -> dict[str, dict[str, dict[str, list]]]:
    """run id -> system -> key -> the distinct values of the key over the system's cells (sorted
    as text), from ``cell_fingerprints``."""
    systems: dict[str, dict[str, dict[str, set]]] = {}
    for (run_id, system, _, _), fingerprint in cells.items():
        keys = systems.setdefault(run_id, {}).setdefault(system, {})
        for key, value in fingerprint.items():
            keys.setdefault(key, set()).add(value)
    return {
        run_id: {
            system: {key: sorted(seen, key=str) for key, seen in sorted(keys.items())} for system, keys in found.items()
        }
        for run_id, found in systems.items()
    }


def stack_diff(before: Mapping, after: Mapping) -> list[dict]:
    """The keys whose value differs, sorted: ``{"key", "before", "after"}`` (None: absent or null)."""
    return [
        {"key": key, "before": before.get(key), "after": after.get(key)}
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    ]


# A change's start is an estimate (a noisy run, or an outlying one at the onset, moves it by a run): a stack
# difference one run before or after it is the change's where its own run has none.
NEAR_RUNS = 1


def stack_near(start: int, last: int, diff_into: Callable[[int], list]) -> tuple[int, list]:
    """The stack difference of a change starting at run position ``start``: ``diff_into(position)`` is what
    changed from the run before ``position`` to it; its own run's, else the nearest run's within NEAR_RUNS (the
    earlier first), up to position ``last``. Returns (the position whose difference it is, the difference);
    (start, []) where none differs."""
    for offset in range(NEAR_RUNS + 1):
        for position in dict.fromkeys((start - offset, start + offset)):
            if 0 < position <= last and (diff := diff_into(position)):
                return position, diff
    return start, []
