"""mlperf-logging's own command lines on copies of MLPerf HPC submission folders, for the tests of the round
import and the submission export; and the results rounds of ../shared/data: the v3.0 subset, and the whole
v3.0 round's archive, extracted into a temporary folder (conftest's session fixtures ``whole_round``,
``whole_round_store``, ``whole_round_summarizer``), never into the project.

The result_summarizer and package_checker WRITE into the folder they read (their RCP step deletes and
rewrites <benchmark>/scaling.json) and into their working directory: they only ever run here on a copy in a
temporary folder, never on ../shared.
"""

import csv
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import REPO

# ../shared beside the checkout (MLCAMPAIGN_SHARED where a checkout is elsewhere, e.g. a git worktree).
SHARED = Path(os.environ.get("MLCAMPAIGN_SHARED", REPO.parent / "shared"))
SUBSET = SHARED / "data" / "mlperf-hpc-v3.0-subset"
needs_subset = pytest.mark.skipif(
    not SUBSET.is_dir(), reason=f"{SUBSET} not found (../shared/data beside the checkout, or MLCAMPAIGN_SHARED)"
)
# The whole v3.0 round as MLCommons publishes it (../shared/data/README.md): 1 112 files, 38 MB unpacked.
ROUND_ARCHIVE = SHARED / "data" / "mlperf-hpc-v3.0.tar.xz"
needs_round = pytest.mark.skipif(not ROUND_ARCHIVE.is_file(), reason=f"{ROUND_ARCHIVE} not found")
BENCHMARKS = ("cosmoflow", "deepcam", "oc20", "openfold")
PACKAGE_CHECKER_SUCCESS = "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !"


def writable_copy(source: Path, target: Path) -> Path:
    """``source`` copied to ``target`` (the shared files are read-only; a test's copy is its own)."""
    shutil.copytree(source, target, symlinks=True)
    for path in [target, *target.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return target


def extract_round(target: Path) -> Path:
    """ROUND_ARCHIVE extracted into ``target`` (never into the project): its hpc_results_v3.0/ folder, made
    read-only so that a test cannot change what others read."""
    with tarfile.open(ROUND_ARCHIVE) as archive:
        archive.extractall(target, filter="data")
    folder = target / "hpc_results_v3.0"
    for path in [*folder.rglob("*"), folder]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return folder


def store_copy(url: str, target: Path) -> str:
    """A copy of the SQLite store at ``url`` in ``target`` (a test that writes works on its own)."""
    copy = target / "history.db"
    shutil.copyfile(url.removeprefix("sqlite:///"), copy)
    return f"sqlite:///{copy}"


def _csv_sections(text: str) -> list[list[dict]]:
    """The summarizer's CSV: the strong table, then the weak one appended with its own header line."""
    sections: list[list[str]] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("division,"):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    return [list(csv.DictReader(io.StringIO("".join(section)))) for section in sections]


def _system_folder(row: dict) -> str:
    # The CSV's "system" is the JSON's system_name; the folder is named in details_url.
    return row["details_url"].rsplit("/", 1)[-1].removesuffix(".json")


def summarizer_figures(submitter: Path) -> dict[tuple[str, str, str], dict]:
    """``python -m mlperf_logging.result_summarizer <submitter> hpc 3.0.0`` on ``submitter`` (a copy: it
    writes there): per (system folder, scaling, benchmark) its figures, as text, from its CSV files."""
    work = submitter.parent
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlperf_logging.result_summarizer",
            submitter.name,
            "hpc",
            "3.0.0",
            "--csv",
            "summary.csv",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures: dict[tuple[str, str, str], dict] = {}
    summary = (work / "summary.csv").read_text() if (work / "summary.csv").exists() else ""
    for table in _csv_sections(summary):
        for row in table:
            for benchmark in BENCHMARKS:
                if row.get(benchmark):
                    figures[(_system_folder(row), "strong", benchmark)] = {"time_to_train": row[benchmark]}
                if row.get(f"{benchmark}:time_to_train_all"):
                    figures[(_system_folder(row), "weak", benchmark)] = {
                        key: row[f"{benchmark}:{key}"]
                        for key in ("time_to_train_all", "number_of_models", "instance_scale")
                    } | {key: row[key] for key in ("accelerators_count", "number_of_nodes")}
    detailed = work / "summary_detailed.csv"
    if detailed.exists():
        for row in csv.DictReader(detailed.open()):
            for benchmark in BENCHMARKS:
                if row.get(f"{benchmark}:time_to_train"):
                    figures[(_system_folder(row), "strong", benchmark)] |= {
                        key: row.get(f"{benchmark}:{key}", "")
                        for key in ("GBS", "samples_to_converge", "RCP", "rcp_scaling_factor")
                    }
    figures["stdout"] = result.stdout  # type: ignore[index]
    return figures


def package_checker(submitter: Path) -> tuple[bool, str]:
    """``python -m mlperf_logging.package_checker <submitter> hpc 3.0.0`` on ``submitter`` (a copy): its
    verdict and log. It exits 0 whatever it finds; the verdict is its "PACKAGE CHECKER FOUND ..." line."""
    log = submitter.parent / "package_checker.log"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlperf_logging.package_checker",
            submitter.name,
            "hpc",
            "3.0.0",
            "--log_output",
            log.name,
        ],
        cwd=submitter.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = log.read_text() if log.exists() else result.stdout + result.stderr
    verdicts = [line for line in text.splitlines() if "PACKAGE CHECKER FOUND" in line]
    return bool(verdicts) and PACKAGE_CHECKER_SUCCESS in verdicts[-1], text


def round_summarizer_figures(round_folder: Path, work: Path) -> dict[str, dict]:
    """``summarizer_figures`` of every submitter folder of ``round_folder``, each on its own copy under ``work``."""
    return {
        submitter.name: summarizer_figures(writable_copy(submitter, work / submitter.name / submitter.name))
        for submitter in sorted(path for path in round_folder.iterdir() if (path / "results").is_dir())
    }
