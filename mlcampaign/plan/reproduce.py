"""A campaign file that re-runs a published MLPerf HPC submission's settings on a system of this site
(``mlcampaign reproduce``).

Input: what the submission's result logs say (mlcampaign.records.mlperf.result_logs.log_record of each log of
one ``results/<system>/strong/<benchmark>/`` folder), the target system's config and a scale. Output: the
text of a complete campaign file (``reproduce_campaign``) whose header lists every logged setting, carried
over or not and why, and the rules by which the settings were scaled:

- the submission's per-accelerator batch is kept (``global_batch_size`` / processes: what fit a device
  there), so the global batch is that times the site's processes, and the learning rate scales linearly
  with the global batch (Goyal et al. 2017); at the submission's own process count both are the
  submission's;
- learning-rate schedules logged in optimizer steps (DeepCAM's warm-up and milestones) become epochs at the
  submission's steps per epoch (training samples / global batch): epochs, not steps, stay the same
  optimisation when the batch changes; the cap on epochs is twice the most epochs a submission run took.
  Each benchmark's schedule keys are its own: its folder's ``mlperf.py`` converts them (the function its
  registry entry names, ``MLPerfRules.reproduce``, called with the ``Settings`` being built);
- the CPU-sized override (``cpu_sized``, the default on a CPU system): the model and synthetic data of the
  default campaign's CPU-sized variant (config/config.yaml, ``benchmark_overrides``) and its global batch and
  epoch cap (the submission's batch would be a whole CPU-sized dataset per step); the submission's learning
  rate, weight decay and schedule in epochs, unscaled: the CPU-sized model is not the one they were tuned for.

The project's own settings stay where the submission's cannot be carried (its optimizers are sgd, adam,
adamw and lars; its Adam epsilon is torch's; its data are the benchmark's own dataset source), and each
such setting is listed with the reason. What the logs lack is defaulted and listed the same way: the
campaign seed, where no log records one, derives from the first log's sha256; the global batch, the
learning rate and the training-set size (the steps per epoch of a schedule in steps) are the project's
benchmark's. A weak-scaling submission's logs are its model instances, trained at once: it is reproduced as
one instance's settings, in the number of runs the strong-scaling rules take of the benchmark (one seeded
trial each), not one trial per instance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import yaml
from mlperf_logging.benchmark_meta import get_result_file_counts

from mlcampaign.plan.config import deep_merge
from mlcampaign.plan.hyperparameters import ADAM_BETAS, ADAM_EPSILON
from mlcampaign.plan.registry import MLPerfRules, mlperf_models, resolve

USAGE = "hpc"  # MLPerf HPC's rules: the submissions reproduced
# Settings of a submission's log that are not hyperparameters to carry: the scale, the data sizes, bookkeeping.
_SCALE_KEYS = ("global_batch_size", "train_samples", "eval_samples")
# NVIDIA's mixed precision (torch.cuda.amp, fp16) on accelerators.
_PRECISIONS = {"amp": "fp16", "fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}
_OPTIMIZERS = {"sgd": "sgd", "adam": "adam", "adamw": "adamw", "lamb": "adamw", "lars": "lars"}
# Settings every trial has one value of, and what that value means.
_FIXED_SETTINGS = (
    ("gradient_accumulation_frequency", "one optimizer step per batch"),
    ("batchnorm_group_size", "BatchNorm statistics per process"),
)


class ReproduceError(ValueError):
    """A submission that cannot be reproduced here; the message names what and why."""


class Settings:
    """The campaign's benchmark settings, built from the submission's logged hyperparameters: each key taken
    (``take``) is carried over (``carry``: what it became) or not (``drop``: why); ``training`` and
    ``model_options`` are what the campaign's ``benchmark_overrides`` set."""

    def __init__(self, hyperparameters: dict, logged: dict | None = None) -> None:
        self.remaining = dict(hyperparameters)
        # The submission's seed, global batch, training-set size and (where it logs none) learning rate: as
        # logged, or derived or defaulted (``_logged``).
        self.logged = dict(logged or {})
        self.carried: list[str] = []
        self.not_carried: list[str] = []
        self.training: dict = {}
        self.model_options: dict = {}

    def take(self, key: str, default=None):
        return self.remaining.pop(key, default)

    def carry(self, text: str) -> None:
        self.carried.append(text)

    def drop(self, key: str, value, why: str) -> None:
        self.not_carried.append(f"{key} = {value!r}: {why}")


def _consensus(records: Sequence[Mapping]) -> tuple[dict, list[str]]:
    """The hyperparameters every run logged alike, and the keys whose values differ between runs."""
    first = dict(records[0]["hyperparameters"])
    differing = sorted(
        key for key in first if any(record["hyperparameters"].get(key) != first[key] for record in records[1:])
    )
    return {key: value for key, value in first.items() if key not in differing}, differing


def _scale(scale: str | None, system: Mapping) -> tuple[int, int]:
    if scale is None:
        return 1, system.get("devices_per_node", 1) if system["device"] != "cpu" else 1
    nodes, _, per_node = scale.partition("x")
    if not (nodes.isdigit() and per_node.isdigit() and int(nodes) > 0 and int(per_node) > 0):
        raise ReproduceError(f"--scale {scale!r}: not <nodes>x<processes per node>, e.g. 1x4")
    return int(nodes), int(per_node)


def _processes_there(record: Mapping) -> int:
    """The processes of the submission's run: its instance scale, else nodes x accelerators per node (1 where
    the log has neither)."""
    return record["instance_scale"] or (record["number_of_nodes"] or 1) * max(record["accelerators_per_node"] or 0, 1)


def _rules(submission: Mapping) -> MLPerfRules:
    """The MLPerf rules of the project's model of the submission's benchmark, with its schedule conversion."""
    name = submission["benchmark"]
    models = mlperf_models(USAGE, name)
    if not models:
        raise ReproduceError(f"{submission['source']}: the project has no model of MLPerf HPC benchmark {name!r}")
    rules = next(iter(models.values())).mlperf
    if rules.reproduce is None:
        raise ReproduceError(
            f"{submission['source']}: the project's {name} does not convert a submission's schedule "
            "(no MLPerfRules.reproduce in its benchmark folder)"
        )
    return rules


def _batch_and_rate(
    settings: Settings, records: Sequence[Mapping], processes: int, cpu_sized, name: str
) -> tuple[list[str], float]:
    """The global batch and epoch cap here by the module docstring's rules (into ``settings.training``), and
    the peak learning rate (carried over); returns the rules applied, in words, and that rate."""
    first = records[0]
    batch = settings.logged["global_batch_size"]
    processes_there = _processes_there(first)
    lr_key = "opt_lr" if "opt_lr" in settings.remaining else "opt_base_learning_rate"
    lr = settings.take(lr_key)
    if lr is None:
        lr = settings.logged["lr"]
        settings.drop(lr_key, None, f"not logged: the project's {name} learning rate {lr} is the peak rate there")
    for key in _SCALE_KEYS:
        settings.take(key)
    if cpu_sized is None:
        local_batch = max(batch // processes_there, 1)
        global_batch = local_batch * processes
        lr_here = lr * global_batch / batch
        most_epochs = max(record["epochs_to_converge"] or 0 for record in records)
        epochs_max = max(2 * math.ceil(most_epochs), 1)
        rules = [
            f"global batch {batch} on {processes_there} processes -> {global_batch} on {processes} (the "
            f"submission's {local_batch} per process); learning rate {lr} x {global_batch}/{batch} = {lr_here:.6g}",
            f"epochs_max {epochs_max}: twice the most epochs a submission run took ({most_epochs})",
        ]
        settings.training |= {"global_batch_size": global_batch, "epochs_max": epochs_max}
    else:
        lr_here = lr
        rules = [
            f"CPU-sized (config/config.yaml's {name} override): its model, data, global batch "
            f"{cpu_sized['training']['global_batch_size']} and {cpu_sized['training']['epochs_max']} epochs; "
            f"the submission's learning rate {lr}, unscaled"
        ]
    settings.carry(f"{lr_key} {lr} -> optimizer lr {lr_here:.6g} (rules above)")
    return rules, lr_here


def _optimizer(settings: Settings, lr: float) -> None:
    name = settings.take("opt_name")
    mapped = _OPTIMIZERS.get(str(name).lower())
    if mapped is None:
        settings.drop("opt_name", name, "the project's optimizers are sgd, adam, adamw and lars; adamw is used")
        mapped = "adamw"
    elif str(name).lower() == "lamb":
        settings.drop("opt_name", name, "LAMB is AdamW with a per-layer trust ratio, which the project has not: adamw")
    else:
        settings.carry(f"opt_name {name} -> optimizer {mapped}")
    optimizer = {"name": mapped, "lr": lr}
    weight_decay = settings.take("opt_weight_decay")
    if weight_decay is not None:
        optimizer["weight_decay"] = weight_decay
        settings.carry(f"opt_weight_decay {weight_decay}")
    momentum = settings.take("opt_momentum")
    if momentum is not None and mapped in ("sgd", "lars"):
        optimizer["momentum"] = momentum
        settings.carry(f"opt_momentum {momentum}")
    elif momentum is not None:
        settings.drop("opt_momentum", momentum, f"{mapped} has no momentum setting")
    betas = settings.take("opt_betas")
    if betas is not None:
        if list(betas) == list(ADAM_BETAS) and mapped in ("adam", "adamw"):
            settings.carry(f"opt_betas {betas} (the project's Adam betas)")
        else:
            settings.drop("opt_betas", betas, f"the project's {mapped} uses {list(ADAM_BETAS)} and cannot be set")
    eps = settings.take("opt_eps")
    if eps is not None:
        if eps == ADAM_EPSILON:
            settings.carry(f"opt_eps {eps}")
        else:
            settings.drop("opt_eps", eps, f"the project's Adam epsilon is torch's {ADAM_EPSILON} and cannot be set")
    for key in ("opt_bias_correction", "opt_grad_averaging", "opt_max_grad_norm", "opt_step"):
        if key in settings.remaining:
            settings.drop(key, settings.take(key), "a LAMB setting (the project has no LAMB, no gradient clipping)")
    settings.training["optimizer"] = optimizer


def _precision(settings: Settings, system: Mapping) -> str:
    """The trials' precision (the submission's mixed precision on accelerators, else fp32) and memory layout."""
    precision = "fp32"
    mode = settings.take("precision_mode")
    if mode is not None:
        mapped = _PRECISIONS.get(str(mode).lower())
        if mapped is not None and system["device"] != "cpu":
            precision = mapped
            settings.carry(f"precision_mode {mode} -> precision {mapped}")
        else:
            why = (
                "mixed precision of accelerators: fp32 on a CPU system" if mapped else "not a precision of the project"
            )
            settings.drop("precision_mode", mode, why)
    nhwc = settings.take("enable_nhwc")
    if nhwc is not None:
        settings.training["channels_last"] = bool(nhwc)
        settings.carry(f"enable_nhwc {nhwc} -> channels_last {bool(nhwc)}")
    return precision


def _the_rest(settings: Settings, records: Sequence[Mapping], name: str, benchmark: Mapping) -> None:
    """What the project fixes (one step per batch, BatchNorm per process), and why the data, the settings
    left and the seeds are not carried over."""
    first = records[0]
    for key, meaning in _FIXED_SETTINGS:
        value = settings.take(key)
        if value == 1:
            settings.carry(f"{key} 1 (the project's: {meaning})")
        elif value is not None:
            settings.drop(key, value, f"the project's is 1 ({meaning})")
    settings.drop(
        "train_samples / eval_samples",
        (first["train_samples"], first["eval_samples"]),
        f"the project's {name} data: its benchmark file's source ({benchmark['dataset']['name']}); give a path "
        "source of the real dataset to train on it",
    )
    for key, value in sorted(settings.remaining.items()):
        settings.drop(key, value, "no setting of the project's (data loading, kernels, bookkeeping)")
    seeds = [record["seed"] for record in records]
    if any(seed is not None for seed in seeds):
        settings.drop("seed", seeds, "each trial's seed derives from the campaign seed (README, Seeds)")


def _seed(value) -> int | None:
    """A logged seed as a whole number (1234, "1234"), None where it is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and value.strip().isdigit() else None


def _logged(settings: Settings, records: Sequence[Mapping], benchmark: Mapping, name: str) -> dict:
    """The submission's seed, global batch and training-set size as its first log has them, and the learning
    rate to use where it logs none; what it lacks derived or defaulted (module docstring) and listed as not
    carried over."""
    first, training = records[0], benchmark["training"]
    seed = _seed(first["seed"])
    if seed is None:
        seed = int(first["sha256"][:8], 16)
        settings.drop(
            "seed (campaign)",
            first["seed"],
            f"not logged as a number: the campaign seed {seed} derives from the first log's sha256",
        )
    batch = first["global_batch_size"]
    if not isinstance(batch, int) or batch < 1:
        batch = training["global_batch_size"]
        settings.drop("global_batch_size", first["global_batch_size"], f"not logged: the project's {name} {batch}")
    train_samples = first["train_samples"]
    if not isinstance(train_samples, int | float) or train_samples <= 0:
        train_samples = benchmark["dataset"]["source"].get("options", {}).get("train_samples", batch)
        settings.drop(
            "train_samples (steps per epoch)",
            first["train_samples"],
            f"not logged: the project's {name} training set of {train_samples} samples sets the steps per epoch",
        )
    return {"seed": seed, "global_batch_size": batch, "train_samples": train_samples, "lr": training["optimizer"]["lr"]}


def reproduce_campaign(
    submission: Mapping,
    system: Mapping,
    benchmark: Mapping,
    *,
    scale: str | None = None,
    cpu_sized: Mapping | None = None,
    org: str | None = None,
) -> str:
    """The campaign file's text that reproduces ``submission`` on ``system`` (its config) at ``scale``
    (default: one node, one process per device). ``submission``: round, submitter, system, benchmark (the
    MLPerf name), source and ``records`` (its logs, mlcampaign.records.mlperf.result_logs.log_record);
    ``benchmark``: the project's config of that benchmark (config/benchmarks/<name>.yaml); ``cpu_sized``:
    the CPU-sized override of the default campaign for it, applied when given (module docstring); ``org``:
    the MLPerf log header's submission_org (this site's organisation; never the submitter's)."""
    name = submission["benchmark"]
    rules = _rules(submission)
    records = submission["records"]
    if not records:
        raise ReproduceError(f"{submission['source']}: no result log that can be read")
    hyperparameters, differing = _consensus(records)
    settings = Settings(hyperparameters)
    settings.logged = _logged(settings, records, benchmark, name)
    for key in differing:
        settings.drop(key, [r["hyperparameters"].get(key) for r in records], "the runs logged different values")
    first = records[0]
    nodes, per_node = _scale(scale, system)
    scaling_rules, lr = _batch_and_rate(settings, records, nodes * per_node, cpu_sized, name)
    trials = _trials(submission, records, rules, scaling_rules)
    settings.training["lr_scaling"] = {"rule": "none"}
    _optimizer(settings, lr)
    resolve(rules.reproduce)(settings, settings.logged["train_samples"] / settings.logged["global_batch_size"])
    precision = _precision(settings, system)
    _the_rest(settings, records, name, benchmark)

    overrides: dict = {"training": settings.training}
    if settings.model_options:
        overrides["model"] = {"options": settings.model_options}
    if cpu_sized is not None:
        overrides = deep_merge(cpu_sized, overrides)
        overrides["training"]["global_batch_size"] = cpu_sized["training"]["global_batch_size"]
    campaign = {
        "campaign": _campaign_name(submission, system["name"]),
        "description": (
            f"MLPerf HPC {submission['round']} {submission['submitter']} {submission['system']} {name} "
            f"({len(records)} runs) reproduced on {system['name']} at {nodes}x{per_node}"
            + (", CPU-sized" if cpu_sized is not None else "")
        ),
        "seed": settings.logged["seed"] % 2**32,
        "trials": trials,
        "systems": [system["name"]],
        "benchmarks": [name],
        "matrix": {"scales": [f"{nodes}x{per_node}"], "precisions": [precision]},
        "benchmark_overrides": {name: overrides},
        "mlperf": ({"org": org} if org else {}) | {"division": "open", "status": "research"},
    }
    header = [
        f"Reproduction of MLPerf HPC {submission['round']}: {submission['submitter']}, system {submission['system']}, "
        f"{name}, {len(records)} runs at {first['number_of_nodes']}x{first['accelerators_per_node']} "
        f"({_processes_there(first)} processes)",
        f"from {submission['source']}",
        f"on {system['name']} at {nodes}x{per_node}. Written by mlcampaign reproduce; edit freely.",
        "",
        "Rules applied:",
        *(f"  - {rule}" for rule in scaling_rules),
        "Carried over:",
        *(f"  - {text}" for text in settings.carried),
        "Not carried over (why):",
        *(f"  - {text}" for text in settings.not_carried),
        "MLPerf log header: division open"
        + (f", org {org}." if org else "; set mlperf.org to this site's organisation to export it (export-mlperf)."),
    ]
    body = yaml.safe_dump(campaign, sort_keys=False, width=110)
    return "".join(f"# {line}\n".replace("# \n", "#\n") for line in header) + body


def _trials(submission: Mapping, records: Sequence[Mapping], rules: MLPerfRules, scaling_rules: list[str]) -> int:
    """The campaign's trials: one per run of a strong-scaling submission; for a weak-scaling one (its logs are
    model instances trained at once), the runs the strong-scaling rules take of the benchmark."""
    if submission.get("scaling", "strong") == "strong":
        return len(records)
    runs = get_result_file_counts(USAGE)[rules.name]
    scaling_rules.append(
        f"weak scaling: its {len(records)} logs are model instances trained at once, each at instance scale "
        f"{records[0]['instance_scale']}; reproduced as one instance, in the {runs} runs MLPerf HPC takes of "
        f"{submission['benchmark']}"
    )
    return runs


def _campaign_name(submission: Mapping, system: str) -> str:
    text = f"reproduce-{submission['benchmark']}-{submission['submitter']}-{submission['round']}-{system}"
    return "".join(character if character.isalnum() or character in "._-" else "-" for character in text)
