"""Collectives of a torch trial, one class per backend, and the timer of DDP's gradient all-reduce.

``SingleProcess``, ``TorchDistributed`` (gloo, NCCL or RCCL) and ``HorovodCollectives`` share one
interface (``sum_``, ``broadcast_buffers``, ``gather``, ``close``) that mlcampaign.trial.torch.trial uses
for evaluation sums, BatchNorm statistics and the per-rank evidence. ``AllreduceTimer`` wraps a DDP
communication hook to time each gradient bucket's all-reduce (hidden or not behind backward).
"""

from __future__ import annotations

import functools
import math
import time

import torch


class AllreduceTimer:
    """A DDP communication hook that times the hook it wraps, bucket by bucket.

    Each interval runs from the hook's call (the bucket's gradients are ready; a compressing hook
    casts them first) to the completion of the all-reduce future. On CUDA the ends are CUDA events
    recorded in the future's callback, which runs on streams synchronised with the collective.
    """

    def __init__(self, hook, device: torch.device):
        self.hook = hook
        functools.update_wrapper(self, hook)  # DDP checks the hook's name (bf16 needs a recent NCCL)
        self.cuda = device.type == "cuda"
        self.intervals: list[tuple] = []

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def __call__(self, state, bucket):
        launched = self._mark()

        def finished(future):
            self.intervals.append((launched, self._mark()))
            return future.value()

        return self.hook(state, bucket).then(finished)

    def take_step(self) -> tuple[float, float]:
        """(exposed, in flight) seconds of the step just synchronised; clears the intervals."""
        intervals, self.intervals = self.intervals, []
        if not intervals:
            return 0.0, 0.0
        if self.cuda:
            origin = intervals[0][0]
            intervals = [(origin.elapsed_time(a) / 1e3, origin.elapsed_time(b) / 1e3) for a, b in intervals]
        intervals.sort()
        in_flight, covered_until = 0.0, -math.inf
        for start, end in intervals:
            in_flight += max(0.0, end - max(start, covered_until))
            covered_until = max(covered_until, end)
        exposed = max(0.0, max(end for _, end in intervals) - max(start for start, _ in intervals))
        return exposed, in_flight


class SingleProcess:
    """Collectives of a one-process trial."""

    description = None

    def sum_(self, tensor: torch.Tensor) -> None:
        pass

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        pass

    def gather(self, value: dict) -> list[dict]:
        return [value]

    def close(self) -> None:
        pass


class TorchDistributed:
    """Collectives of torch.distributed (gloo, NCCL or RCCL)."""

    def __init__(self, description: str):
        self.description = description

    def sum_(self, tensor: torch.Tensor) -> None:
        torch.distributed.all_reduce(tensor)

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        for buffer in module.buffers():
            torch.distributed.broadcast(buffer, src=0)

    def gather(self, value: dict) -> list[dict]:
        values: list = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(values, value)
        return values

    def close(self) -> None:
        torch.distributed.destroy_process_group()


class HorovodCollectives:
    """Collectives of horovod.torch."""

    description = "horovod"

    def __init__(self, hvd, compression: str):
        self.hvd = hvd
        self.compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[compression]

    def sum_(self, tensor: torch.Tensor) -> None:
        self.hvd.allreduce_(tensor, op=self.hvd.Sum)

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        for buffer in module.buffers():
            self.hvd.broadcast_(buffer, root_rank=0)

    def average_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        grads = [p.grad for p in parameters if p.grad is not None]
        for grad, reduced in zip(
            grads, self.hvd.grouped_allreduce(grads, op=self.hvd.Average, compression=self.compression), strict=True
        ):
            grad.copy_(reduced)

    def gather(self, value: dict) -> list[dict]:
        return self.hvd.allgather_object(value)

    def close(self) -> None:
        self.hvd.shutdown()
