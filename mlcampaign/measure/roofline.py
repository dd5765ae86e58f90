"""The roof of the roofline: a measured dense-matmul peak of this process's device.

A trial's achieved FLOP/s (counted FLOPs x throughput, ``mlcampaign.measure.flops``) is only meaningful
next to what the hardware does on its best kernel. Nominal peaks (cores x clock x FLOP/cycle in
the system config) are rarely reached even by a matmul, so every trial process also measures one:
square ``torch.matmul`` at a size that saturates the device, in the trial's precision, with the
trial's intra-op threads, warm-up excluded, the median over a few timed repeats (the device is
synchronised before every clock read on GPUs). It takes about a quarter of a second, and every trial
pays it twice (before training, and after it for the contention check): one warm-up round and five
timed rounds of about 40 ms each (before 2026-12: two warm-up and five timed rounds of 100 ms, about
0.75 s). Five rounds keep the median robust to two disturbed ones; a round of 40 ms (4 matmuls of
1024² fp32 on 2 CPU cores; on GPUs at least one 8192² matmul) is long enough for the clock reads and
synchronisations to cost nothing next to the work. ``bench/campaign_overhead.py --compare-roofline``
measures both settings interleaved.

Where one matmul at that size lasts longer than ``SLOW_MATMUL_ROUNDS`` rounds (bfloat16 on CPUs without
bfloat16 units, which emulate it at about a GFLOP/s: 2 s a 1024² matmul, 18 s a measurement), the rounds
are measured at the smaller size one matmul of which fills a round (5 s a measurement), so that the
measurement keeps to its time. Such a roof is the emulated kernel's at that size (on an AMD EPYC here:
1.4 GFLOP/s at 256² against 0.95 at 1024²), a floor no trial is tuned to; the record says the size.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch

# Square matrix sizes that keep the device busy long enough for its peak: on CPUs BLAS reaches its
# plateau from about 512; GPUs need thousands to fill every multiprocessor.
SATURATING_SIZE = {"cpu": 1024, "cuda": 8192}
# A matmul slower than this many rounds is measured at a smaller size (module docstring), not below MIN_SIZE.
SLOW_MATMUL_ROUNDS = 10
MIN_SIZE = 128


@dataclasses.dataclass(frozen=True)
class MatmulPeak:
    """The median FLOP/s of ``repeats`` timed rounds of ``size`` x ``size`` matmuls, after ``warmup`` rounds, and
    the coefficient of variation of the rounds' FLOP/s (the matmul canary's repeat noise)."""

    flops_per_s: float
    size: int
    dtype: str
    device: str
    threads: int
    repeats: int
    warmup: int
    matmuls_per_repeat: int
    repeat_cv: float

    def describe(self) -> str:
        threads = f", {self.threads} intra-op threads" if self.device == "cpu" else ""
        return (
            f"torch.matmul {self.size}x{self.size} {self.dtype} on {self.device}{threads}: median of "
            f"{self.repeats} timed rounds of {self.matmuls_per_repeat} matmuls after {self.warmup} warm-up rounds "
            f"(2 n^3 FLOPs each)"
        )


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously): called before every clock read."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_matmuls(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, count: int) -> float:
    """Seconds for ``count`` back-to-back matmuls, the device synchronised before both clock reads."""
    synchronize(a.device)
    start = time.perf_counter()
    for _ in range(count):
        torch.matmul(a, b, out=out)
    synchronize(a.device)
    return time.perf_counter() - start


def _matrices(device: torch.device, dtype: torch.dtype, size: int) -> tuple[torch.Tensor, ...]:
    """Two seeded ``size`` x ``size`` operands and the output buffer."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device, dtype)
    b = torch.randn(size, size, generator=generator).to(device, dtype)
    return a, b, torch.empty(size, size, device=device, dtype=dtype)


def _timed_rounds(
    device: torch.device, dtype: torch.dtype, size: int, repeats: int, warmup: int, round_s: float, shrink: bool
):
    """(size measured, matmuls per round, seconds of each timed round); the matrices are freed on return."""
    a, b, out = _matrices(device, dtype, size)
    _time_matmuls(a, b, out, 1)  # the first call pays for library and kernel set-up
    one = _time_matmuls(a, b, out, 1)
    if shrink and one > SLOW_MATMUL_ROUNDS * round_s:
        # The work grows as size³: the size of which one matmul fills about a round, in steps of 64.
        size = max(MIN_SIZE, int(size * (round_s / one) ** (1 / 3)) // 64 * 64)
        a, b, out = _matrices(device, dtype, size)
        _time_matmuls(a, b, out, 1)
        one = _time_matmuls(a, b, out, 1)
    matmuls = max(1, round(round_s / max(one, 1e-9)))
    for _ in range(warmup):
        _time_matmuls(a, b, out, matmuls)
    return size, matmuls, [_time_matmuls(a, b, out, matmuls) for _ in range(repeats)]


def measure_matmul_peak(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    size: int | None = None,
    repeats: int = 5,
    warmup: int = 1,
    round_s: float = 0.04,
) -> MatmulPeak:
    """Measure the dense matmul FLOP/s of ``device`` at ``dtype`` (about ``(warmup + repeats) x round_s`` seconds).

    One round is as many back-to-back matmuls as fill about ``round_s`` (sized from one matmul after an
    untimed first call), so the clock reads cost nothing next to the work. Without a ``size``, the device's
    saturating size, or a smaller one where a matmul there lasts more than ``SLOW_MATMUL_ROUNDS`` rounds.
    """
    device = torch.device(device)
    if repeats < 1 or warmup < 1:
        raise ValueError(f"repeats ({repeats}) and warmup ({warmup}) must be at least 1")
    saturating = SATURATING_SIZE.get(device.type, SATURATING_SIZE["cuda"])
    size, matmuls, seconds = _timed_rounds(
        device, dtype, size or saturating, repeats, warmup, round_s, shrink=size is None
    )
    if device.type == "cuda":
        torch.cuda.empty_cache()  # leave the memory to the trial (or to another framework in this process)
    rates = [2.0 * size**3 * matmuls / round_seconds for round_seconds in seconds]
    return MatmulPeak(
        flops_per_s=2.0 * size**3 * matmuls / statistics.median(seconds),
        size=size,
        dtype=str(dtype).removeprefix("torch."),
        device=str(device),
        threads=torch.get_num_threads(),
        repeats=repeats,
        warmup=warmup,
        matmuls_per_repeat=matmuls,
        repeat_cv=statistics.stdev(rates) / statistics.fmean(rates) if repeats > 1 else 0.0,
    )
