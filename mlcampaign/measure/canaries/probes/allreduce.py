"""The collective canary: the bus bandwidth of an all-reduce in the trial's own process group (its
torch.distributed group, Horovod, or tf.distribute's collectives: the trial's runtime hands its group over as a
``TrialGroup``), for cells of more than one process.

As nccl-tests measures it (NVIDIA/nccl-tests, doc/PERFORMANCE.md): a fixed buffer, warm-up all-reduces excluded,
the ranks lined up by a barrier before each timed round, algorithm bandwidth = buffer bytes / time of one
all-reduce, bus bandwidth = algorithm bandwidth x 2(n-1)/n, which for a ring is what each link carries and does
not depend on n. The buffer is fixed per device kind (BUFFER_BYTES): large enough that bandwidth, not latency,
dominates, small beside a model's gradients; the number of all-reduces a round is fixed too, so every rank runs
the same collectives (a count derived from a rank's own timing could differ between ranks and leave one waiting).
Every rank first says whether it could allocate the buffer (one flag all-reduced), so that a rank that could not
never leaves the others waiting in the collective: then no rank measures. The figure is rank 0's timing; each
all-reduce returns with the device synchronised.
"""

from __future__ import annotations

import time

from mlcampaign.measure.canaries.probe import (
    BEFORE_TIMED,
    CanaryProbe,
    CanaryReading,
    CanaryUnavailable,
    TrialMachine,
    median_and_cv,
)

MIB = 1 << 20
BUFFER_BYTES = {"cpu": 8 * MIB, "cuda": 64 * MIB}
ALLREDUCES_PER_ROUND = {"cpu": 2, "cuda": 10}
REPEATS, WARMUP = 5, 1


def measure_allreduce(machine: TrialMachine, repeats: int = REPEATS) -> CanaryReading:
    group = machine.group
    if group is None or group.world_size < 2:
        raise CanaryUnavailable("one process: no collective")
    kind = "cpu" if machine.device.type == "cpu" else "cuda"
    size, count = BUFFER_BYTES[kind], ALLREDUCES_PER_ROUND[kind]
    problem = None
    try:
        group.prepare(size)
    except Exception as error:  # e.g. the device's memory is full: said below, after every rank has answered
        problem = f"{type(error).__name__}: {error}"
    if not group.everyone(problem is None):
        raise CanaryUnavailable(f"the buffer could not be allocated on every rank ({problem or 'on another rank'})")
    for _ in range(WARMUP * count):
        group.allreduce()
    seconds = []
    for _ in range(repeats):
        group.everyone(True)  # the barrier
        start = time.perf_counter()
        for _ in range(count):
            group.allreduce()
        seconds.append((time.perf_counter() - start) / count)
    n = group.world_size
    bus = [size / round_s * 2 * (n - 1) / n for round_s in seconds]
    value, cv = median_and_cv(bus)
    method = (
        f"all-reduce (sum) of a {size // MIB} MiB float32 buffer with {group.description} over {n} processes; "
        f"bus bandwidth = bytes / time x 2(n-1)/n (nccl-tests); median of {repeats} timed rounds of {count} "
        f"all-reduces, each after a barrier, after {WARMUP} warm-up round; rank 0's timing"
    )
    return CanaryReading(value, repeats, cv, method)


PROBE = CanaryProbe("allreduce_bus_bytes_per_s", BEFORE_TIMED, every_rank=True, measure=measure_allreduce)
