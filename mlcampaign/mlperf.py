"""Everything MLPerf-log-specific: which MLPerf benchmark and ruleset a project benchmark is, the
submission header, the hyperparameters as the MLPerf rules name and spell them, the log file itself
(rank 0 writes it, other ranks write nowhere) and a check against the MLCommons compliance checker.

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
  ``epochs_max`` epochs (``mlcampaign.hyperparameters.lr_factor``): cosine and polynomial decay to 0;
- Adam and AdamW with torch's defaults, which the Keras trial matches (``ADAM_BETAS``, ``ADAM_EPSILON``);
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

from mlcampaign.hyperparameters import batch_sizes, scaled_lr
from mlcampaign.models.cosmoflow import CosmoFlow

# torch.optim.Adam/AdamW's defaults, which the torch trial keeps; the Keras trial builds Adam with
# epsilon 1e-8 to match (its betas default to the same). MLPerf's DeepCAM reference uses eps 1e-6.
ADAM_BETAS = (0.9, 0.999)
ADAM_EPSILON = 1e-8

# Class-name spelling of the HPC references (Keras' SGD in CosmoFlow, torch's Adam/AdamW in DeepCAM),
# which the closed HPC rules check; the training rules spell ResNet-50's optimizers in lower case.
HPC_OPTIMIZER_NAMES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "lars": "LARS"}

# MLPerf's DeepCAM schedule names for the project's schedules (MultiStepLR's one decay rate cannot
# express the project's per-milestone factors in general, so a step schedule has none).
DEEPCAM_SCHEDULERS = {"cosine": "cosine_annealing"}

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


@dataclasses.dataclass(frozen=True)
class MLPerfBenchmark:
    """A benchmark of MLPerf's rules: its ``submission_benchmark`` name, the checker's ``usage`` and
    ``ruleset``, and the key of its quality value."""

    name: str
    usage: str
    ruleset: str
    quality_key: str


# Keyed by the project's model name (config/benchmarks/*.yaml model.name): every ResNet-50 variant is
# MLPerf's "resnet", whatever its dataset.
MLPERF_BENCHMARKS = {
    "resnet50": MLPerfBenchmark("resnet", "training", "4.0.0", constants.EVAL_ACCURACY),
    "cosmoflow": MLPerfBenchmark("cosmoflow", "hpc", "3.0.0", "eval_error"),  # no package constant for it
    "deepcam": MLPerfBenchmark("deepcam", "hpc", "3.0.0", constants.EVAL_ACCURACY),
}


def mlperf_benchmark(benchmark: dict) -> MLPerfBenchmark | None:
    """The MLPerf benchmark a project benchmark config is, or None where MLPerf has no rules for it."""
    return MLPERF_BENCHMARKS.get(benchmark["model"]["name"])


def quality_key(benchmark: dict) -> str:
    """The log key of the benchmark's quality: the MLPerf rules' key, else by the target's direction."""
    known = mlperf_benchmark(benchmark)
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
    known = mlperf_benchmark(benchmark)
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


def _warmup_steps(schedule: dict, steps_per_epoch: int) -> int:
    return int(schedule["warmup_epochs"] * steps_per_epoch)


def _decay_steps(schedule: dict, steps_per_epoch: int, epochs_max: int) -> int:
    """Steps over which cosine and polynomial schedules decay after the warm-up (as the trial counts them)."""
    return max(1, steps_per_epoch * epochs_max - _warmup_steps(schedule, steps_per_epoch))


def _end_lr(schedule: dict) -> float | None:
    """The learning rate the schedule decays to (None where it does not decay to a fixed value)."""
    return 0.0 if schedule["name"] in ("cosine", "polynomial") else None


def hyperparameters(spec: dict, steps_per_epoch: int, split_sizes: dict[str, int]) -> dict:
    """The trial's hyperparameters under MLPerf's keys (in logging order): the keys every benchmark
    logs, then the benchmark's closed-division keys as its rules name and spell them.

    ``steps_per_epoch``: optimizer steps per epoch as the trial runs them; ``split_sizes``: the
    staged ``train`` and ``val`` sample counts.
    """
    benchmark, trial = spec["benchmark"], spec["trial"]
    training = benchmark["training"]
    optimizer, schedule = training["optimizer"], training["schedule"]
    global_batch, local_batch = batch_sizes(training, trial["processes"])
    peak_lr = scaled_lr(training, global_batch)
    known = mlperf_benchmark(benchmark)
    hpc = known is not None and known.usage == "hpc"
    warmup_steps = _warmup_steps(schedule, steps_per_epoch)
    values = {
        constants.GLOBAL_BATCH_SIZE: global_batch,
        constants.TRAIN_SAMPLES: split_sizes["train"],
        constants.EVAL_SAMPLES: split_sizes["val"],
        constants.GRADIENT_ACCUMULATION_STEPS: 1,
        "gradient_accumulation_frequency": 1,
        constants.OPT_NAME: HPC_OPTIMIZER_NAMES[optimizer["name"]] if hpc else optimizer["name"],
        constants.OPT_BASE_LR: peak_lr,
        constants.OPT_WEIGHT_DECAY: optimizer["weight_decay"],
        constants.OPT_LR_WARMUP_EPOCHS: schedule["warmup_epochs"],
    }
    model = benchmark["model"]["name"]
    if model == "resnet50":
        values |= _resnet(optimizer, schedule, peak_lr, local_batch, steps_per_epoch, training["epochs_max"])
    elif model == "cosmoflow":
        values |= _cosmoflow(benchmark, schedule, warmup_steps)
    elif model == "deepcam":
        values |= _deepcam(optimizer, schedule, peak_lr, warmup_steps, steps_per_epoch, training["epochs_max"])
    return values


def _resnet(optimizer: dict, schedule: dict, peak_lr: float, local_batch: int, steps_per_epoch: int, epochs: int):
    """The training rules' ResNet-50 keys (closed_resnet_sgd.yaml, closed_resnet_lars.yaml): prefixed
    by the optimizer; the decay keys describe MLPerf's polynomial decay, so only that schedule has them."""
    values = {constants.MODEL_BN_SPAN: local_batch}
    name = optimizer["name"]
    if name not in ("sgd", "lars"):
        return values
    values |= {
        f"{name}_opt_base_learning_rate": peak_lr,
        f"{name}_opt_momentum": optimizer["momentum"],
        f"{name}_opt_weight_decay": optimizer["weight_decay"],
    }
    if name == "lars":
        values |= {
            constants.LARS_EPSILON: 0.0,
            constants.LARS_OPT_LEARNING_RATE_WARMUP_EPOCHS: schedule["warmup_epochs"],
        }
    if schedule["name"] == "polynomial":
        values |= {
            f"{name}_opt_end_learning_rate": _end_lr(schedule),
            f"{name}_opt_learning_rate_decay_poly_power": schedule["power"],
            f"{name}_opt_learning_rate_decay_steps": _decay_steps(schedule, steps_per_epoch, epochs),
        }
    return values


def _cosmoflow(benchmark: dict, schedule: dict, warmup_steps: int) -> dict:
    """The HPC rules' CosmoFlow keys (closed_cosmoflow.yaml), in the reference's sense: the warm-up
    factor is the peak learning rate over the warm-up's first one; decay boundaries and factors
    describe a step schedule (none for a constant one; a cosine or polynomial schedule has none)."""
    options = benchmark["model"].get("options", {})
    values = {
        # The peak over the first step's rate, (k + 1) / warm-up steps at step k: the warm-up's length.
        constants.OPT_LR_WARMUP_FACTOR: float(warmup_steps) if warmup_steps else 1.0,
        "dropout": options.get("dropout", inspect.signature(CosmoFlow).parameters["dropout"].default),
    }
    if schedule["name"] in ("step", "constant"):
        milestones = sorted(schedule.get("milestones", []), key=lambda milestone: milestone["epoch"])
        values |= {
            constants.OPT_LR_DECAY_BOUNDARY_EPOCHS: [milestone["epoch"] for milestone in milestones],
            # The factor of the peak rate from each boundary on (the reference logs only the largest).
            constants.OPT_LR_DECAY_FACTOR: [milestone["factor"] for milestone in milestones],
        }
    return values


def _deepcam(optimizer: dict, schedule: dict, peak_lr: float, warmup_steps: int, steps_per_epoch: int, epochs: int):
    """The HPC rules' DeepCAM keys (closed_deepcam*.yaml), named after the reference's torch optimizer
    parameters and schedulers. Its warm-up factor 1 means "linearly from 0 to opt_lr", as the trial does."""
    values = {"batchnorm_group_size": 1, "opt_lr": peak_lr}
    if optimizer["name"] in ("adam", "adamw"):
        values |= {"opt_betas": list(ADAM_BETAS), "opt_eps": ADAM_EPSILON}
    if schedule["name"] in DEEPCAM_SCHEDULERS:
        values |= {
            "scheduler_type": DEEPCAM_SCHEDULERS[schedule["name"]],
            "scheduler_t_max": _decay_steps(schedule, steps_per_epoch, epochs),
            "scheduler_eta_min": _end_lr(schedule),
        }
    values |= {"scheduler_lr_warmup_steps": warmup_steps, "scheduler_lr_warmup_factor": 1.0}
    return values


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
        """The hyperparameters (``hyperparameters``), once the data are open and before ``init_stop``."""
        for key, value in hyperparameters(self.spec, steps_per_epoch, split_sizes).items():
            self._write("event", key, value)

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
    known = mlperf_benchmark(benchmark)
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
