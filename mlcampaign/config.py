"""Campaign configuration: schema validation, benchmark overrides and the trial matrix.

Every config file is validated against its JSON schema in ``config/schemas/`` before any
job is planned; all problems of a file are reported at once, each naming the file, the
key path and the offending value.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd
import yaml

from mlcampaign import launch
from mlcampaign.seeding import derive_seed
from mlcampaign.tf.models import check_keras_model

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA_DIR = REPO_ROOT / "config" / "schemas"


# The coordinates that identify one trial (wildcards of the trial rule, index of the matrix).
TRIAL_KEYS = ["system", "benchmark", "cell", "trial", "replicate"]


class ConfigError(ValueError):
    """A config file does not satisfy its schema or refers to something that does not exist."""


def _extend_with_defaults(validator_class):
    """A validator that fills in ``default`` values while it validates (as snakemake.utils.validate does)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema:
                    instance.setdefault(name, copy.deepcopy(subschema["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_DefaultingValidator = _extend_with_defaults(jsonschema.Draft202012Validator)


def load_schema(name: str) -> dict:
    with open(SCHEMA_DIR / f"{name}.schema.yaml") as handle:
        return yaml.safe_load(handle)


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "<top level>"


def _non_string_keys(instance: Any, path: tuple = ()) -> Iterator[tuple]:
    """Paths to mapping keys that are not strings: YAML reads `1: x` as an integer key, but a config
    is a JSON document (schemas, trial specs), and such keys fail deep inside instead of here."""
    if isinstance(instance, Mapping):
        for key, value in instance.items():
            yield from _non_string_keys(value, (*path, key)) if isinstance(key, str) else [(*path, key)]
    elif isinstance(instance, list):
        for index, value in enumerate(instance):
            yield from _non_string_keys(value, (*path, index))


def validate(instance: Any, schema_name: str, source: str) -> Any:
    """Validate ``instance`` (filling defaults in place) or raise ConfigError listing every problem."""
    bad_keys = list(_non_string_keys(instance))
    if bad_keys:
        lines = [
            f"  {source}: key '{'.'.join(map(str, path))}': value {path[-1]!r}: keys must be strings (quote it)"
            for path in bad_keys
        ]
        raise ConfigError(f"invalid {schema_name} configuration ({len(lines)} problem(s)):\n" + "\n".join(lines))
    validator = _DefaultingValidator(load_schema(schema_name))
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = [f"  {source}: key '{_key_path(e)}': value {e.instance!r}: {e.message}" for e in errors]
        raise ConfigError(f"invalid {schema_name} configuration ({len(errors)} problem(s)):\n" + "\n".join(lines))
    return instance


def load_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        with open(path) as handle:
            data = yaml.safe_load(handle)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def deep_merge(base: Mapping, override: Mapping) -> dict:
    """Return ``base`` with ``override`` merged in: mappings merge recursively, other values replace."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@dataclasses.dataclass(frozen=True)
class Scale:
    """A process layout: ``nodes`` x ``tasks_per_node`` processes (one per device or MPI rank)."""

    nodes: int
    tasks_per_node: int

    @classmethod
    def parse(cls, text: str) -> Scale:
        nodes, tasks = text.split("x")
        return cls(int(nodes), int(tasks))

    @property
    def processes(self) -> int:
        return self.nodes * self.tasks_per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.tasks_per_node}"


# Matrix dimensions after scale and precision, with the value that leaves a dimension out of the
# cell id: campaigns that do not vary a dimension keep their cell names (and their results).
CELL_DEFAULTS = {"compression": "none", "framework": "torch", "backend": "native"}


# The cell of a (system, benchmark) pair that is not planned (Campaign.unplanned_cells), and the
# columns that say why.
UNPLANNED_CELL = "not planned"
UNPLANNED_COLUMNS = ["system", "benchmark", "cell", "expected_outcome", "detail", "source", "runnable"]


def runnable(system: dict) -> bool:
    """Whether this project can start trials on the system (its launcher is not ``none``)."""
    return system["launcher"] != "none"


def expected_outcome(campaign_config: dict, system: str, benchmark: str) -> dict | None:
    """The ``expected_outcomes`` entry of a (system, benchmark) pair, if any."""
    return next(
        (
            entry
            for entry in campaign_config["expected_outcomes"]
            if (entry["system"], entry["benchmark"]) == (system, benchmark)
        ),
        None,
    )


def cell_id(scale: Scale, precision: str, compression: str, framework: str, backend: str) -> str:
    """The path-safe name of one matrix cell of a (system, benchmark) pair.

    ``<scale>-<precision>``, then ``-grad_<dtype>`` for a compressed all-reduce, the framework
    when it is not torch and the backend when it is not native, e.g. ``1x2-bf16-grad_fp16`` or
    ``2x4-fp32-tensorflow-horovod``.
    """
    parts = [str(scale), precision]
    if compression != CELL_DEFAULTS["compression"]:
        parts.append(f"grad_{compression}")
    if framework != CELL_DEFAULTS["framework"]:
        parts.append(framework)
    if backend != CELL_DEFAULTS["backend"]:
        parts.append(backend)
    return "-".join(parts)


def batch_sizes(training: dict, processes: int) -> tuple[int, int]:
    """(global, local) batch of a benchmark's training config at ``processes`` processes.

    Strong scaling keeps ``global_batch_size`` (it must divide evenly); weak scaling keeps
    ``local_batch_size``.
    """
    if training["batch_scaling"] == "weak":
        return training["local_batch_size"] * processes, training["local_batch_size"]
    global_batch = training["global_batch_size"]
    if global_batch % processes:
        raise ValueError(f"global_batch_size {global_batch} is not divisible by {processes} processes")
    return global_batch, global_batch // processes


def scaled_lr(training: dict, global_batch: int) -> float:
    """The peak learning rate at ``global_batch`` under the benchmark's ``lr_scaling`` rule."""
    rule = training["lr_scaling"]["rule"]
    lr = training["optimizer"]["lr"]
    if rule == "none":
        return lr
    ratio = global_batch / training["lr_scaling"]["base_batch_size"]
    return lr * (ratio if rule == "linear" else math.sqrt(ratio))


@dataclasses.dataclass
class Campaign:
    config: dict
    systems: dict[str, dict]
    benchmarks: dict[str, dict]
    config_dir: Path

    @property
    def name(self) -> str:
        return self.config["campaign"]

    def expected_outcome(self, system: str, benchmark: str) -> dict | None:
        """The campaign's ``expected_outcomes`` entry of a (system, benchmark) pair, if any."""
        return expected_outcome(self.config, system, benchmark)

    def planned_pairs(self) -> Iterator[tuple[str, str]]:
        """(system, benchmark) pairs planned as jobs: the system has a launcher and the pair no
        expected (published) failure."""
        for system_name, system in self.systems.items():
            for benchmark_name in self.benchmarks:
                if runnable(system) and self.expected_outcome(system_name, benchmark_name) is None:
                    yield system_name, benchmark_name

    def unplanned_cells(self) -> pd.DataFrame:
        """The (system, benchmark) pairs not planned as jobs, each with why: an expected outcome
        (published) or a system this project cannot run (launcher none). Their cell is
        UNPLANNED_CELL: an unplanned pair has no layout of this project (the study's may be unknown)."""
        planned = set(self.planned_pairs())
        rows = []
        for system_name, system in self.systems.items():
            for benchmark_name in self.benchmarks:
                if (system_name, benchmark_name) in planned:
                    continue
                expected = self.expected_outcome(system_name, benchmark_name)
                rows.append(
                    {
                        "system": system_name,
                        "benchmark": benchmark_name,
                        "cell": UNPLANNED_CELL,
                        "expected_outcome": expected["outcome"] if expected else None,
                        "detail": (expected or {}).get("detail") or system.get("not_runnable_reason"),
                        "source": expected["source"] if expected else f"config/systems/{system_name}.yaml",
                        "runnable": runnable(system),
                    }
                )
        return pd.DataFrame(rows, columns=UNPLANNED_COLUMNS)

    def trial_spec(self, trial: Mapping) -> dict:
        """Everything one trial needs (the trial job's ``--spec``): its matrix row (``trial``), the
        campaign's name and determinism, and its system and benchmark configs."""
        return {
            "campaign": self.name,
            "deterministic": self.config["deterministic"],
            "trial": dict(trial),
            "system": self.systems[trial["system"]],
            "benchmark": self.benchmarks[trial["benchmark"]],
        }

    def trials(self) -> Iterator[dict]:
        """Every planned trial, in a stable order."""
        for system_name, benchmark_name in self.planned_pairs():
            system = self.systems[system_name]
            matrix = benchmark_matrix(self.config, benchmark_name, system_name)
            for scale_text, precision, compression, framework, backend in itertools.product(
                matrix["scales"],
                matrix["precisions"],
                matrix["compressions"],
                matrix["frameworks"],
                matrix["backends"],
            ):
                scale = Scale.parse(scale_text)
                if compression != "none" and scale.processes == 1:
                    continue  # one process has no all-reduce to compress
                for trial, replicate in itertools.product(
                    range(self.config["trials"]), range(self.config["replicates"])
                ):
                    yield {
                        "system": system_name,
                        "benchmark": benchmark_name,
                        "cell": cell_id(scale, precision, compression, framework, backend),
                        "trial": trial,
                        "replicate": replicate,
                        "nodes": scale.nodes,
                        "tasks_per_node": scale.tasks_per_node,
                        "processes": scale.processes,
                        "precision": precision,
                        "compression": compression,
                        "framework": framework,
                        "backend": backend,
                        "seed": derive_seed(self.config["seed"], benchmark_name, trial),
                        "executor": system["executor"],
                    }

    def trial_matrix(self) -> pd.DataFrame:
        """One row per planned trial, indexed by TRIAL_KEYS."""
        return pd.DataFrame(list(self.trials())).set_index(TRIAL_KEYS, drop=False)


def benchmark_matrix(campaign_config: dict, benchmark: str, system: str | None = None) -> dict:
    """The campaign's matrix for one benchmark (on one system): ``matrix`` with its
    ``matrix_overrides`` entry applied, then the system's ``system_matrix_overrides`` entry and
    that entry's ``benchmarks`` entry."""
    matrix = campaign_config["matrix"] | campaign_config["matrix_overrides"].get(benchmark, {})
    per_system = dict(campaign_config["system_matrix_overrides"].get(system, {}))
    per_pair = per_system.pop("benchmarks", {}).get(benchmark, {})
    return matrix | per_system | per_pair


def _matrix_key(campaign_config: dict, benchmark: str, dimension: str, system: str | None = None) -> str:
    """Where a benchmark's matrix dimension (on a system) is set, for error messages."""
    per_system = campaign_config["system_matrix_overrides"].get(system, {})
    if dimension in per_system.get("benchmarks", {}).get(benchmark, {}):
        return f"system_matrix_overrides.{system}.benchmarks.{benchmark}.{dimension}"
    if dimension in per_system:
        return f"system_matrix_overrides.{system}.{dimension}"
    if dimension in campaign_config["matrix_overrides"].get(benchmark, {}):
        return f"matrix_overrides.{benchmark}.{dimension}"
    return f"matrix.{dimension}"


def _check_plan(campaign_config: dict, systems: dict[str, dict], source: str) -> None:
    """Cross-file checks that a schema cannot express."""
    unknown = sorted(set(campaign_config["matrix_overrides"]) - set(campaign_config["benchmarks"]))
    if unknown:
        raise ConfigError(
            f"{source}: key 'matrix_overrides': value {unknown} names benchmarks the campaign does not run"
        )
    for system_name, system in systems.items():
        for benchmark in campaign_config["benchmarks"]:
            if not runnable(system) or expected_outcome(campaign_config, system_name, benchmark):
                continue  # not planned: no layout to check
            matrix = benchmark_matrix(campaign_config, benchmark, system_name)
            for scale_text in matrix["scales"]:
                scale = Scale.parse(scale_text)
                if scale.nodes > system["nodes_max"]:
                    raise ConfigError(
                        f"{source}: key '{_matrix_key(campaign_config, benchmark, 'scales', system_name)}': value "
                        f"'{scale_text}' needs {scale.nodes} nodes but system '{system_name}' has nodes_max "
                        f"{system['nodes_max']}"
                    )
            for precision in matrix["precisions"]:
                if precision not in system["peak_flops_per_device"]:
                    raise ConfigError(
                        f"{source}: key '{_matrix_key(campaign_config, benchmark, 'precisions', system_name)}': value "
                        f"'{precision}' has no peak_flops_per_device.{precision} in "
                        f"config/systems/{system_name}.yaml"
                    )


def _check_system_references(campaign_config: dict, systems: dict[str, dict], config_dir: Path, source: str) -> None:
    """Systems named by system_matrix_overrides, expected_outcomes and published.systems have a
    config file (they need not be in this run's list: a site runs its part of a campaign), and
    expected outcomes name the campaign's benchmarks."""
    references = [
        *((f"system_matrix_overrides.{name}", name) for name in campaign_config["system_matrix_overrides"]),
        *(
            (f"expected_outcomes.{i}.system", entry["system"])
            for i, entry in enumerate(campaign_config["expected_outcomes"])
        ),
        *(
            (f"published.systems.{name}.{i}", study_system)
            for name, study_systems in campaign_config.get("published", {}).get("systems", {}).items()
            for i, study_system in enumerate(study_systems)
        ),
    ]
    for key, name in references:
        if name not in systems and not (config_dir / "systems" / f"{name}.yaml").is_file():
            raise ConfigError(f"{source}: key '{key}': value '{name}': no file config/systems/{name}.yaml")
    for i, entry in enumerate(campaign_config["expected_outcomes"]):
        if entry["benchmark"] not in campaign_config["benchmarks"]:
            raise ConfigError(
                f"{source}: key 'expected_outcomes.{i}.benchmark': value '{entry['benchmark']}' is not a benchmark "
                "of the campaign"
            )
    for name, overrides in campaign_config["system_matrix_overrides"].items():
        unknown = sorted(set(overrides.get("benchmarks", {})) - set(campaign_config["benchmarks"]))
        if unknown:
            raise ConfigError(
                f"{source}: key 'system_matrix_overrides.{name}.benchmarks': value {unknown} names benchmarks the "
                "campaign does not run"
            )


def _check_parallel_plan(campaign_config: dict, systems: dict[str, dict], benchmarks: dict[str, dict], source: str):
    """Layouts, batch sizes, frameworks and backends that every planned cell can actually run."""
    for name, benchmark in benchmarks.items():
        planned_systems = [
            system_name
            for system_name, system in systems.items()
            if runnable(system) and not expected_outcome(campaign_config, system_name, name)
        ]
        matrices = {
            system_name: benchmark_matrix(campaign_config, name, system_name) for system_name in planned_systems
        }
        for system_name, matrix in matrices.items():
            system = systems[system_name]
            for scale_text, backend in itertools.product(matrix["scales"], matrix["backends"]):
                scale = Scale.parse(scale_text)
                try:
                    launch.check_layout(system, scale.nodes, scale.tasks_per_node, backend)
                except ValueError as error:
                    raise ConfigError(
                        f"{source}: key '{_matrix_key(campaign_config, name, 'scales', system_name)}': value '{scale}' "
                        f"with backend '{backend}' on system '{system_name}' (config/systems/{system_name}.yaml): "
                        f"{error}"
                    ) from None
        # What any planned system runs of this benchmark (the checks below do not depend on the system).
        matrix = {
            dimension: list(dict.fromkeys(value for m in matrices.values() for value in m[dimension]))
            for dimension in ("scales", "frameworks", "backends", "compressions")
        }
        scales = [Scale.parse(text) for text in matrix["scales"]]
        training, where = benchmark["training"], f"config/benchmarks/{name}.yaml"
        unused = "global_batch_size" if training["batch_scaling"] == "weak" else "local_batch_size"
        if training.get(unused) is not None:
            raise ConfigError(
                f"{where}: key 'training.{unused}': value {training[unused]} contradicts batch_scaling "
                f"'{training['batch_scaling']}'; remove it (or set it to null in a campaign override)"
            )
        for scale in scales:
            try:
                batch_sizes(training, scale.processes)
            except ValueError as error:
                raise ConfigError(f"{where}: key 'training.global_batch_size': at scale '{scale}': {error}") from None
        if "tensorflow" in matrix["frameworks"]:
            try:
                check_keras_model(benchmark["model"]["name"], benchmark["model"]["options"])
                if benchmark["training"]["optimizer"]["name"] == "lars":
                    raise ValueError("Keras has no LARS optimizer; LARS runs in torch cells only")
            except ValueError as error:
                raise ConfigError(
                    f"{source}: key '{_matrix_key(campaign_config, name, 'frameworks')}': value 'tensorflow' "
                    f"for {where}: {error}"
                ) from None
        if "horovod" in matrix["backends"] and "bf16" in matrix["compressions"]:
            raise ConfigError(
                f"{source}: key '{_matrix_key(campaign_config, name, 'compressions')}': value 'bf16' cannot run "
                "with backend 'horovod' (Horovod compresses to fp16 only)"
            )


def load_campaign(campaign_config: dict, config_dir: Path, source: str = "campaign config") -> Campaign:
    """Validate the campaign and load + validate every system and benchmark it names.

    ``source`` names the campaign file(s) in error messages; ``config_dir`` holds
    ``systems/`` and ``benchmarks/``.
    """
    campaign_config = validate(copy.deepcopy(campaign_config), "campaign", source)
    config_dir = Path(config_dir)

    systems = {}
    for name in campaign_config["systems"]:
        path = config_dir / "systems" / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"{source}: key 'systems': value '{name}': no file {path}")
        system = validate(load_yaml(path), "system", str(path))
        if system["name"] != name:
            raise ConfigError(f"{path}: key 'name': value '{system['name']}' must equal the file name '{name}'")
        systems[name] = system

    overrides = campaign_config["benchmark_overrides"]
    unknown = sorted(set(overrides) - set(campaign_config["benchmarks"]))
    if unknown:
        raise ConfigError(
            f"{source}: key 'benchmark_overrides': value {unknown} names benchmarks the campaign does not run"
        )
    benchmarks = {}
    for name in campaign_config["benchmarks"]:
        path = config_dir / "benchmarks" / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"{source}: key 'benchmarks': value '{name}': no file {path}")
        raw = load_yaml(path)
        validate(copy.deepcopy(raw), "benchmark", str(path))
        if raw["name"] != name:
            raise ConfigError(f"{path}: key 'name': value '{raw['name']}' must equal the file name '{name}'")
        if name in overrides:
            merged_source = f"{path} with {source} benchmark_overrides.{name}"
            benchmark = validate(deep_merge(raw, overrides[name]), "benchmark", merged_source)
        else:
            benchmark = validate(raw, "benchmark", str(path))
        benchmarks[name] = benchmark

    _check_datasets_consistent(benchmarks)
    _check_system_references(campaign_config, systems, config_dir, source)
    _check_plan(campaign_config, systems, source)
    _check_parallel_plan(campaign_config, systems, benchmarks, source)
    campaign = Campaign(campaign_config, systems, benchmarks, config_dir)
    if next(campaign.planned_pairs(), None) is None:
        raise ConfigError(
            f"{source}: key 'systems': value {campaign_config['systems']}: no trial is planned (every system has "
            "launcher none or every pair an expected outcome)"
        )
    return campaign


def _check_datasets_consistent(benchmarks: dict[str, dict]) -> None:
    """Benchmarks may share a dataset by name only if they define it identically."""
    seen: dict[str, tuple[str, dict]] = {}
    for name, benchmark in benchmarks.items():
        dataset = benchmark["dataset"]
        if dataset["name"] in seen and seen[dataset["name"]][1] != dataset:
            other = seen[dataset["name"]][0]
            raise ConfigError(
                f"config/benchmarks/{name}.yaml: key 'dataset': dataset '{dataset['name']}' is defined "
                f"differently in config/benchmarks/{other}.yaml; give one of them another name"
            )
        seen.setdefault(dataset["name"], (name, dataset))


def load_published(study: str, config_dir: Path) -> dict:
    """config/published/<study>.yaml, validated (defaults filled); ConfigError names file, key and value."""
    path = Path(config_dir) / "published" / f"{study}.yaml"
    published = validate(load_yaml(path), "published", str(path))
    if published["study"] != study:
        raise ConfigError(f"{path}: key 'study': value '{published['study']}' must equal the file name '{study}'")
    # A misspelt name would match no cell and pass silently.
    for i, entry in enumerate(published["values"]):
        for kind, name in (("system", entry["system"]), ("benchmark", entry["benchmark"])):
            if name is not None and not (Path(config_dir) / f"{kind}s" / f"{name}.yaml").is_file():
                raise ConfigError(
                    f"{path}: key 'values.{i}.{kind}': value '{name}': no file config/{kind}s/{name}.yaml"
                )
    return published
