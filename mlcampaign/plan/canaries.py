"""The canaries, declared once: the machine measured in every trial, beside the trial's own metrics.

A canary is a small, fixed probe of the machine (its dense-matmul peak, memory bandwidth, the collective
bandwidth of the trial's process group, the read rate of its staged dataset) that every trial job measures
on its own nodes and in its own process layout. The benchmarks' numbers then come with the machine's own
numbers of the same week: a change that the canaries and most cells of a system show together is the
machine's, one that a cell shows alone is the benchmark's.

One ``Canary`` per probe: its name, unit, better direction, what it is, how it is measured and which cells
measure it. Readers of this table:

- the record schema: its ``canaries`` block is generated from it (``x-canaries`` in
  mlcampaign/plan/schemas/record.schema.yaml; mlcampaign.plan.config_files);
- the trial: it measures the canaries that apply to its cell, each through the probe of the same name
  (mlcampaign.measure.canaries, one module per probe);
- the record builder (the unit), the analysis's trial frame (a column ``canary.<name>`` per canary) and the
  history's series of the machine (mlcampaign.history.machine).

Adding a canary is one entry here plus its probe module. A canary that a trial could not measure is absent
from its record, never 0.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Canary:
    name: str  # the key in the record's canaries block
    unit: str  # of its value (mlcampaign.plan.metrics.UNIT_BOUNDS)
    better: str  # "higher" or "lower"
    description: str
    method: str  # how it is measured, in short (each record's ``method`` says exactly)
    min_processes: int = 1  # the cells that measure it: those of at least this many processes

    def applies(self, processes: int) -> bool:
        """Whether a cell of ``processes`` processes measures this canary."""
        return processes >= self.min_processes


_EVERY_RANK = "every process of the trial at once on its own device with its own threads; rank 0's figure"
CANARIES = {
    canary.name: canary
    for canary in (
        Canary(
            "matmul_flops_per_s",
            "FLOP/s",
            "higher",
            "dense-matmul peak of one process of the trial, at the trial's precision",
            f"the roofline measured before training (mlcampaign.measure.roofline), reused; {_EVERY_RANK}",
        ),
        Canary(
            "memory_triad_bytes_per_s",
            "B/s",
            "higher",
            "memory bandwidth of one process of the trial: STREAM triad a = b + s x c",
            "float64 arrays of at least 4 x the last-level cache (CPU, shared by the node's processes) or the L2 "
            f"(GPU), 3 x 8 bytes per element as STREAM counts, median of timed rounds after a warm-up; {_EVERY_RANK}",
        ),
        Canary(
            "allreduce_bus_bytes_per_s",
            "B/s",
            "higher",
            "bus bandwidth of an all-reduce in the trial's own process group",
            "all-reduce of a fixed float32 buffer with the trial's collectives (torch.distributed, Horovod, "
            "tf.distribute), bus bandwidth as nccl-tests defines it (algorithm bandwidth x 2(n-1)/n), a barrier "
            "before each timed round, warm-up excluded; rank 0's figure",
            min_processes=2,
        ),
        Canary(
            "dataset_read_bytes_per_s",
            "B/s",
            "higher",
            "read rate of a bounded sample of the trial's staged dataset files",
            "up to 8 MiB in 64 files or 40 ms per read, the files' page cache dropped first where the operating system "
            "allows (the record's method says whether it did), median of timed reads after a warm-up, by rank 0 "
            "after the timed training",
        ),
    )
}
# The analysis's column of a canary's value (mlcampaign.analysis.frame) and its metric name in the trends.
COLUMN_PREFIX = "canary."


def canary_column(name: str) -> str:
    """The column (and trend metric name) of canary ``name``'s value."""
    return f"{COLUMN_PREFIX}{name}"


def record_canaries_schema() -> dict:
    """The JSON schema of the record's ``canaries`` block: one optional entry per canary."""
    properties = {}
    for name, canary in CANARIES.items():
        properties[name] = {
            "type": "object",
            "description": f"{canary.description}; {canary.method}",
            "required": ["value", "unit", "repeats", "repeat_cv", "method"],
            "additionalProperties": False,
            "properties": {
                "value": {"type": "number", "exclusiveMinimum": 0, "x-unit": canary.unit},
                "unit": {"const": canary.unit},
                "repeats": {"type": "integer", "minimum": 1},
                "repeat_cv": {"type": "number", "x-unit": "fraction", "description": "sd / mean of the repeats"},
                "method": {"type": "string", "description": "what was timed, its size, repeats and warm-up"},
            },
        }
    return {"type": "object", "additionalProperties": False, "properties": properties}
