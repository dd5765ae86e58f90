"""Time the import of a whole MLPerf HPC results round into the embedded results store (goal: <= 60 s).

    .venv/bin/python bench/import_round.py [--subset PATH] [--copies 20] [--url STORE_URL]

The round is made before the clock starts: the v3.0 subset of ../shared/data (55 result logs of 6 systems,
5.8 MB) repeated under other system names (``--copies`` times: 20 gives 1 100 logs, 116 MB, 120 published
runs), each copy's logs naming their own system (``submission_platform``), so that no two logs are byte
for byte alike and none is read once for several (as in a real round, where every log is its own run).
The timed part is ``mlcampaign import-mlperf``'s: reading and scoring the round as the result_summarizer
does (the compliance checker on every log, time to train, olympic scores, scaling.json factors, the RCP
verdicts of the closed folders), counting DeepCAM's and CosmoFlow's FLOPs at the MLPerf model size (once a
process; torch imported inside the clock), and one transaction per published run into a new store.
Timed separately: importing the same round again (nothing new, nothing written).
"""

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlcampaign.history.published_rounds import import_round, read_round  # noqa: E402
from mlcampaign.history.store import open_store  # noqa: E402

SUBSET = Path(os.environ.get("MLCAMPAIGN_SHARED", REPO.parent / "shared")) / "data" / "mlperf-hpc-v3.0-subset"
GOAL_S = 60.0


def make_round(subset: Path, copies: int, root: Path) -> tuple[int, int]:
    """``copies`` of every system of ``subset`` under ``root`` (round v3.0), copy k's systems named
    <system>-c<k>, its logs' submission_platform too; returns (logs, bytes)."""
    logs = size = 0
    for submitter in sorted(path for path in subset.iterdir() if (path / "results").is_dir()):
        for system in sorted((submitter / "results").iterdir()):
            description = (submitter / "systems" / f"{system.name}.json").read_text()
            for copy in range(copies):
                name = f"{system.name}-c{copy:02d}"
                (root / submitter.name / "systems").mkdir(parents=True, exist_ok=True)
                (root / submitter.name / "systems" / f"{name}.json").write_text(description)
                for log in system.rglob("result_*.txt"):
                    target = root / submitter.name / "results" / name / log.relative_to(system)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    text = log.read_text(encoding="latin-1")
                    marker = '"key": "submission_platform", "value": "'
                    at = text.find(marker)
                    if at >= 0:  # HPE's logs have a placeholder name; every copy names its own system
                        end = text.index('"', at + len(marker))
                        text = text[: at + len(marker)] + name + text[end:]
                    target.write_text(text, encoding="latin-1")
                    logs, size = logs + 1, size + target.stat().st_size
                for extra in system.rglob("scaling.json"):
                    target = root / submitter.name / "results" / name / extra.relative_to(system)
                    shutil.copyfile(extra, target)
    return logs, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subset", type=Path, default=SUBSET)
    parser.add_argument("--copies", type=int, default=20)
    parser.add_argument("--url", help="an empty store to import into (default: a new SQLite file)")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "hpc_results_v3.0"
        logs, size = make_round(arguments.subset, arguments.copies, root)
        url = arguments.url or f"sqlite:///{scratch}/history.db"
        print(f"round: {logs} result logs, {size / 1e6:.0f} MB, {arguments.copies} copies of {arguments.subset.name}")
        print(f"store: {'SQLite file in a temporary directory' if arguments.url is None else url}")
        started, cpu = time.perf_counter(), time.process_time()
        read = read_round(root)
        with open_store(url) as store:
            results, conflicts = import_round(read, store)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        added = sum(result.logs_added for result in results)
        assert not read.problems and not conflicts, (read.problems, conflicts)
        print(
            f"import: {wall:.2f} s wall, {cpu:.2f} s CPU, {logs / wall:.0f} logs/s; {len(results)} published runs, "
            f"{added} logs stored (goal {GOAL_S:.0f} s: ratio {wall / GOAL_S:.2f})"
        )
        started = time.perf_counter()
        with open_store(url) as store:
            again, _ = import_round(read_round(root), store)
        assert not any(result.run_created or result.logs_added for result in again)
        print(f"import the same round again (nothing new): {time.perf_counter() - started:.2f} s")
        print(f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
        if not arguments.url:
            print(f"store file: {Path(scratch, 'history.db').stat().st_size / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
