"""Campaign configuration: schema validation, benchmark overrides and the trial matrix.

Every config file is validated against its JSON schema in ``config/schemas/`` before any
job is planned; all problems of a file are reported at once, each naming the file, the
key path and the offending value.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd
import yaml

from mlcampaign.seeding import derive_seed

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


def validate(instance: Any, schema_name: str, source: str) -> Any:
    """Validate ``instance`` (filling defaults in place) or raise ConfigError listing every problem."""
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


def cell_id(scale: Scale, precision: str) -> str:
    """The path-safe name of one matrix cell of a (system, benchmark) pair."""
    return f"{scale}-{precision}"


@dataclasses.dataclass
class Campaign:
    config: dict
    systems: dict[str, dict]
    benchmarks: dict[str, dict]
    config_dir: Path

    @property
    def name(self) -> str:
        return self.config["campaign"]

    def trials(self) -> Iterator[dict]:
        """Every planned trial, in a stable order."""
        matrix = self.config["matrix"]
        for system_name, system in self.systems.items():
            for benchmark_name in self.benchmarks:
                for scale_text in matrix["scales"]:
                    scale = Scale.parse(scale_text)
                    for precision in matrix["precisions"]:
                        for trial, replicate in itertools.product(
                            range(self.config["trials"]), range(self.config["replicates"])
                        ):
                            yield {
                                "system": system_name,
                                "benchmark": benchmark_name,
                                "cell": cell_id(scale, precision),
                                "trial": trial,
                                "replicate": replicate,
                                "nodes": scale.nodes,
                                "tasks_per_node": scale.tasks_per_node,
                                "processes": scale.processes,
                                "precision": precision,
                                "seed": derive_seed(self.config["seed"], benchmark_name, trial),
                                "executor": system["executor"],
                            }

    def trial_matrix(self) -> pd.DataFrame:
        """One row per planned trial, indexed by TRIAL_KEYS."""
        return pd.DataFrame(list(self.trials())).set_index(TRIAL_KEYS, drop=False)


def _check_plan(campaign_config: dict, systems: dict[str, dict], source: str) -> None:
    """Cross-file checks that a schema cannot express."""
    for system_name, system in systems.items():
        for scale_text in campaign_config["matrix"]["scales"]:
            scale = Scale.parse(scale_text)
            if scale.nodes > system["nodes_max"]:
                raise ConfigError(
                    f"{source}: key 'matrix.scales': value '{scale_text}' needs {scale.nodes} nodes "
                    f"but system '{system_name}' has nodes_max {system['nodes_max']}"
                )
        for precision in campaign_config["matrix"]["precisions"]:
            if precision not in system["peak_flops_per_device"]:
                raise ConfigError(
                    f"{source}: key 'matrix.precisions': value '{precision}' has no "
                    f"peak_flops_per_device.{precision} in config/systems/{system_name}.yaml"
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
    _check_plan(campaign_config, systems, source)
    return Campaign(campaign_config, systems, benchmarks, config_dir)


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
