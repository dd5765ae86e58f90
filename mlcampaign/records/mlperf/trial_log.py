"""A trial's MLPerf log, the one the project writes: the submission header, the hyperparameters as the
MLPerf rules name and spell them (which MLPerf benchmark and ruleset a project benchmark is: its model's
registry entry, ``mlcampaign.plan.registry.mlperf_rules``), the log file itself (rank 0 writes it, other
ranks write nowhere) and a check against the MLCommons compliance checker.

``MLPerfLog`` is framework-neutral: the torch and Keras trials call the same methods in the same
order (``TrialRun``), so their logs differ only in timing.

Rulesets (mlperf-logging's compliance checker): ResNet-50 is ``resnet`` of the *training* rules
4.0.0, the newest training ruleset that still has it (4.1.0 dropped it); CosmoFlow and DeepCAM are
``cosmoflow`` and ``deepcam`` of the *hpc* rules 3.0.0. The HPC AI500 extreme-weather benchmark
has no MLPerf rules: its log has the same events and header, with the project's benchmark name as
``submission_benchmark``, and claims no compliance (the checker rejects any name it has no rules for).

What the project's training does, in the rules' terms (each value is what the trials do, never a
value chosen to pass a check):
- one optimizer step per batch: ``gradient_accumulation_steps`` / ``_frequency`` = 1;
- BatchNorm statistics over each process's local batch (no synchronised BatchNorm):
  ``model_bn_span`` = local batch, ``batchnorm_group_size`` = 1;
- the learning rate warms up linearly over ``int(warmup_epochs x steps_per_epoch)`` steps, step k
  at (k + 1) / warm-up steps of the peak, then follows the schedule over the rest of
  ``epochs_max`` epochs (``mlcampaign.plan.hyperparameters.lr_factor``): cosine and polynomial decay to 0;
- Adam and AdamW with torch's defaults, which the Keras trial matches
  (``mlcampaign.plan.hyperparameters.ADAM_BETAS``, ``ADAM_EPSILON``);
  the project's LARS adds no epsilon to its trust ratio (``lars_epsilon`` = 0).
Keys that describe a schedule the trial does not run are not logged (e.g. the polynomial-decay keys
of ResNet-50 for a cosine schedule); the closed-division checker then names them as missing.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import re
from pathlib import Path

from mlperf_logging.compliance_checker import mlp_compliance
from mlperf_logging.mllog import constants
from mlperf_logging.mllog.mllog import MLLogger

from mlcampaign.plan.hyperparameters import batch_sizes, scaled_lr
from mlcampaign.plan.registry import mlperf_rules, models, resolve

# Class-name spelling of the HPC references (Keras' SGD in CosmoFlow, torch's Adam/AdamW in DeepCAM),
# which the closed HPC rules check; the training rules spell ResNet-50's optimizers in lower case.
HPC_OPTIMIZER_NAMES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "lars": "LARS"}

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def quality_key(benchmark: dict) -> str:
    """The log key of the benchmark's quality: the MLPerf rules' key, else by the target's direction."""
    known = mlperf_rules(benchmark)
    if known is not None:
        return known.quality_key
    return constants.EVAL_ACCURACY if benchmark["target"]["direction"] == "higher" else "eval_error"


def submission(spec: dict) -> dict:
    """The submission header of a trial's log (keys in logging order) from its spec: the campaign's
    ``mlperf`` settings, the benchmark's MLPerf name, the system as platform, and the layout.

    ``submission_org`` is left out where the campaign names no org: the checker then fails at it,
    rather than passing on an org nobody gave.
    """
    settings = spec.get("mlperf")
    if settings is None:
        raise ValueError("the trial spec has no MLPerf settings (campaign key 'mlperf', in Campaign.trial_spec)")
    for key in ("division", "status"):
        if key not in settings:
            raise ValueError(f"the trial spec's MLPerf settings have no {key!r} (campaign key 'mlperf.{key}')")
    system, trial, benchmark = spec["system"], spec["trial"], spec["benchmark"]
    known = mlperf_rules(benchmark)
    header = {constants.SUBMISSION_BENCHMARK: known.name if known else benchmark["name"]}
    if settings.get("org"):
        header[constants.SUBMISSION_ORG] = settings["org"]
    header |= {
        constants.SUBMISSION_DIVISION: settings["division"],
        constants.SUBMISSION_STATUS: settings["status"],
        constants.SUBMISSION_PLATFORM: system["name"],
        "number_of_nodes": trial["nodes"],
        # One process per device on accelerator systems; a CPU node has none.
        "accelerators_per_node": 0 if system["device"] == "cpu" else trial["tasks_per_node"],
        constants.SEED: trial["seed"],
    }
    return header


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The trial's optimisation in the terms of MLPerf's hyperparameter keys, as the trial runs it: the
    peak learning rate, the local batch, optimizer steps per epoch, the warm-up's steps (step k at
    (k + 1) / warm-up steps of the peak), the steps over which cosine and polynomial schedules decay
    after it, and the rate they decay to (None where the schedule does not decay to a fixed value)."""

    peak_lr: float
    local_batch: int
    steps_per_epoch: int
    warmup_steps: int
    decay_steps: int
    end_lr: float | None


def schedule_of(training: dict, processes: int, steps_per_epoch: int) -> Schedule:
    schedule = training["schedule"]
    global_batch, local_batch = batch_sizes(training, processes)
    warmup_steps = int(schedule["warmup_epochs"] * steps_per_epoch)
    return Schedule(
        peak_lr=scaled_lr(training, global_batch),
        local_batch=local_batch,
        steps_per_epoch=steps_per_epoch,
        warmup_steps=warmup_steps,
        decay_steps=max(1, steps_per_epoch * training["epochs_max"] - warmup_steps),
        end_lr=0.0 if schedule["name"] in ("cosine", "polynomial") else None,
    )


def hyperparameters(spec: dict, steps_per_epoch: int, split_sizes: dict[str, int]) -> dict:
    """The trial's hyperparameters under MLPerf's keys (in logging order): the keys every benchmark
    logs, then the benchmark's closed-division keys as its rules name and spell them (its benchmark
    folder's ``mlperf.py``, named in its registry entry).

    ``steps_per_epoch``: optimizer steps per epoch as the trial runs them; ``split_sizes``: the
    staged ``train`` and ``val`` sample counts.
    """
    benchmark, trial = spec["benchmark"], spec["trial"]
    training = benchmark["training"]
    optimizer = training["optimizer"]
    global_batch, _ = batch_sizes(training, trial["processes"])
    schedule = schedule_of(training, trial["processes"], steps_per_epoch)
    known = mlperf_rules(benchmark)
    hpc = known is not None and known.usage == "hpc"
    values = {
        constants.GLOBAL_BATCH_SIZE: global_batch,
        constants.TRAIN_SAMPLES: split_sizes["train"],
        constants.EVAL_SAMPLES: split_sizes["val"],
        constants.GRADIENT_ACCUMULATION_STEPS: 1,
        "gradient_accumulation_frequency": 1,
        constants.OPT_NAME: HPC_OPTIMIZER_NAMES[optimizer["name"]] if hpc else optimizer["name"],
        constants.OPT_BASE_LR: schedule.peak_lr,
        constants.OPT_WEIGHT_DECAY: optimizer["weight_decay"],
        constants.OPT_LR_WARMUP_EPOCHS: training["schedule"]["warmup_epochs"],
    }
    if known is not None:
        values |= resolve(known.hyperparameters)(benchmark, schedule)
    return values


# The log key that lists what an open-division log changes from its MLPerf benchmark's rules. Neither it nor
# its value may contain a key the RCP checker looks for as a substring of whole lines (eval_accuracy,
# eval_error, global_batch_size, submission_benchmark, run_stop, train_samples): it would read the line as one
# of those (rcp_checker.read_submission_file), and package_checker would fail.
OPEN_DIVISION_CHANGES = "open_division_changes"


def open_division_changes(spec: dict, split_sizes: dict[str, int]) -> list[str]:
    """What a trial of an MLPerf benchmark changes from the rules' reference, in words, for its open-division
    log: a quality target other than MLPerf's (relaxed: the rules' quality check then fails, in the open
    division too), model options other than the reference model's (its builder's defaults: the MLPerf
    size), and the data (the project's datasets are synthetic or subsets)."""
    benchmark = spec["benchmark"]
    known = mlperf_rules(benchmark)
    changes = []
    target = benchmark["target"]
    if target["value"] != known.target:
        lower = target["direction"] == "lower"
        stated = f"{target['metric']} {'<=' if lower else '>='} {target['value']:g} where MLPerf's is {known.target:g}"
        if (target["value"] > known.target) == lower:
            changes.append(f"quality target relaxed: {stated} (the rules' quality check fails)")
        else:
            changes.append(f"quality target: {stated}")
    builder = models()[benchmark["model"]["name"]].spec().build
    defaults = {
        name: p.default for name, p in inspect.signature(builder).parameters.items() if p.default is not p.empty
    }
    options = benchmark["model"].get("options", {})
    changed = [
        f"{name} {value} (reference {defaults[name]})"
        for name, value in options.items()
        if defaults.get(name, value) != value
    ]
    if changed:
        changes.append("model: " + ", ".join(changed))
    source = benchmark["dataset"]["source"]
    origin = f"written by generator {source['generator']}" if "generator" in source else f"from {source['path']}"
    changes.append(
        f"data: {benchmark['dataset']['name']}, {origin}, {split_sizes['train']} training and "
        f"{split_sizes['val']} validation samples"
    )
    return changes


def drop_page_cache(control: Path = DROP_CACHES) -> None:
    """Write dirty pages back and drop this node's page cache (what MLPerf's ``cache_clear`` records).

    Needs root (or a site that grants it); raises a RuntimeError naming the file otherwise.
    """
    os.sync()
    try:
        control.write_text("3\n")
    except OSError as exc:
        raise RuntimeError(
            f"cannot drop the page cache: writing 3 to {control} failed ({exc.strerror or exc}); it needs root. "
            "Set the campaign's mlperf.clear_caches to false to log cache_clear as false instead"
        ) from exc


class MLPerfLog:
    """One trial's MLPerf log. Call, in order (``TrialRun``): ``init_start``, ``header``,
    ``cache_clear``, ``staging_start``/``staging_stop``, ``hyperparameters``, ``init_stop``,
    ``run_start``, per epoch ``epoch_start``/``epoch_stop`` and, when it evaluates,
    ``eval_start``/``quality``/``eval_stop``, then ``run_stop``; ``close`` always (it ends a run that
    failed with ``run_stop`` status aborted). Every line names the caller's file and line."""

    # Frames from MLLogger's caller lookup to the trial's call: get_caller, _log_helper, the MLLogger
    # method, _write, the public method of this class (MLLogger counts 2 + offset).
    _STACK_OFFSET = 3

    def __init__(self, logger: logging.Logger, spec: dict):
        self._logger = logger
        self._mllogger = MLLogger(logger=logger, default_stack_offset=self._STACK_OFFSET)
        self.spec = spec
        self.quality_key = quality_key(spec["benchmark"])
        self._run_open = False
        self._epoch = 0

    @classmethod
    def open(cls, path: Path | None, spec: dict) -> MLPerfLog:
        """The log of trial ``spec`` written to ``path`` (truncated; rank 0), or nowhere (``None``, other ranks)."""
        # An unregistered logger: two open logs never share handlers, and none is left behind.
        logger = logging.Logger("mlcampaign.mllog", logging.INFO)
        if path is None:
            logger.addHandler(logging.NullHandler())
        else:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            logger.addHandler(logging.FileHandler(path, mode="w"))
        return cls(logger, spec)

    def _write(self, kind: str, key: str, value=None, metadata: dict | None = None) -> None:
        getattr(self._mllogger, kind)(key=key, value=value, metadata=metadata)

    def init_start(self) -> None:
        self._write("start", constants.INIT_START)

    def header(self) -> None:
        """The submission header (``submission``), after ``init_start``."""
        for key, value in submission(self.spec).items():
            self._write("event", key, value)

    def cache_clear(self, cleared: bool) -> None:
        """Whether the page cache was dropped before this trial (``drop_page_cache`` on every node)."""
        self._write("event", constants.CACHE_CLEAR, cleared)

    def staging_start(self) -> None:
        self._write("start", constants.STAGING_START)

    def staging_stop(self, staging_s: float) -> None:
        self._write("end", constants.STAGING_STOP, metadata={"staging_s": staging_s})

    def hyperparameters(self, steps_per_epoch: int, split_sizes: dict[str, int]) -> None:
        """The hyperparameters (``hyperparameters``), once the data are open and before ``init_stop``; in the
        open division, then what the trial changes from its MLPerf benchmark's rules (``open_division_changes``)."""
        for key, value in hyperparameters(self.spec, steps_per_epoch, split_sizes).items():
            self._write("event", key, value)
        if self.spec["mlperf"]["division"] == "open" and mlperf_rules(self.spec["benchmark"]) is not None:
            self._write("event", OPEN_DIVISION_CHANGES, open_division_changes(self.spec, split_sizes))

    def init_stop(self) -> None:
        self._write("end", constants.INIT_STOP)

    def run_start(self) -> None:
        self._write("start", constants.RUN_START)
        self._run_open = True

    def epoch_start(self, epoch: int) -> None:
        """Epochs count from 1."""
        self._epoch = epoch
        self._write("start", constants.EPOCH_START, metadata={constants.EPOCH_NUM: epoch})

    def epoch_stop(self, epoch: int) -> None:
        self._write("end", constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: epoch})

    def eval_start(self, epoch: int) -> None:
        self._write("start", constants.EVAL_START, metadata={constants.EPOCH_NUM: epoch})

    def quality(self, value: float, epoch: int) -> None:
        """The evaluation's quality under the benchmark's key (``eval_accuracy`` or ``eval_error``)."""
        self._write("event", self.quality_key, value, metadata={constants.EPOCH_NUM: epoch})

    def eval_stop(self, epoch: int) -> None:
        self._write("end", constants.EVAL_STOP, metadata={constants.EPOCH_NUM: epoch})

    def run_stop(self, reached_target: bool, epoch: int) -> None:
        status = constants.SUCCESS if reached_target else constants.ABORTED
        self._write("end", constants.RUN_STOP, metadata={constants.STATUS: status, constants.EPOCH_NUM: epoch})
        self._run_open = False

    def close(self, failure: str | None = None) -> None:
        """End a run that started and did not stop (the trial failed: ``failure`` says how) as aborted,
        then close the file."""
        if self._run_open:
            metadata = {constants.STATUS: constants.ABORTED, constants.EPOCH_NUM: self._epoch}
            self._write("end", constants.RUN_STOP, metadata=metadata | {"failure": failure or "the trial failed"})
            self._run_open = False
        for handler in list(self._logger.handlers):
            self._logger.removeHandler(handler)
            handler.close()


@dataclasses.dataclass(frozen=True)
class Compliance:
    """The MLCommons compliance checker's verdict on one log under one division's rules."""

    ruleset: str  # e.g. "hpc 3.0.0"
    problems: list[str]  # the checker's messages, verbatim; empty: compliant
    failed_keys: frozenset[str]  # the log keys whose rules failed

    @property
    def passed(self) -> bool:
        return not self.problems


# The checker keys most messages by log key; the few it does not key name theirs in the text.
_UNKEYED_MESSAGE_KEYS = (
    re.compile(r"^Failed checks for (\w+) :"),
    re.compile(r"^Required AT_LEAST_ONE occurrence of '(\w+)'"),
)


def check_log(path: Path, benchmark: dict) -> Compliance:
    """Run the compliance checker of the benchmark's ruleset on the log at ``path`` (the division is
    the log's ``submission_division``). Raises ValueError for a benchmark MLPerf has no rules for."""
    known = mlperf_rules(benchmark)
    if known is None:
        raise ValueError(
            f"benchmark {benchmark['name']!r} (model {benchmark['model']['name']!r}) has no MLPerf rules: "
            "its log cannot be checked for compliance"
        )
    checker = mlp_compliance.make_checker(known.usage, known.ruleset, quiet=False, werror=False)
    # The checker queues rule files in a module-level list; one left by an earlier failed run must not leak in.
    mlp_compliance.enqueued_configs.clear()
    problems: list[str] = []
    # The checker reports through logging's module functions, which configure the root logger when it
    # has no handler; a handler of its own for the check keeps the process's logging as it was.
    quiet = logging.NullHandler()
    logging.root.addHandler(quiet)
    try:
        checker.check_file(str(path), f"{known.usage}_{known.ruleset}/common.yaml")
    except FileNotFoundError as exc:  # a rule file the log's values point at does not exist
        problems.append(f"the checker stopped: {exc}")
    finally:
        logging.root.removeHandler(quiet)
    problems += [*checker.overwritable.values(), *checker.not_overwritable]
    failed = set(checker.overwritable)
    for message in checker.not_overwritable:
        for pattern in _UNKEYED_MESSAGE_KEYS:
            if match := pattern.match(message):
                failed.add(match.group(1))
    return Compliance(f"{known.usage} {known.ruleset}", problems, frozenset(failed))
