"""MLPerf HPC result rounds as published runs: read a round folder, score it as mlperf-logging's
``result_summarizer`` does, and put it into the results store (``mlcampaign import-mlperf``).

A round folder is a clone of a round's repository (mlcommons/hpc_results_v3.0), or any folder in its
layout::

    <submitter>/systems/<system>.json
    <submitter>/results/<system>/{strong,weak}/<benchmark>/result_*.txt   (+ scaling.json)

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

What a round holds, in three kinds (``Round``):

- known content that is not a result (KNOWN_EXTRAS: the repositories' README and LICENSE files, hidden files
  such as .DS_Store, the submitters' code in benchmarks/, package_checker_params, the pruned_results/ the
  summarizer does not read, power logs, systems descriptions of systems without results): skipped and
  counted by kind (``Round.skipped``);
- notices (``Notice``), imported all the same: content the layout does not know (named, not read), and
  suspicious logs, scored as the summarizer scores them (bytes that are not UTF-8, a repeated run_start, a
  time to train of zero or less: mlcampaign.records.mlperf.result_logs.suspicions);
- faults (``Problem``): a log that is truncated, does not parse, has no run_start or run_stop, stopped
  aborted or fails the compliance checker; a systems JSON that is missing, malformed, incomplete or has a
  field of the wrong type or a count that is not positive; a scaling.json that cannot be read; a link that
  leads out of the round folder (never followed). A run with a fault is left out whole, nothing of it
  stored (``Round.left_out``, scored as far as the summarizer would score it), so that importing the round
  again once the fault is fixed adds the run. A benchmark that mlperf-logging has no rules for is read as
  far as its logs pass the checker: none do, so each is a fault.

Importing (``import_round``) is one transaction per run; a run stored before with other content (another
systems description, other logs, another score) is refused naming what differs, old and new, unless
``supersede`` (the stored one is kept in the store's superseded_published_runs). A log stored before under
another round or system (its twin: the same bytes) is stored once; where this round reads it otherwise,
that is a notice naming what differs.

FLOPs: where the project has the benchmark's model (CosmoFlow, DeepCAM), its FLOPs per sample are counted
at the MLPerf model size (the registry's model at its builder's defaults, the counter of
mlcampaign.measure.flops: no training runtime) and kept with the score, for Valid FLOPS beside the project's runs.
"""

from __future__ import annotations

import collections
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
from mlcampaign.history.store.checks import json_differences
from mlcampaign.history.store.errors import PublishedRunConflictError
from mlcampaign.history.store.published import PublishedIngestResult, PublishedLog, PublishedRun
from mlcampaign.plan import registry
from mlcampaign.records.mlperf import result_logs
from mlcampaign.records.mlperf.result_logs import USAGE, ResultLog, ResultLogError
from mlcampaign.records.mlperf.scores import library_rcp, rcp_block, rcp_failure, readings_rcp, strong_score, weak_score
from mlcampaign.records.mlperf.system_descriptions import read_system_description

SCALINGS = ("strong", "weak")
RESULT_FILE = re.compile(r"result_[^/]*\.txt")
# Known content of a round that is not a result: (where, name pattern, kind as the report counts it). "where":
# anywhere, a file at the round's top, a submitter folder, results/<system>/, a benchmark folder.
KNOWN_EXTRAS = (
    ("anywhere", re.compile(r"\..*"), "hidden files and folders (.DS_Store, .git, ...)"),
    ("anywhere", re.compile(r"(?i)(readme|license|licence)(\..*)?"), "README and LICENSE files"),
    ("anywhere", re.compile(r"package_checker_params"), "package_checker_params files"),
    ("round files", re.compile(r".*"), "the repository's own files at the round's top"),
    ("submitter", re.compile(r"benchmarks"), "benchmarks/ folders (the submitters' code)"),
    ("system", re.compile(r"privateid\.json"), "privateid.json files"),
    ("benchmark", re.compile(r"pruned_results"), "pruned_results/ folders (runs the summarizer does not read)"),
    ("benchmark", re.compile(r"power"), "power/ folders (power logs: not imported)"),
)
UNUSED_DESCRIPTION = "systems descriptions without results (e.g. a template.json)"
# The kinds of notice, as the report counts them.
UNKNOWN, SUSPICIOUS, TWIN = "unknown content", "suspicious logs", "logs read otherwise than their stored twin"


class RoundError(ValueError):
    """A round folder that cannot be read at all (not a folder, no round name); the message says why."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """A fault: ``path`` (relative to the round folder) and what is wrong; ``run``: the published run left out
    whole for it ("<submitter>/<system>"), None for a path outside any run (not read)."""

    path: str
    what: str
    run: str | None = None

    def __str__(self) -> str:
        left_out = f"published run {self.run} left out whole: nothing of it stored" if self.run else "not read"
        return f"{self.path}: {self.what} ({left_out})"


@dataclasses.dataclass(frozen=True)
class Notice:
    """Something a reader should know, imported all the same: ``kind`` (UNKNOWN, SUSPICIOUS, TWIN), the path
    (relative to the round folder) and what it is, with the line where it is one."""

    kind: str
    path: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


@dataclasses.dataclass
class Round:
    """A round as read: its runs without a fault (``runs``), those left out (``left_out``, each scored as far
    as the summarizer would score it), the faults, the notices, and the known non-result content skipped
    (kind -> entries)."""

    name: str
    ruleset: str
    root: Path
    runs: list[PublishedRun]
    left_out: list[PublishedRun]
    problems: list[Problem]
    notices: list[Notice]
    skipped: dict[str, int]


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


def known_extra(where: str, entry: Path) -> str | None:
    """The kind of known non-result content ``entry`` is at ``where`` (KNOWN_EXTRAS), or None."""
    places = {"anywhere", where} | ({"round files"} if where == "round" and entry.is_file() else set())
    for place, pattern, kind in KNOWN_EXTRAS:
        if place in places and pattern.fullmatch(entry.name):
            return kind
    return None


class _RoundReader:
    """One walk over a round folder (``read_round``)."""

    def __init__(self, root: Path, name: str, ruleset: str, source: str, scratch: Path) -> None:
        self.root = root
        self.source = source.rstrip("/")
        self.name = name
        self.ruleset = ruleset
        self.scratch = scratch
        self.problems: list[Problem] = []
        self.notices: list[Notice] = []
        self.skipped: collections.Counter[str] = collections.Counter()
        self.required = get_result_file_counts(USAGE)
        self.run_name: str | None = None  # the run being read: a fault in it leaves it out

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def problem(self, path: Path, what: str) -> None:
        self.problems.append(Problem(self.relative(path), what, self.run_name))

    def notice(self, kind: str, path: Path, what: str) -> None:
        self.notices.append(Notice(kind, self.relative(path), what))

    def unknown(self, path: Path, what: str) -> None:
        self.notice(UNKNOWN, path, f"not in the round layout ({what}): not read")

    def inside(self, path: Path) -> bool:
        return Path(os.path.realpath(path)).is_relative_to(self.root)

    def entries(self, folder: Path, where: str) -> list[Path]:
        """The folder's entries, sorted, without the known non-result content of ``where`` (counted); a link that
        leads out of the round is a fault and never followed."""
        kept = []
        for entry in sorted(folder.iterdir()):
            kind = known_extra(where, entry)
            if kind is not None:
                self.skipped[kind] += 1
            elif entry.is_symlink() and not self.inside(entry):
                self.problem(entry, f"a link that leads out of the round folder (to {os.path.realpath(entry)})")
            else:
                kept.append(entry)
        return kept

    def read(self) -> tuple[list[PublishedRun], list[PublishedRun]]:
        """(runs without a fault, runs left out) of the whole round."""
        runs, left_out = [], []
        for submitter in self.entries(self.root, "round"):
            results, systems = submitter / "results", submitter / "systems"
            if not results.is_dir() or not systems.is_dir():
                self.unknown(submitter, "a submitter folder holds results/ and systems/")
                continue
            for entry in self.entries(submitter, "submitter"):
                if entry.name not in ("results", "systems"):
                    self.unknown(entry, "a submitter folder holds results/, systems/ and benchmarks/")
            with_results = set()
            for system in self.entries(results, "results"):
                if not system.is_dir():
                    self.unknown(system, "results/ holds one folder per system")
                    continue
                with_results.add(f"{system.name}.json")
                run, faults = self.run(submitter, system, systems / f"{system.name}.json")
                if run is not None:
                    (left_out if faults else runs).append(run)
            for description in self.entries(systems, "systems"):
                if description.suffix != ".json":
                    self.unknown(description, "systems/ holds one <system>.json per system")
                elif description.name not in with_results:
                    self.skipped[UNUSED_DESCRIPTION] += 1
        return runs, left_out

    def run(self, submitter: Path, system: Path, description_path: Path) -> tuple[PublishedRun | None, bool]:
        """The published run of ``system`` (None where it has no result log or no readable systems JSON) and
        whether it has a fault."""
        self.run_name = f"{submitter.name}/{system.name}"
        before = len(self.problems)
        try:
            if description_path.is_symlink() and not self.inside(description_path):
                self.problem(description_path, "a link that leads out of the round folder")
                return None, True
            try:
                description = read_system_description(description_path, self.ruleset)
            except ResultLogError as error:
                self.problem(description_path, str(error).removeprefix(f"{description_path}: "))
                return None, True
            logs, scores = [], []
            for scaling in self.entries(system, "system"):
                if scaling.name not in SCALINGS or not scaling.is_dir():
                    self.unknown(scaling, "results/<system>/ holds strong/ and weak/")
                    continue
                for benchmark in self.entries(scaling, "scaling"):
                    if not benchmark.is_dir():
                        self.unknown(benchmark, "a <benchmark>/ folder is expected here")
                        continue
                    score, folder_logs = self.benchmark_folder(scaling.name, benchmark, description)
                    if score is not None:
                        scores.append(score)
                        logs += folder_logs
            if not scores:
                self.unknown(system, "a system folder without result logs: nothing to import")
                return None, len(self.problems) > before
            source = f"{self.source}/{submitter.name}/results/{system.name}"
            run = PublishedRun(self.name, submitter.name, system.name, source, description, logs, scores)
            return run, len(self.problems) > before
        finally:
            self.run_name = None

    def benchmark_folder(self, scaling: str, folder: Path, description: dict) -> tuple[dict | None, list[PublishedLog]]:
        """The folder's score and its logs that can be kept (None, [] for a folder without a result log)."""
        escaped = [
            e for e in folder.iterdir() if e.is_symlink() and RESULT_FILE.fullmatch(e.name) and not self.inside(e)
        ]
        files = []
        for entry in self.entries(folder, "benchmark"):
            if RESULT_FILE.fullmatch(entry.name) and entry.is_file():
                files.append(entry)
            elif entry.name != "scaling.json":
                self.unknown(entry, "a benchmark folder holds result_<n>.txt files and scaling.json")
        if not files and not escaped:
            self.unknown(folder, "a benchmark folder without result_<n>.txt files: nothing to import")
            return None, []
        read = [(path, self.log(path)) for path in files]
        kept = []
        for path, log in read:
            if log.problem is not None:
                continue
            record = result_logs.log_record(log, self.ruleset)
            if record["benchmark"] != folder.name:
                self.problem(path, f"submission_benchmark {record['benchmark']!r} is not its folder's {folder.name!r}")
                continue
            kept.append(PublishedLog(scaling, folder.name, path.name, record))
        return self.score(scaling, folder, description, read, escaped), kept

    def log(self, path: Path) -> ResultLog:
        """A result log as mlperf-logging reads it; its fault or suspicions named."""
        log = result_logs.read_result_log(path.read_bytes(), self.ruleset)
        if log.problem is not None:
            self.problem(path, log.problem)
        else:
            for suspicion in log.suspicions:
                self.notice(SUSPICIOUS, path, suspicion)
        return log

    def score(
        self, scaling: str, folder: Path, description: dict, read: list[tuple[Path, ResultLog]], escaped: list[Path]
    ) -> dict:
        """The summarizer's figures of one benchmark folder (module docstring)."""
        benchmark = folder.name
        counted = [log for _, log in read if log.counted]
        # The summarizer follows a link out of the round (it globs result_*.txt): such a log is not read
        # here and counts as a run it drops, as it drops anything that is not a compliant log.
        dropped = len(read) - len(counted) + len(escaped)
        score = {
            "scaling": scaling,
            "benchmark": benchmark,
            "division": description["division"],
            "runs": len(read) + len(escaped),
            "required_runs": self.required.get(benchmark),
        }
        if scaling == "strong":
            score |= strong_score([log.time_to_train_min for log in counted], dropped, self.scaling_factor(folder))
        else:
            score |= weak_score(counted, self.required.get(benchmark))
        if description["division"] == "closed":
            rcp = self.rcp_verdict(folder, [path for path, _ in read], read, escaped)
            score |= (
                rcp if scaling == "strong" else {key: rcp[key] for key in ("rcp", "rcp_message", "rcp_norm_factor")}
            )
        flops = full_size_flops(benchmark)
        if flops is not None:
            score["flops"] = flops
        return score

    def scaling_factor(self, folder: Path) -> float | None:
        """scaling.json's factor as the summarizer reads it (``_get_scaling_factor``; 1 without the file); None,
        a fault, where it cannot be read (the summarizer would crash) or leads out of the round."""
        path = folder / "scaling.json"
        if path.is_symlink() and not self.inside(path):
            return None  # a fault named by entries()
        try:
            return float(result_summarizer._get_scaling_factor(str(folder)))
        except (TypeError, ValueError, KeyError) as error:  # the library's JSON reader raises TypeError
            self.problem(path, f"not a scaling factor ({type(error).__name__}: {error}): the folder has no score")
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
    """Read a round folder (never writing into it): its published runs, those left out, the faults, the
    notices and what was skipped. ``source``: where the round is published (e.g.
    https://github.com/mlcommons/hpc_results_v3.0/tree/main), which each run's source extends with
    <submitter>/results/<system>; default: the folder."""
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
        runs, left_out = reader.read()
    if not runs and not left_out and not reader.problems:
        raise RoundError(f"{folder}: no <submitter>/results/<system>/ with result logs in it: not a round folder")
    return Round(name, ruleset, root, runs, left_out, reader.problems, reader.notices, dict(reader.skipped))


@dataclasses.dataclass
class ImportReport:
    """What an import did: each run's ingest result, the faults (the round's and the runs the store refused),
    the notices (the round's and the twins read otherwise) and the content skipped."""

    round: Round
    results: list[PublishedIngestResult]
    problems: list[Problem]
    notices: list[Notice]

    def counts(self) -> dict:
        """The report in numbers: runs stored, already present, superseded and left out; logs added and present;
        notices by kind; faults; content skipped by kind."""
        return {
            "round": self.round.name,
            "runs_stored": sum(result.run_created for result in self.results),
            "runs_present": sum(not result.run_created and not result.superseded for result in self.results),
            "runs_superseded": sum(result.superseded for result in self.results),
            "runs_left_out": len({problem.run for problem in self.problems if problem.run}),
            "logs_added": sum(result.logs_added for result in self.results),
            "logs_present": sum(result.logs_present for result in self.results),
            "notices": dict(collections.Counter(notice.kind for notice in self.notices)),
            "problems": len(self.problems),
            "skipped": self.round.skipped,
        }


def twin_notices(run: PublishedRun, stored: dict[str, dict]) -> list[Notice]:
    """The logs of ``run`` stored before (``stored``: sha256 -> its stored record) that this round reads
    otherwise: what differs besides the ruleset, stored and here."""
    notices = []
    for log in run.logs:
        twin = stored.get(log.record["sha256"])
        if twin is None:
            continue
        differences = json_differences(
            {key: value for key, value in twin.items() if key != "ruleset"},
            {key: value for key, value in log.record.items() if key != "ruleset"},
        )
        if differences:
            path = f"{run.submitter}/results/{run.system}/{log.scaling}/{log.benchmark}/{log.file}"
            notices.append(
                Notice(
                    TWIN,
                    path,
                    f"its bytes are stored already (read under {twin.get('ruleset')}), and this round reads them "
                    f"otherwise: {'; '.join(differences)}; the stored record is kept, the folder scored as read here",
                )
            )
    return notices


def import_round(round_: Round, store: ResultsStore, *, supersede: bool = False) -> ImportReport:
    """Put every run of a round without a fault into the store, each atomically; a run stored with other
    content is a fault (named, left as stored) unless ``supersede`` (replaced; the stored one kept as
    superseded). The faults of the round are in the report, and its runs left out are not stored."""
    results, problems, notices = [], list(round_.problems), list(round_.notices)
    for run in round_.runs:
        notices += twin_notices(run, store.published_log_records({log.record["sha256"] for log in run.logs}))
        try:
            results.append(store.ingest_published(run, supersede=supersede))
        except PublishedRunConflictError as error:
            where = f"{run.submitter}/results/{run.system}"
            problems.append(Problem(where, str(error), f"{run.submitter}/{run.system}"))
    return ImportReport(round_, results, problems, notices)
