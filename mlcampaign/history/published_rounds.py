"""MLPerf HPC result rounds as published runs: read a round folder, score it as mlperf-logging's
``result_summarizer`` does, and put it into the results store (``mlcampaign import-mlperf``).

A round folder is a clone of a round's repository (mlcommons/hpc_results_v3.0), or any folder in its
layout::

    <submitter>/systems/<system>.json
    <submitter>/results/<system>/{strong,weak}/<benchmark>/result_*.txt   (+ scaling.json, package_checker_params)

One published run per (round, submitter, system); one record per distinct result log
(mlcampaign.history.store.published). Every figure is mlperf-logging's: per log the summarizer's time to
train (run_start to run_stop) and instance scale; per strong-scaling folder its score
(``_compute_olympic_average`` of the counted runs, a run it drops counting as the slowest, times
``_get_scaling_factor``: scaling.json as the round has it); per weak-scaling folder the number of models,
their instance scale and the time to train all of them (first run_start to last run_stop), with the
throughput the HPC rules define (models per minute); for a closed division the RCP checker's verdict,
normalisation factor, global batch and olympic mean of epochs, as the summarizer's detailed table has them
(the logs as it reads them: mlcampaign.records.mlperf.result_logs; the scores:
mlcampaign.records.mlperf.scores).
Nothing is written into the round folder: the summarizer's RCP step rewrites scaling.json where it reads
(set_scaling), which this never does.

Bad input is named (``Problem``: the path, what is wrong, what is left out) and only it is left out: a log
that is truncated, does not parse, has no run_start or run_stop, stopped aborted or fails the compliance
checker (its folder's score still counts it as the summarizer does); a systems JSON that is missing,
malformed or incomplete (the run of that system); a file or folder not in the layout; a link that leads
out of the round folder (never followed). A benchmark that mlperf-logging has no rules for is read as far
as its logs pass the checker: none do, so each is named.

FLOPs: where the project has the benchmark's model (CosmoFlow, DeepCAM), its FLOPs per sample are counted
at the MLPerf model size (the registry's model at its builder's defaults, the counter of
mlcampaign.measure.flops: no training runtime) and kept with the score, for Valid FLOPS beside the project's runs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import tempfile
from pathlib import Path

from mlperf_logging.benchmark_meta import get_result_file_counts
from mlperf_logging.result_summarizer import result_summarizer

from mlcampaign.history.store import ResultsStore
from mlcampaign.history.store.errors import PublishedRunConflictError
from mlcampaign.history.store.published import PublishedIngestResult, PublishedLog, PublishedRun
from mlcampaign.plan import registry
from mlcampaign.records.mlperf import result_logs
from mlcampaign.records.mlperf.result_logs import USAGE, ResultLog, ResultLogError
from mlcampaign.records.mlperf.scores import library_rcp, rcp_block, rcp_failure, readings_rcp, strong_score, weak_score
from mlcampaign.records.mlperf.system_descriptions import read_system_description

SCALINGS = ("strong", "weak")
# What a benchmark folder may hold besides result_*.txt: the review committee's RCP normalisation, the
# package checker's bypass flags, power logs.
BENCHMARK_FOLDER_EXTRAS = frozenset({"scaling.json", "package_checker_params", "power"})
SYSTEM_FOLDER_EXTRAS = frozenset({"privateid.json", "package_checker_params"})
SUBMITTER_FOLDER_EXTRAS = frozenset({"benchmarks", "README.md", "README"})
RESULT_FILE = re.compile(r"result_[^/]*\.txt")


class RoundError(ValueError):
    """A round folder that cannot be read at all (not a folder, no round name); the message says why."""


@dataclasses.dataclass(frozen=True)
class Problem:
    path: str  # relative to the round folder
    what: str
    left_out: str  # "log", "system" (the published run of that system), "path"

    def __str__(self) -> str:
        return f"{self.path}: {self.what} ({self.left_out} left out)"


@dataclasses.dataclass
class Round:
    name: str
    ruleset: str
    root: Path
    runs: list[PublishedRun]
    problems: list[Problem]


def round_name_of(folder: Path, given: str | None) -> str:
    """The round's name: ``given``, else the last ``v<major>.<minor>`` in the folder's path."""
    if given is not None:
        return given
    found = result_logs.round_in_path(folder)
    if found is None:
        raise RoundError(
            f"{folder}: no round name in its path (e.g. hpc_results_v3.0): give it (--round v3.0); "
            f"mlperf-logging has rules for {', '.join(result_logs.ROUND_RULESETS)}"
        )
    return found


class _RoundReader:
    """One walk over a round folder (``read_round``)."""

    def __init__(self, root: Path, name: str, ruleset: str, source: str, scratch: Path) -> None:
        self.root = root
        self.source = source.rstrip("/")
        self.name = name
        self.ruleset = ruleset
        self.scratch = scratch
        self.problems: list[Problem] = []
        self.required = get_result_file_counts(USAGE)

    def problem(self, path: Path, what: str, left_out: str) -> None:
        self.problems.append(Problem(str(path.relative_to(self.root)), what, left_out))

    def inside(self, path: Path) -> bool:
        return Path(os.path.realpath(path)).is_relative_to(self.root)

    def entries(self, folder: Path) -> list[Path]:
        """The folder's entries, sorted; a link that leads out of the round is named and never followed."""
        kept = []
        for entry in sorted(folder.iterdir()):
            if entry.is_symlink() and not self.inside(entry):
                self.problem(entry, f"a link that leads out of the round folder (to {os.path.realpath(entry)})", "path")
                continue
            kept.append(entry)
        return kept

    def runs(self) -> list[PublishedRun]:
        runs = []
        for submitter in self.entries(self.root):
            if submitter.name.startswith(".") or not submitter.is_dir():
                continue  # the repository's own files (README.md, LICENSE.md, .git)
            results, systems = submitter / "results", submitter / "systems"
            if not results.is_dir() or not systems.is_dir():
                self.problem(submitter, "not a submitter folder: it has no results/ and systems/", "path")
                continue
            for entry in self.entries(submitter):
                if entry.name not in {"results", "systems"} | SUBMITTER_FOLDER_EXTRAS:
                    self.problem(entry, "not in the round layout (a submitter folder holds results/, systems/)", "path")
            for system in self.entries(results):
                if not system.is_dir():
                    self.problem(system, "not in the round layout: results/ holds one folder per system", "path")
                    continue
                run = self.run(submitter, system, systems / f"{system.name}.json")
                if run is not None:
                    runs.append(run)
        return runs

    def run(self, submitter: Path, system: Path, description_path: Path) -> PublishedRun | None:
        if description_path.is_symlink() and not self.inside(description_path):
            self.problem(description_path, "a link that leads out of the round folder", "system")
            return None
        try:
            description = read_system_description(description_path, self.ruleset)
        except ResultLogError as error:
            self.problem(description_path, str(error).removeprefix(f"{description_path}: "), "system")
            return None
        logs, scores = [], []
        for scaling in self.entries(system):
            if scaling.name in SYSTEM_FOLDER_EXTRAS:
                continue
            if scaling.name not in SCALINGS or not scaling.is_dir():
                self.problem(scaling, "not in the round layout: results/<system>/ holds strong/ and weak/", "path")
                continue
            for benchmark in self.entries(scaling):
                if not benchmark.is_dir():
                    self.problem(benchmark, "not in the round layout: a <benchmark>/ folder is expected here", "path")
                    continue
                score, folder_logs = self.benchmark_folder(scaling.name, benchmark, description)
                if score is not None:
                    scores.append(score)
                    logs += folder_logs
        source = f"{self.source}/{submitter.name}/results/{system.name}"
        return PublishedRun(self.name, submitter.name, system.name, source, description, logs, scores)

    def benchmark_folder(self, scaling: str, folder: Path, description: dict) -> tuple[dict | None, list[PublishedLog]]:
        """The folder's score and its logs that are kept (None, [] for a folder without a result log)."""
        escaped = [
            e for e in folder.iterdir() if e.is_symlink() and RESULT_FILE.fullmatch(e.name) and not self.inside(e)
        ]
        files = []
        for entry in self.entries(folder):
            if RESULT_FILE.fullmatch(entry.name) and entry.is_file():
                files.append(entry)
            elif entry.name not in BENCHMARK_FOLDER_EXTRAS:
                self.problem(entry, "not in the round layout: a benchmark folder holds result_<n>.txt files", "path")
        if not files and not escaped:
            self.problem(folder, "a benchmark folder without result_<n>.txt files", "path")
            return None, []
        benchmark = folder.name
        read = []
        for path in files:
            log = result_logs.read_result_log(path.read_bytes(), self.ruleset)
            read.append((path, log))
            if log.problem is not None:
                self.problem(path, log.problem, "log")
        kept = []
        for path, log in read:
            if log.problem is not None:
                continue
            record = result_logs.log_record(log, self.ruleset)
            if record["benchmark"] != benchmark:
                self.problem(
                    path, f"submission_benchmark {record['benchmark']!r} is not its folder's {benchmark!r}", "log"
                )
                continue
            kept.append(PublishedLog(scaling, benchmark, path.name, record))
        counted = [log for _, log in read if log.counted]
        # The summarizer follows a link out of the round (it globs result_*.txt): such a log is not read
        # here and counts as a run it drops, as it drops anything that is not a compliant log.
        dropped = len(read) - len(counted) + len(escaped)
        score = {
            "scaling": scaling,
            "benchmark": benchmark,
            "division": description["division"],
            "runs": len(read) + len(escaped),
        }
        score["required_runs"] = self.required.get(benchmark)
        if scaling == "strong":
            score |= strong_score([log.time_to_train_min for log in counted], dropped, self.scaling_factor(folder))
        else:
            score |= weak_score(counted, self.required.get(benchmark))
        if description["division"] == "closed":
            rcp = self.rcp_verdict(folder, files, read, escaped)
            score |= (
                rcp if scaling == "strong" else {key: rcp[key] for key in ("rcp", "rcp_message", "rcp_norm_factor")}
            )
        flops = full_size_flops(benchmark)
        if flops is not None:
            score["flops"] = flops
        return score, kept

    def scaling_factor(self, folder: Path) -> float | None:
        """scaling.json's factor as the summarizer reads it (``_get_scaling_factor``; 1 without the file); None,
        named, where it cannot be read (the summarizer would crash) or leads out of the round."""
        path = folder / "scaling.json"
        if path.is_symlink() and not self.inside(path):
            return None  # named by entries()
        try:
            return float(result_summarizer._get_scaling_factor(str(folder)))
        except (TypeError, ValueError, KeyError) as error:  # the library's JSON reader raises TypeError
            self.problem(
                path, f"not a scaling factor ({type(error).__name__}: {error}): the folder has no score", "path"
            )
            return None

    def rcp_verdict(
        self, folder: Path, files: list[Path], read: list[tuple[Path, ResultLog]], escaped: list[Path]
    ) -> dict:
        """The summarizer's RCP block for a closed folder (``rcp_block``); from the logs' readings, or
        from the library's check_directory on a copy of the folder where a log does not parse."""
        if escaped:
            return rcp_failure(f"a result log links out of the round folder ({escaped[0].name}): not read")
        if any(log.rcp is None for _, log in read):
            copy = Path(tempfile.mkdtemp(dir=self.scratch))
            for path in files:
                shutil.copyfile(path, copy / path.name)
            return rcp_block(lambda: library_rcp(copy, self.ruleset))
        return rcp_block(lambda: readings_rcp([log.rcp for _, log in read], self.ruleset, self.scratch))


@functools.cache
def full_size_flops(benchmark: str) -> dict | None:
    """FLOPs per trained and per evaluated sample of an MLPerf HPC benchmark at the MLPerf model size: the
    project's model of that benchmark (its registry entry) at its builder's defaults, counted as trials
    count theirs. None where the project has no model of the benchmark (oc20, openfold)."""
    names = list(registry.mlperf_models(USAGE, benchmark))
    if not names:
        return None
    # Imported here: the counter needs torch, which a round of benchmarks the project has no model of never does.
    from mlcampaign.measure.flops import count_flops, flop_count_key

    spec = registry.models()[names[0]].spec()
    shape = spec.sample_shape()
    counted = count_flops(spec.counted_work or spec.build, {}, shape)
    return {
        "model": names[0],
        "sample_shape": list(shape),
        "train_per_sample": counted.train_per_sample,
        "forward_per_sample": counted.forward_per_sample,
        "counted_with": flop_count_key(names[0], {}, shape),
    }


def read_round(folder: Path, round_name: str | None = None, source: str | None = None) -> Round:
    """Read a round folder (never writing into it): its published runs and the problems named. ``source``:
    where the round is published (e.g. https://github.com/mlcommons/hpc_results_v3.0/tree/main), which each
    run's source extends with <submitter>/results/<system>; default: the folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RoundError(f"{folder}: not a folder (a round folder holds <submitter>/results/ and <submitter>/systems/)")
    name = round_name_of(folder, round_name)
    try:
        ruleset = result_logs.ruleset_of(name)
    except ResultLogError as error:
        raise RoundError(str(error)) from None
    root = Path(os.path.realpath(folder))
    with tempfile.TemporaryDirectory(prefix="mlcampaign-rcp-") as scratch, result_logs.cached_rules():
        reader = _RoundReader(root, name, ruleset, source or str(root), Path(scratch))
        runs = reader.runs()
    if not runs and not reader.problems:
        raise RoundError(f"{folder}: no <submitter>/results/<system>/ in it: not a round folder")
    return Round(name, ruleset, root, runs, reader.problems)


def import_round(round_: Round, store: ResultsStore) -> tuple[list[PublishedIngestResult], list[Problem]]:
    """Put every run of a round into the store, each atomically; a run stored with other content is named
    (a Problem) and left as stored. Returns the results and those problems."""
    results, problems = [], []
    for run in round_.runs:
        try:
            results.append(store.ingest_published(run))
        except PublishedRunConflictError as error:
            problems.append(Problem(f"{run.submitter}/results/{run.system}", str(error), "system"))
    return results, problems
