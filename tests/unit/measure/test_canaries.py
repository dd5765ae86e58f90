"""The canary probes: each gives a positive finite value with its repeat noise on a tiny size, or is absent with
its reason where it does not apply; the collective in a real 2-process gloo group; one probe per declared canary."""

import dataclasses
import io
import json
import math
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing

from mlcampaign.measure.canaries import probe as probe_module
from mlcampaign.measure.canaries.probe import (
    AFTER_TIMED,
    BEFORE_SETUP,
    BEFORE_TIMED,
    CanaryProbe,
    CanaryReading,
    CanaryUnavailable,
    TrialMachine,
    measure_canaries,
    probes,
)
from mlcampaign.measure.canaries.probes import allreduce, dataset_read, matmul, memory_triad
from mlcampaign.measure.roofline import measure_matmul_peak
from mlcampaign.plan.canaries import CANARIES

CPU = torch.device("cpu")
MIB = 1 << 20


def machine(**fields) -> TrialMachine:
    return TrialMachine(**({"device": CPU, "processes": 1, "local_processes": 1} | fields))


def test_every_declared_canary_has_one_probe_and_every_probe_a_declaration():
    assert set(probes()) == set(CANARIES)
    assert {probe.phase for probe in probes().values()} == {BEFORE_SETUP, BEFORE_TIMED, AFTER_TIMED}


def test_the_matmul_canary_is_the_roofline_reused():
    peak = measure_matmul_peak("cpu", torch.float32, size=128, repeats=3, warmup=1, round_s=0.01)
    reading = matmul.measure_matmul(machine(matmul_peak=peak))
    assert (reading.value, reading.repeats, reading.repeat_cv) == (peak.flops_per_s, 3, peak.repeat_cv)
    assert math.isfinite(peak.repeat_cv) and peak.repeat_cv >= 0
    assert peak.describe() in reading.method
    with pytest.raises(CanaryUnavailable, match="no roofline"):
        matmul.measure_matmul(machine())


def test_the_triad_on_a_tiny_array_is_a_bandwidth_with_its_noise():
    reading = memory_triad.measure_triad(CPU, size_bytes=2 * MIB, repeats=3)
    # Any memory of the last 20 years moves more than 100 MB/s; no CPU node moves 10 TB/s.
    assert 1e8 < reading.value < 1e13
    assert reading.repeats == 3 and math.isfinite(reading.repeat_cv) and reading.repeat_cv >= 0
    assert "3 arrays of 2 MiB" in reading.method and "3 x 8 x n bytes" in reading.method
    assert "warm-up round" in reading.method and f"{torch.get_num_threads()} intra-op threads" in reading.method


def _cache_index(root: Path, cpu: int, index: int, level: int, kind: str, size: str, shared: str) -> None:
    folder = root / f"cpu{cpu}" / "cache" / f"index{index}"
    folder.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (folder / name).write_text(f"{value}\n")


def test_the_last_level_cache_counts_each_instance_once(tmp_path):
    """Two sockets of two CPUs each: two L3 instances of 32 MiB, shared by their CPUs; L1 and L2 ignored."""
    for cpu in range(4):
        _cache_index(tmp_path, cpu, 0, 1, "Instruction", "32K", str(cpu))
        _cache_index(tmp_path, cpu, 1, 2, "Unified", "1024K", str(cpu))
        _cache_index(tmp_path, cpu, 2, 3, "Unified", "32M", "0-1" if cpu < 2 else "2-3")
    assert memory_triad.cpu_last_level_cache(tmp_path) == (64 * MIB, "L3, 2 instance(s) in sysfs")
    assert memory_triad.cpu_last_level_cache(tmp_path / "absent") == (None, "no cache in sysfs")


def test_the_arrays_exceed_the_cache_shared_by_the_nodes_processes(monkeypatch):
    monkeypatch.setattr(memory_triad, "cpu_last_level_cache", lambda: (96 * MIB, "L3"))
    alone, why = memory_triad.array_bytes(CPU, 1)
    assert alone == 4 * 96 * MIB // 3 and "together 4 x the 96 MiB cache" in why
    assert memory_triad.array_bytes(CPU, 4)[0] == 32 * MIB  # four processes share the cache, each runs a triad
    assert memory_triad.array_bytes(CPU, 64)[0] == memory_triad.MIN_ARRAY_BYTES
    monkeypatch.setattr(memory_triad, "cpu_last_level_cache", lambda: (None, "no cache in sysfs"))
    size, why = memory_triad.array_bytes(CPU, 1)
    assert size == 4 * memory_triad.DEFAULT_LLC_BYTES // 3 and "default of 256 MiB assumed" in why
    monkeypatch.setattr(memory_triad, "cpu_last_level_cache", lambda: (4096 * MIB, "L3"))
    assert memory_triad.array_bytes(CPU, 1)[0] == memory_triad.MAX_ARRAY_BYTES


def _staged(folder: Path, sizes: list[int]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for position, size in enumerate(sizes):
        path = folder / f"sample{position}.bin"
        path.write_bytes(os.urandom(size))
        files.append(path)
    return files


def test_the_dataset_read_of_a_folder_is_a_rate_of_the_file_system(tmp_path):
    files = _staged(tmp_path / "data", [256 * 1024] * 8)
    reading = dataset_read.measure_dataset_read(files)
    assert reading.value > 1e5 and reading.repeats == 3 and reading.repeat_cv >= 0
    assert "read of 8 staged dataset files (2 MiB" in reading.method
    assert "page cache dropped before each read" in reading.method  # Linux has posix_fadvise


def test_the_dataset_sample_is_bounded_and_says_when_the_cache_stays(tmp_path, monkeypatch):
    files = _staged(tmp_path / "data", [MIB] * 4)
    sample, total, recent = dataset_read.sample_files(files, 2 * MIB)
    assert sample == files[:2] and total == 2 * MIB and recent == set(files[:2])  # written just now
    many = _staged(tmp_path / "many", [16] * (dataset_read.MAX_FILES + 5))
    assert len(dataset_read.sample_files(many)[0]) == dataset_read.MAX_FILES
    # Files written just now may hold dirty pages, which DONTNEED keeps: each is written back once, not per read.
    synced = []
    monkeypatch.setattr(os, "fdatasync", lambda descriptor: synced.append(descriptor))
    dataset_read.measure_dataset_read(files)
    assert len(synced) == len(files)
    monkeypatch.delattr(os, "posix_fadvise")
    reading = dataset_read.measure_dataset_read(files)
    assert "page cache NOT dropped (os.posix_fadvise is not available on this platform)" in reading.method


def test_a_dataset_without_files_has_no_read_canary(tmp_path):
    with pytest.raises(CanaryUnavailable, match="no files"):
        dataset_read.measure_dataset_read([])
    with pytest.raises(CanaryUnavailable, match="empty"):
        dataset_read.measure_dataset_read(_staged(tmp_path / "data", [0, 0]))


def test_one_process_has_no_collective():
    with pytest.raises(CanaryUnavailable, match="one process"):
        allreduce.measure_allreduce(machine())


class GlooGroup:
    """A TrialGroup over the default torch.distributed group (the trial's adapter is tested with the trial)."""

    description = "gloo"

    def __init__(self, fail_prepare: bool):
        self.world_size = dist.get_world_size()
        self.fail_prepare = fail_prepare

    def prepare(self, buffer_bytes: int) -> None:
        if self.fail_prepare:
            raise RuntimeError("out of memory (simulated)")
        self.buffer = torch.zeros(buffer_bytes // 4)

    def allreduce(self) -> None:
        dist.all_reduce(self.buffer)

    def everyone(self, ok: bool) -> bool:
        flag = torch.tensor([0.0 if ok else 1.0])
        dist.all_reduce(flag)
        return flag.item() == 0.0


def _rank(rank: int, port: int, out: str, failing_rank: int | None) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        group = GlooGroup(fail_prepare=rank == failing_rank)
        try:
            result = dataclasses.asdict(allreduce.measure_allreduce(machine(processes=2, group=group), repeats=3))
        except CanaryUnavailable as reason:
            result = {"unavailable": str(reason)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _two_ranks(tmp_path: Path, failing_rank: int | None) -> list[dict]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.start_processes(
        _rank, args=(port, str(tmp_path), failing_rank), nprocs=2, start_method="spawn"
    )
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_the_collective_of_a_two_process_gloo_group_is_its_bus_bandwidth(tmp_path):
    first, second = _two_ranks(tmp_path, None)
    for reading in (first, second):
        assert reading["value"] > 1e6 and reading["repeats"] == 3 and reading["repeat_cv"] >= 0
        assert "8 MiB float32 buffer with gloo over 2 processes" in reading["method"]
        assert "each after a barrier" in reading["method"]


def test_a_rank_that_cannot_allocate_the_buffer_stops_every_rank_without_waiting(tmp_path):
    first, second = _two_ranks(tmp_path, 1)
    assert first == {"unavailable": "the buffer could not be allocated on every rank (on another rank)"}
    assert second["unavailable"].endswith("(RuntimeError: out of memory (simulated))")


def test_a_canary_that_fails_or_measures_nothing_is_absent_with_its_reason_in_the_log(monkeypatch):
    def reading(value: float):
        return lambda machine: CanaryReading(value, 3, 0.01, "stub")

    def broken(machine):
        raise RuntimeError("device lost")

    stubs = {
        "ok": CanaryProbe("ok", BEFORE_SETUP, every_rank=True, measure=reading(2.0)),
        "nan": CanaryProbe("nan", BEFORE_SETUP, every_rank=True, measure=reading(math.nan)),
        "zero": CanaryProbe("zero", BEFORE_SETUP, every_rank=True, measure=reading(0.0)),
        "broken": CanaryProbe("broken", BEFORE_SETUP, every_rank=True, measure=broken),
        "later": CanaryProbe("later", AFTER_TIMED, every_rank=True, measure=reading(1.0)),
        "rank0": CanaryProbe("rank0", BEFORE_SETUP, every_rank=False, measure=reading(1.0)),
    }
    monkeypatch.setattr(probe_module, "probes", lambda: stubs)
    log = io.StringIO()
    found = measure_canaries(list(stubs), BEFORE_SETUP, machine(), is_main=False, log=log)
    assert list(found) == ["ok"]
    lines = log.getvalue().splitlines()
    assert lines == [
        "canary nan: not measured: nan is no measurement (stub)",
        "canary zero: not measured: 0.0 is no measurement (stub)",
        "canary broken: not measured: its probe failed: RuntimeError: device lost",
    ]
    assert list(measure_canaries(list(stubs), BEFORE_SETUP, machine(), is_main=True, log=log)) == ["ok", "rank0"]
