"""The work of staging a dataset, for the ``stage_dataset`` job's time limit and memory.

A generated dataset's work is its sample count times the values of one sample, at the generator's
measured cost per value; a path source's is its bytes, copied and hashed. The rates were measured on
this project's development machine (2 cores, shared with other jobs, 2026-12-01: CosmoFlow 64³
0.76 s a sample, DeepCAM 192 x 288 0.29 s, extreme weather 192 x 288 0.20 s, synthetic 64² images
2.4 ms; about twice the idle machine's: the issue measured CosmoFlow 128³ at 2.6 s a sample idle, these
rates give 6.3 s) and the time limit is SAFETY times the estimate, so a node several times slower than
the idle machine still finishes; each retry (Snakemake's ``attempt``) multiplies it again.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

from mlcampaign.plan.registry import generators, resolve

SAFETY = 2
MIN_RUNTIME_MIN = 10
# Copy and hash of a path source, read and written once (network file systems included).
PATH_BYTES_PER_S = 50e6
BASE_MEM_MB = 1500  # the staging process: Python, numpy, h5py, one open writer


def generator_options(name: str, options: dict) -> dict:
    """The generator's options as it runs with them: its signature's defaults, then ``options``."""
    parameters = inspect.signature(resolve(generators()[name].writer)).parameters
    defaults = {key: p.default for key, p in parameters.items() if p.default is not inspect.Parameter.empty}
    return defaults | options


def _path_source_bytes(hash_cache: Path) -> int | None:
    """The bytes of a path source as planning last saw them (the source-hash cache records each
    file's size); None before planning has read the source."""
    try:
        cache = json.loads(Path(hash_cache).read_text())
        return sum(int(entry["stat"].split(":", 1)[0]) for entry in cache.values())
    except (OSError, ValueError, KeyError, AttributeError):
        return None


def staging_estimate_s(dataset: dict, hash_cache: Path) -> float | None:
    """Seconds the staging of ``dataset`` should take on a node like the measuring machine (None: unknown)."""
    source = dataset["source"]
    if "generator" in source:
        work = generators()[source["generator"]].work
        options = generator_options(source["generator"], source.get("options", {}))
        return work.samples(options) * work.values_per_sample(options) * work.seconds_per_value
    size = _path_source_bytes(hash_cache)
    return None if size is None else size / PATH_BYTES_PER_S


def staging_resources(dataset: dict, hash_cache: Path, attempt: int, default_runtime_min: int) -> dict:
    """``runtime`` (minutes) and ``mem_mb`` of the job staging ``dataset`` at retry ``attempt``."""
    estimate = staging_estimate_s(dataset, hash_cache)
    runtime = default_runtime_min if estimate is None else max(MIN_RUNTIME_MIN, math.ceil(SAFETY * estimate / 60))
    mem_mb = BASE_MEM_MB
    source = dataset["source"]
    if "generator" in source:
        options = generator_options(source["generator"], source.get("options", {}))
        # One sample at a time, a few float64 copies while it is built.
        mem_mb += math.ceil(8 * 4 * generators()[source["generator"]].work.values_per_sample(options) / 2**20)
    return {"runtime": runtime * attempt, "mem_mb": mem_mb}
