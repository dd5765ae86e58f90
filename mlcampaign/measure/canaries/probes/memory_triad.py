"""The memory-bandwidth canary: STREAM's triad ``a = b + s x c`` (McCalpin's STREAM, the figure every HPC centre
knows) on the trial process's device with its intra-op threads, one fused ``torch.add(b, c, alpha=s, out=a)`` a
pass.

Sizes: the three arrays together at least FOOTPRINT_FACTOR = 4 x the last-level cache, so that a pass streams
4 x the cache through it and no line survives to the next pass: on CPUs the node's last-level caches (every
instance of the highest level in sysfs, summed) shared by the trial's processes on the node, which all run the
triad at once; on GPUs the device's L2 (``torch.cuda.get_device_properties``). Where sysfs does not say,
DEFAULT_LLC_BYTES is assumed (the L3 of a large two-socket node). STREAM itself asks 4 x the cache for *each*
array; a third of that keeps the canary within its budget (all canaries <= 1 s a trial on CPU): on a 2-core VM
with a 32 MiB L3 allocating and first touching 3 x 128 MiB alone took 0.7 s, the whole probe 1.3 s
(bench/canaries.py). Each array lies within [MIN_ARRAY_BYTES, MAX_ARRAY_BYTES]: the ceiling bounds the cost on
nodes with huge caches (below 768 MiB of cache the footprint is still 4 x the cache). Bytes are counted as STREAM
does: 3 arrays x 8 bytes (float64) x n a pass, no write-allocate traffic. One untimed pass touches the arrays;
one warm-up round, then the median of five timed rounds of as many passes as fill ROUND_S, the device
synchronised before every clock read.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from mlcampaign.measure.canaries.probe import (
    BEFORE_SETUP,
    CanaryProbe,
    CanaryReading,
    TrialMachine,
    every_rank_note,
    median_and_cv,
)

FOOTPRINT_FACTOR = 4
MIB = 1 << 20
MIN_ARRAY_BYTES = 8 * MIB
MAX_ARRAY_BYTES = 1024 * MIB
DEFAULT_LLC_BYTES = 256 * MIB
SCALAR = 3.0
ROUND_S = 0.02
REPEATS, WARMUP = 5, 1
SYS_CPU = Path("/sys/devices/system/cpu")
_SIZE_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size_bytes(text: str) -> int:
    """A sysfs cache size ("32768K", "1M") in bytes."""
    text = text.strip()
    factor = _SIZE_SUFFIXES.get(text[-1:].upper(), 1)
    return int(text.rstrip("KMGkmg")) * factor


def cpu_last_level_cache(sys_cpu: Path = SYS_CPU) -> tuple[int | None, str]:
    """(bytes, where from) of the node's last-level cache: the highest cache level sysfs lists, each instance
    (one per distinct set of CPUs sharing it) counted once; None where sysfs says nothing."""
    instances: dict[tuple[int, str], int] = {}
    for index in sys_cpu.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            instances[(level, (index / "shared_cpu_list").read_text().strip())] = _size_bytes(
                (index / "size").read_text()
            )
        except (OSError, ValueError):
            continue
    if not instances:
        return None, "no cache in sysfs"
    top = max(level for level, _ in instances)
    sizes = [size for (level, _), size in instances.items() if level == top]
    return sum(sizes), f"L{top}, {len(sizes)} instance(s) in sysfs"


def cache_bytes(device: torch.device) -> tuple[int, str]:
    """(bytes, where from) of the cache the triad's arrays must exceed on ``device``."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size, "the GPU's L2"
    size, source = cpu_last_level_cache()
    if size is None:
        return DEFAULT_LLC_BYTES, f"{source}: the default of {DEFAULT_LLC_BYTES // MIB} MiB assumed"
    return size, source


def array_bytes(device: torch.device, local_processes: int) -> tuple[int, str]:
    """(bytes, why) of each of the triad's arrays on ``device`` for one of ``local_processes`` on the node."""
    cache, source = cache_bytes(device)
    sharing = local_processes if device.type == "cpu" else 1
    wanted = FOOTPRINT_FACTOR * cache // (3 * sharing)
    size = min(max(wanted, MIN_ARRAY_BYTES), MAX_ARRAY_BYTES)
    shared = f" shared by {sharing} processes" if sharing > 1 else ""
    return (
        size,
        f"together {FOOTPRINT_FACTOR} x the {cache / MIB:.4g} MiB cache ({source}){shared}; each in [8 MiB, 1 GiB]",
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_triads(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, count: int) -> float:
    """Seconds for ``count`` triads, the device synchronised before both clock reads."""
    _synchronize(a.device)
    start = time.perf_counter()
    for _ in range(count):
        torch.add(b, c, alpha=SCALAR, out=a)
    _synchronize(a.device)
    return time.perf_counter() - start


def measure_triad(
    device: torch.device, local_processes: int = 1, size_bytes: int | None = None, repeats: int = REPEATS
) -> CanaryReading:
    """The triad's bandwidth (B/s) on ``device`` (``size_bytes`` per array: default from the cache, see the
    module's docstring); the arrays are freed on return."""
    size_bytes, why = (size_bytes, "given") if size_bytes else array_bytes(device, local_processes)
    n = size_bytes // 8
    a = torch.zeros(n, dtype=torch.float64, device=device)
    b = torch.full_like(a, 1.0)
    c = torch.full_like(a, 2.0)
    first = _time_triads(a, b, c, 1)  # untimed: pays for first touches and kernel set-up
    count = max(1, round(ROUND_S / max(first, 1e-9)))
    for _ in range(WARMUP):
        _time_triads(a, b, c, count)
    rates = [3 * 8 * n * count / _time_triads(a, b, c, count) for _ in range(repeats)]
    del a, b, c
    if device.type == "cuda":
        torch.cuda.empty_cache()  # leave the memory to the trial
    value, cv = median_and_cv(rates)
    threads = f", {torch.get_num_threads()} intra-op threads" if device.type == "cpu" else ""
    method = (
        f"STREAM triad torch.add(b, c, alpha={SCALAR:g}, out=a), float64, 3 arrays of {size_bytes / MIB:.4g} MiB "
        f"({why}) on {device}{threads}; 3 x 8 x n bytes a pass; median of {repeats} timed rounds of {count} "
        f"pass{'es' if count > 1 else ''} after 1 untimed pass and {WARMUP} warm-up round"
    )
    return CanaryReading(value, repeats, cv, method)


def _measure(machine: TrialMachine) -> CanaryReading:
    reading = measure_triad(machine.device, machine.local_processes)
    return dataclasses.replace(reading, method=reading.method + every_rank_note(machine))


PROBE = CanaryProbe("memory_triad_bytes_per_s", BEFORE_SETUP, every_rank=True, measure=_measure)
