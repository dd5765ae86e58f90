"""Time the import of the whole MLPerf HPC v3.0 round into the embedded results store, and its peak memory
(goal: <= 30 s).

    .venv/bin/python bench/import_round.py [--archive PATH | --round FOLDER] [--url STORE_URL]

The round is ../shared/data/mlperf-hpc-v3.0.tar.xz (the whole round as MLCommons publishes it: every submitter,
strong and weak scaling, open and closed, 1 112 files, 38 MB; ``--round`` for a round folder of your own),
extracted into a temporary folder before the clock starts. The timed part is ``mlcampaign import-mlperf``'s:
reading and scoring the round as the result_summarizer does (the compliance checker on every log, time to
train, olympic scores, scaling.json factors, weak-scaling figures, the RCP verdicts of the closed folders),
counting DeepCAM's and CosmoFlow's FLOPs at the MLPerf model size (once a process; torch imported inside the
clock), and one transaction per published run into a new store. Timed separately: importing the same round
again (read and scored again, nothing written). Memory: the process's peak resident set
(``resource.getrusage``: torch, mlperf-logging and the round's parsed logs), and the peak of what the import
itself allocates in Python (``tracemalloc``, in a second import into another new store: tracing slows it, so
it is not the timed one).
"""

import argparse
import os
import resource
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlcampaign.history.published_rounds import import_round, read_round  # noqa: E402
from mlcampaign.history.store import open_store  # noqa: E402

ARCHIVE = Path(os.environ.get("MLCAMPAIGN_SHARED", REPO.parent / "shared")) / "data" / "mlperf-hpc-v3.0.tar.xz"
GOAL_S = 30.0


def round_folder(arguments, scratch: Path) -> Path:
    if arguments.round is not None:
        return arguments.round
    with tarfile.open(arguments.archive) as archive:
        archive.extractall(scratch, filter="data")
    return scratch / "hpc_results_v3.0"


def timed_import(folder: Path, url: str):
    started, cpu = time.perf_counter(), time.process_time()
    with open_store(url) as store:
        report = import_round(read_round(folder), store)
    return report, time.perf_counter() - started, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archive", type=Path, default=ARCHIVE, help="the round's archive (default: %(default)s)")
    parser.add_argument("--round", type=Path, help="a round folder instead of the archive")
    parser.add_argument("--url", help="an empty store to import into (default: a new SQLite file)")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = round_folder(arguments, Path(scratch))
        files = [path for path in folder.rglob("*") if path.is_file()]
        logs = sum(1 for path in files if path.name.startswith("result_"))
        size = sum(path.stat().st_size for path in files)
        url = arguments.url or f"sqlite:///{scratch}/history.db"
        print(f"round: {folder.name}: {len(files)} files, {logs} result logs, {size / 1e6:.0f} MB")
        print(f"store: {'SQLite file in a temporary directory' if arguments.url is None else url}")
        report, wall, cpu = timed_import(folder, url)
        counts = report.counts()
        assert not report.problems, [str(problem) for problem in report.problems]
        print(
            f"import: {wall:.2f} s wall, {cpu:.2f} s CPU, {logs / wall:.0f} logs/s; {counts['runs_stored']} published "
            f"runs, {counts['logs_added']} logs stored, {counts['logs_present']} present already; skipped: "
            f"{counts['skipped']} (goal {GOAL_S:.0f} s: ratio {wall / GOAL_S:.2f})"
        )
        again, wall_again, _ = timed_import(folder, url)
        assert again.counts()["runs_present"] == counts["runs_stored"] and again.counts()["logs_added"] == 0
        print(f"import the same round again (nothing new): {wall_again:.2f} s")
        print(
            f"peak resident memory of the process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
        )
        tracemalloc.start()
        timed_import(folder, f"sqlite:///{scratch}/traced.db")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"peak Python allocations of an import (tracemalloc): {peak / 1e6:.0f} MB")
        if not arguments.url:
            print(f"store file: {Path(scratch, 'history.db').stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
