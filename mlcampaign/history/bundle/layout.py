"""A bundle's format: its member names, where a run's files are in it (as in a results directory), its JSON
members as written and read, and the error of a bundle (or run directory) that does not hold to it.
"""

from __future__ import annotations

import json

from mlcampaign.plan.numbers import loads_json

BUNDLE_FORMAT = 1
CHECKSUMS = "SHA256SUMS"
BUNDLE_INFO = "bundle.json"
RUN_MANIFEST = "run.json"
RECORD = "record.json"
MLLOG = "mllog.txt"
SUPERSEDED = "superseded"
DATASET_MANIFEST = "manifest.json"


class BundleError(RuntimeError):
    """A bundle (or run directory) is damaged, incomplete or conflicts with what is there already."""


def run_prefix(manifest: dict) -> str:
    """Where a run's files are, relative to the results directory: ``<campaign>/runs/<run_id>``."""
    return f"{manifest['campaign']}/runs/{manifest['run_id']}"


def trial_directory(record: dict) -> str:
    """A record's trial directory under its run's: ``trials/<system>/<benchmark>/<cell>/trial<k>-rep<r>``
    (the workflow's trial rule writes there)."""
    trial = record["trial"]
    cell = f"{trial['system']}/{trial['benchmark']}/{trial['cell']}"
    return f"trials/{cell}/trial{trial['trial']}-rep{trial['replicate']}"


def json_member(document: dict) -> bytes:
    """A JSON member as the workflow writes JSON files (mlcampaign.records.files.write_json_atomic)."""
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def parse_json(data: bytes, where: str) -> dict:
    """A JSON object from a file or member, every number in it finite (JSON has no NaN or Infinity); BundleError
    naming ``where`` for anything else."""
    try:
        document = loads_json(data)
    except ValueError as error:
        raise BundleError(f"{where} is not JSON: {error}") from None
    except RecursionError:
        raise BundleError(f"{where} is not JSON this reader takes: nested too deeply") from None
    if not isinstance(document, dict):
        raise BundleError(f"{where} is not a JSON object")
    return document
