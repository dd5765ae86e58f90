"""MLPerf HPC result logs as mlperf-logging reads them, the project's own and published ones: what importing
a published round (mlcampaign.history.published_rounds), reproducing a submission (mlcampaign reproduce,
mlcampaign.plan.reproduce) and exporting one (mlcampaign.records.mlperf.submission) share.

Every verdict is mlperf-logging's own (pinned in requirements.txt): its line parser (``string_to_logline``
of the ruleset's ``mlp_parser``), its compliance checker, its summarizer's per-log time to train
(``_query_mlperf_strong_scaling_score``: run_start to run_stop, in minutes) and instance scale, and the RCP
checker's per-log reading (systems descriptions: mlcampaign.records.mlperf.system_descriptions; the
summarizer's scores of a folder of logs: mlcampaign.records.mlperf.scores). Most of these are underscore-private
functions with no stable API: the pin matters, and the tests that compare every figure with the
``result_summarizer`` command line catch a change.

Speed (a round is ~1 100 logs, ~400 000 lines): two library costs are avoided without changing a result.
mlp_parser cuts each line with ``re.sub(".*" + TOKEN, TOKEN, line)``, a greedy match that ends at the line's
last token; ``line[line.rindex(TOKEN):]`` is the same cut, and the library's ``string_to_logline`` parses
it. The compliance checker re-reads and re-parses its rule YAML files (pure-Python loader) for every log;
``cached_rules`` lets it parse each file once per process. The RCP checker's ``read_submission_file``
reads a log again with the same regex; ``rcp_reading`` computes its result from the parsed lines, with its
substring semantics. Together: ~6 ms of CPU a log instead of ~90.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import yaml
from mlperf_logging.compliance_checker import mlp_compliance
from mlperf_logging.result_summarizer import result_summarizer

USAGE = "hpc"
TOKEN = ":::MLLOG "
# The MLPerf HPC rounds whose rules mlperf-logging has (compliance_checker/hpc_<ruleset>/).
ROUND_RULESETS = {"v1.0": "1.0.0", "v2.0": "2.0.0", "v3.0": "3.0.0"}
# A round's name in a path (hpc_results_v3.0, mlperf-hpc-v3.0-subset), not inside a word (venv3.11).
ROUND_NAME = re.compile(r"(?<![A-Za-z0-9])v\d+\.\d+")

# Keys of the submission header, of the layout and of the run's events: not hyperparameters.
HEADER_KEYS = frozenset(
    {
        "submission_benchmark", "submission_org", "submission_division", "submission_status",
        "submission_platform", "submission_poc_name", "submission_poc_email",
    }
)  # fmt: skip
SCALE_KEYS = frozenset({"number_of_nodes", "accelerators_per_node", "number_of_ranks", "instance_id"})
EVENT_KEYS = frozenset(
    {
        "init_start", "init_stop", "run_start", "run_stop", "staging_start", "staging_stop", "cache_clear",
        "seed", "epoch_start", "epoch_stop", "eval_start", "eval_stop", "block_start", "block_stop",
        "tracked_stats", "train_samples", "eval_samples", "eval_accuracy", "eval_error", "eval_loss",
        "train_loss", "train_accuracy", "learning_rate", "throughput", "target_accuracy_reached",
    }
)  # fmt: skip
QUALITY_KEYS = ("eval_accuracy", "eval_error")


class ResultLogError(ValueError):
    """A result log or systems description that cannot be read as mlperf-logging reads them; the
    message names what is wrong."""


def round_in_path(path: Path) -> str | None:
    """The last round name in ``path`` (resolved), or None."""
    found = ROUND_NAME.findall(str(Path(path).resolve()))
    return found[-1] if found else None


def ruleset_of(round_name: str) -> str:
    """The HPC ruleset of a round ("v3.0" -> "3.0.0"); ResultLogError for a round mlperf-logging has no rules for."""
    if round_name not in ROUND_RULESETS:
        raise ResultLogError(
            f"round {round_name!r}: mlperf-logging has MLPerf HPC rules for rounds {', '.join(ROUND_RULESETS)} only"
        )
    return ROUND_RULESETS[round_name]


def parse_lines(text: str, ruleset: str) -> tuple[list, list[tuple[str, str]]]:
    """The log's lines as mlp_parser's ``parse_generator`` returns them: (LogLine list, [(line, error)]).

    Lines that fail are those the library fails on (a ValueError: not JSON, a cut line), and also those
    on which it crashes (a KeyError or TypeError: a line without ``time_ms``, a value that is not an
    object), named the same way instead of stopping the import."""
    parser = importlib.import_module(f"mlperf_logging.compliance_checker.mlp_parser.ruleset_{ruleset.replace('.', '')}")
    loglines, failed = [], []
    lineno = 0
    for raw in io.StringIO(text):
        at = raw.rfind(TOKEN)
        if at < 0:
            continue
        line = raw[at:].strip()
        try:
            loglines.append(parser.string_to_logline(lineno, line))
        except (ValueError, KeyError, TypeError) as error:
            failed.append((line, f"{type(error).__name__}: {error}"))
        lineno += 1
    return loglines, failed


class _CachedRuleFiles:
    """Stands in for the ``yaml`` module inside mlp_compliance while ``cached_rules()`` is active: the
    checker loads its (read-only) rule files again for every log; each is parsed once here."""

    BaseLoader = yaml.BaseLoader

    def __init__(self) -> None:
        self._parsed: dict[tuple, object] = {}

    def load(self, stream, Loader):  # the yaml module's signature
        name = getattr(stream, "name", None)
        if name is None:
            return yaml.load(stream, Loader=Loader)
        if (name, Loader) not in self._parsed:
            self._parsed[(name, Loader)] = yaml.load(stream, Loader=Loader)
        return self._parsed[(name, Loader)]


_RULE_FILES = _CachedRuleFiles()


@contextlib.contextmanager
def cached_rules() -> Iterator[None]:
    """Inside: the compliance checker parses each rule file once per process (see the module docstring)."""
    original = mlp_compliance.yaml
    mlp_compliance.yaml = _RULE_FILES
    try:
        yield
    finally:
        mlp_compliance.yaml = original


def compliance(loglines: list, parse_errors: list, ruleset: str) -> list[str]:
    """The compliance checker's messages on parsed lines (empty: compliant), under the division the log
    claims, as ``mlp_compliance.main`` gives them to the summarizer and package_checker: a log with lines
    that do not parse fails ("Log lines had parsing errors.")."""
    checker = mlp_compliance.make_checker(usage=USAGE, ruleset=ruleset, quiet=True, werror=False)
    # The checker queues rule files in a module-level list; one left by an earlier failed check must not leak in.
    mlp_compliance.enqueued_configs.clear()
    if parse_errors:
        checker.put_message("Log lines had parsing errors.")
    # The checker reports through logging's module functions, which configure the root logger when it
    # has no handler; a handler of its own for the check keeps the process's logging as it was.
    quiet = logging.NullHandler()
    logging.root.addHandler(quiet)
    try:
        checker.check_loglines(loglines, f"{USAGE}_{ruleset}/common.yaml")
    except FileNotFoundError as error:  # a benchmark or division the rules have no file for
        mlp_compliance.enqueued_configs.clear()
        checker.put_message(f"the checker has no rules for this log: {error}")
    finally:
        logging.root.removeHandler(quiet)
    return [*checker.overwritable.values(), *checker.not_overwritable]


def first_value(loglines: list, key: str, default=None):
    """The value of the first line of ``key`` (``default`` where none)."""
    for line in loglines:
        if line.key == key:
            return line.value["value"]
    return default


def rcp_reading(loglines: list) -> tuple[int, float, object, object]:
    """rcp_checker.read_submission_file's (not_converged, epochs, global batch, benchmark) for an HPC log,
    from its parsed lines: it matches substrings of a line's JSON text ("global_batch_size",
    "submission_benchmark", "eval_error"/"eval_accuracy", "run_stop") and indexes the JSON as it does, so
    it raises where the library raises (e.g. KeyError for a line that mentions eval_accuracy without an
    epoch_num). Only for logs whose every line parses."""
    not_converged, epochs, batch, benchmark, converged_epoch = 1, 1e9, -1, None, None
    for line in loglines:
        text = line.full_string[len(TOKEN) :]
        if "global_batch_size" in text:
            batch = line.value["value"]
        if "submission_benchmark" in text:
            benchmark = line.value["value"]
        if "eval_error" in text or "eval_accuracy" in text:
            converged_epoch = round(line.value["metadata"]["epoch_num"], 3)
        if "run_stop" in text and line.key == "run_stop":
            if line.value["metadata"]["status"] == "success":
                if converged_epoch is None:
                    raise UnboundLocalError("conv_epoch")  # what the library raises here
                not_converged, epochs = 0, converged_epoch
            else:
                not_converged, epochs = 1, 1e9
    return not_converged, epochs, batch, benchmark


@dataclasses.dataclass
class ResultLog:
    """One result log as mlperf-logging reads it. ``problem``: why it is not a run that can be kept
    (None: it is); ``counted``: whether the summarizer scores it (compliant, every line parsed, run_start
    and run_stop present: an aborted run that passes the checker is scored, as the summarizer does);
    ``suspicions``: what the summarizer takes without a word but a reader should know (``suspicions``)."""

    sha256: str
    size: int
    loglines: list
    parse_errors: list[tuple[str, str]]
    compliance_messages: list[str]
    run_start_ms: float | None
    run_stop_ms: float | None
    problem: str | None
    rcp: tuple | Exception | None  # rcp_reading's tuple, the exception it raises, or None (lines that do not parse)
    suspicions: list[str] = dataclasses.field(default_factory=list)

    @property
    def counted(self) -> bool:
        return not self.compliance_messages and not self.parse_errors and self.run_stop_ms is not None

    @property
    def time_to_train_min(self) -> float:
        return (self.run_stop_ms - self.run_start_ms) / 60 / 1000


def _problem(text: str, loglines: list, errors: list, messages: list[str]) -> str | None:
    if not loglines:
        return "no :::MLLOG line"
    if errors:
        last = text.rstrip("\n").rsplit("\n", 1)[-1]
        if len(errors) == 1 and TOKEN in last and last[last.rindex(TOKEN) :].strip() == errors[0][0]:
            return f"truncated log: its last :::MLLOG line is not complete ({errors[0][1]})"
        line, error = errors[0]
        return f"{len(errors)} :::MLLOG line(s) do not parse, the first ({error}): {line[:100]!r}"
    if first_value(loglines, "run_start", "absent") == "absent":
        return "no run_start: the run did not start"
    stops = [line for line in loglines if line.key == "run_stop"]
    if not stops:
        return "no run_stop: the run did not finish, or its log is cut"
    status = stops[0].value["metadata"].get("status")
    if status != "success":
        return f"run_stop status {status!r}: an aborted run"
    if messages:
        return "fails the compliance checker: " + " | ".join(message.splitlines()[0] for message in messages)
    return None


def _timed_lines(loglines: list) -> tuple:
    """The run_start and run_stop lines the summarizer times a run by (``_query_run_start_stop``: the last
    run_start before the first run_stop, or the first after it), as it walks them."""
    start = stop = None
    for line in loglines:
        if line.key == "run_start":
            start = line
        if line.key == "run_stop":
            stop = line
        if start is not None and stop is not None:
            break
    return start, stop


def suspicions(data: bytes, text: str, loglines: list) -> list[str]:
    """What mlperf-logging takes from a log without a word, each with the line (of the file) it is on: bytes
    that are not UTF-8 (the library reads Latin-1), a repeated run_start (it times from the last before
    run_stop), a run_stop stamped at or before its run_start (a time to train of zero or less)."""
    found = []
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        found.append(
            f"line {line}: not UTF-8 (byte 0x{data[error.start]:02x}); read as Latin-1, as mlperf-logging reads it"
        )
    starts = [line for line in loglines if line.key == "run_start"]
    start, stop = _timed_lines(loglines)
    if len(starts) > 1 or (start is not None and stop is not None and stop.timestamp <= start.timestamp):
        numbers = mllog_line_numbers(text)
        if len(starts) > 1:
            lines = ", ".join(str(numbers[line.lineno]) for line in starts)
            found.append(
                f"lines {lines}: {len(starts)} run_start; the summarizer times the run from line "
                f"{numbers[start.lineno]}"
            )
        if start is not None and stop is not None and stop.timestamp <= start.timestamp:
            gap = stop.timestamp - start.timestamp
            when = f"{-gap:.0f} ms before" if gap < 0 else "at the same millisecond as"
            found.append(
                f"line {numbers[stop.lineno]}: run_stop stamped {when} the run_start of line {numbers[start.lineno]}: "
                f"a time to train of {gap / 60000:.6g} min, scored as the summarizer scores it"
            )
    return found


def mllog_line_numbers(text: str) -> list[int]:
    """The file line number (from 1) of each :::MLLOG line, in the order parse_lines numbers them."""
    return [number for number, raw in enumerate(io.StringIO(text), start=1) if TOKEN in raw]


def read_result_log(data: bytes, ruleset: str) -> ResultLog:
    """A result log's bytes as mlperf-logging reads them (``ResultLog``); inside ``cached_rules`` for speed."""
    text = data.decode("latin-1")  # as the library opens logs
    loglines, errors = parse_lines(text, ruleset)
    messages = compliance(loglines, errors, ruleset)
    try:
        start_stop = result_summarizer._query_run_start_stop(loglines)
    except ValueError:
        start_stop = (None, None)
    reading = None
    if not errors:
        try:
            reading = rcp_reading(loglines)
        except Exception as error:  # what the RCP checker would raise: kept, and raised again per folder
            reading = error
    return ResultLog(
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        loglines=loglines,
        parse_errors=errors,
        compliance_messages=messages,
        run_start_ms=start_stop[0],
        run_stop_ms=start_stop[1],
        problem=_problem(text, loglines, errors, messages),
        rcp=reading,
        suspicions=suspicions(data, text, loglines),
    )


def log_record(log: ResultLog, ruleset: str) -> dict:
    """What the project keeps of a result log that has no ``problem``: the header, the run's scale, time to
    train (the summarizer's), batch and dataset sizes, the logged hyperparameters, the quality reached at
    run_stop and the RCP checker's epochs to converge, with the samples and evaluations they imply."""
    loglines = log.loglines
    run_start = next(index for index, line in enumerate(loglines) if line.key == "run_start")
    run_stop = next(index for index, line in enumerate(loglines) if line.key == "run_stop")
    hyperparameters: dict = {}
    repeated: dict = {}
    for line in loglines[:run_start]:
        if line.key in HEADER_KEYS | SCALE_KEYS | EVENT_KEYS:
            continue
        value = line.value["value"]
        if line.key not in hyperparameters:
            hyperparameters[line.key] = value
        elif hyperparameters[line.key] != value:  # logged again with another value: every value, in order
            repeated.setdefault(line.key, [hyperparameters[line.key]]).append(value)
    hyperparameters |= repeated
    try:
        instance_scale = result_summarizer._query_instance_scale(loglines)
    except ValueError:
        instance_scale = None
    # The quality at run_stop: some submitters' logs keep evaluating after it.
    evaluations = [line for line in loglines[:run_stop] if line.key in QUALITY_KEYS]
    epochs = None if isinstance(log.rcp, Exception) or log.rcp is None or log.rcp[0] else log.rcp[1]
    train_samples, eval_samples = first_value(loglines, "train_samples"), first_value(loglines, "eval_samples")
    numeric = (int, float)
    trained = epochs * train_samples if epochs is not None and isinstance(train_samples, numeric) else None
    return {
        "sha256": log.sha256,
        "bytes": log.size,
        "ruleset": f"{USAGE} {ruleset}",
        **{key.removeprefix("submission_"): first_value(loglines, key) for key in sorted(HEADER_KEYS)},
        "seed": first_value(loglines, "seed"),
        "number_of_nodes": first_value(loglines, "number_of_nodes"),
        "accelerators_per_node": first_value(loglines, "accelerators_per_node"),
        "instance_scale": instance_scale,
        "instance_id": first_value(loglines, "instance_id"),
        "run_start_ms": log.run_start_ms,
        "run_stop_ms": log.run_stop_ms,
        "time_to_train_min": result_summarizer._query_mlperf_strong_scaling_score(loglines),
        "global_batch_size": first_value(loglines, "global_batch_size"),
        "train_samples": train_samples,
        "eval_samples": eval_samples,
        "hyperparameters": hyperparameters,
        "quality_key": evaluations[-1].key if evaluations else None,
        "quality": evaluations[-1].value["value"] if evaluations else None,
        "evaluations": len(evaluations),
        # The RCP checker's epochs to converge: epoch_num of the last evaluation before a successful run_stop.
        "epochs_to_converge": epochs,
        "samples_trained": trained,
        "samples_evaluated": len(evaluations) * eval_samples if isinstance(eval_samples, numeric) else None,
    }


def read_submission(folder: Path, round_name: str | None) -> tuple[dict, list[str]]:
    """One submission's ``<submitter>/results/<system>/<strong|weak>/<benchmark>/`` folder as ``mlcampaign
    reproduce`` reads it: its round (``round_name``, else the one in its path, else v3.0), submitter, system,
    scaling, benchmark, source and ``records`` (``log_record`` of each log without a problem, in name order),
    and each log left out as "<path>: <problem>". ResultLogError for a folder not in that layout or a round
    without rules."""
    resolved = Path(folder).resolve()
    if len(resolved.parts) < 5 or resolved.parts[-4] != "results" or not resolved.is_dir():
        raise ResultLogError(f"{folder}: not a result folder (<submitter>/results/<system>/<strong|weak>/<benchmark>/)")
    round_name = round_name or round_in_path(folder) or "v3.0"
    ruleset = ruleset_of(round_name)
    records, problems = [], []
    for path in sorted(Path(folder).glob("result_*.txt")):
        log = read_result_log(path.read_bytes(), ruleset)
        if log.problem is None:
            records.append(log_record(log, ruleset))
        else:
            problems.append(f"{path}: {log.problem}")
    submitter, _, system, scaling, benchmark = resolved.parts[-5:]
    fields = {"round": round_name, "submitter": submitter, "system": system, "scaling": scaling}
    return fields | {"benchmark": benchmark, "source": str(folder), "records": records}, problems
