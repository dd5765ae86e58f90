"""The file-system canary: the read rate of a bounded sample of the trial's staged dataset (the files its
readers open, in the staged copy it trained from), by rank 0 after the timed training (MLPerf's clock starts
before anything touches the dataset).

The sample is the first files in the order the trial gives (by content hash: spread over the splits, the same in
every run of the dataset) up to SAMPLE_BYTES or MAX_FILES. Before each read the sample's page cache is dropped
where the operating system allows, with ``os.posix_fadvise(POSIX_FADV_DONTNEED)``, so that the rate is the file
system's, not memory's; ``method`` says whether that was possible. DONTNEED leaves dirty pages in memory, so
before the first drop a file changed within RECENT_S (its ctime: a copy keeps the mtime of its source; a dataset
staged just before is dirty until Linux writes it back, after 30 s by default) is written back with
``os.fdatasync`` (reads leave it clean for the later drops). Only those, and once: ext4 commits its journal on
every fdatasync, clean file or not, 3 ms a file (25 s for the 1 797 digits images four times over; 2 s for the
193 CosmoFlow files of a 16 MiB sample), hence also the MAX_FILES bound. A read opens each file, reads it in
CHUNK_BYTES chunks and closes it, and stops early once READ_BUDGET_S has passed (the bytes it read count); one
warm-up read (path lookups), then the median rate of three timed reads. A dataset without files (generated in
memory) has no such canary.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from mlcampaign.measure.canaries.probe import (
    AFTER_TIMED,
    CanaryProbe,
    CanaryReading,
    CanaryUnavailable,
    TrialMachine,
    median_and_cv,
)

MIB = 1 << 20
SAMPLE_BYTES = 8 * MIB
MAX_FILES = 64
RECENT_S = 60.0
READ_BUDGET_S = 0.04
CHUNK_BYTES = MIB
REPEATS, WARMUP = 3, 1


def sample_files(files: Sequence[Path], limit: int = SAMPLE_BYTES) -> tuple[list[Path], int, set[Path]]:
    """The first of ``files`` up to ``limit`` bytes (the one that crosses it included) or MAX_FILES, their bytes,
    and those among them changed within RECENT_S."""
    sample, total, recent = [], 0, set()
    for path in files[:MAX_FILES]:
        if total >= limit:
            break
        path, status = Path(path), os.stat(path)
        sample.append(path)
        total += status.st_size
        if time.time() - status.st_ctime < RECENT_S:
            recent.add(path)
    return sample, total, recent


def drop_page_cache(files: Sequence[Path], recent: set[Path]) -> str | None:
    """Drop the page cache of ``files`` (``recent`` ones written back first); None where it was done, else why
    it could not be."""
    if not hasattr(os, "posix_fadvise"):
        return "os.posix_fadvise is not available on this platform"
    for path in files:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            if path in recent:
                os.fdatasync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as error:
            return f"{path}: {error.strerror or error}"
        finally:
            os.close(descriptor)
    return None


def _read(files: Sequence[Path], buffer: bytearray, budget_s: float) -> tuple[int, float]:
    """(bytes, seconds) of reading ``files`` in turn into ``buffer``, stopping once ``budget_s`` has passed."""
    view, read = memoryview(buffer), 0
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as file:
            while chunk := file.readinto(view):
                read += chunk
                if time.perf_counter() - start >= budget_s:
                    return read, time.perf_counter() - start
    return read, time.perf_counter() - start


def measure_dataset_read(files: Sequence[Path], repeats: int = REPEATS) -> CanaryReading:
    if not files:
        raise CanaryUnavailable("the dataset has no files (generated in memory)")
    sample, total, recent = sample_files(files)
    if total == 0:
        raise CanaryUnavailable(f"the {len(sample)} sampled dataset files are empty")
    buffer = bytearray(CHUNK_BYTES)
    rates, why_not = [], None
    for attempt in range(WARMUP + repeats):
        why_not = drop_page_cache(sample, recent if attempt == 0 else set())
        read, seconds = _read(sample, buffer, READ_BUDGET_S)
        if attempt >= WARMUP:
            rates.append(read / seconds)
    value, cv = median_and_cv(rates)
    cache = (
        "its page cache dropped before each read (posix_fadvise POSIX_FADV_DONTNEED, after os.fdatasync where "
        "changed within the last minute): the file system's rate"
        if why_not is None
        else f"its page cache NOT dropped ({why_not}): possibly the rate of memory"
    )
    method = (
        f"read of {len(sample)} staged dataset files ({total / MIB:.3g} MiB; open, {CHUNK_BYTES // MIB} MiB reads, "
        f"close; at most {READ_BUDGET_S * 1e3:.0f} ms a read) by rank 0 after the timed training, {cache}; "
        f"median of {repeats} timed reads after {WARMUP} warm-up read"
    )
    return CanaryReading(value, repeats, cv, method)


def _measure(machine: TrialMachine) -> CanaryReading:
    return measure_dataset_read(machine.dataset_files)


PROBE = CanaryProbe("dataset_read_bytes_per_s", AFTER_TIMED, every_rank=False, measure=_measure)
