"""Loading a campaign: its file, and every system and benchmark file it names, validated together.

Every config file is validated against its JSON schema in ``mlcampaign/plan/schemas/`` (mlcampaign.plan.config_files)
before any job is planned; all problems of a file are reported at once, each naming the file, the
key path and the offending value. The checks here are those a schema cannot express: across files
(a campaign's layouts against its systems, batch sizes against its scales, model options against
the model's builder) and against the registries (mlcampaign.plan.registry).
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Collection, Mapping
from pathlib import Path

from mlcampaign.measure.host_cpu import host_cpu
from mlcampaign.plan.campaign import Campaign, Scale, benchmark_matrix, compile_setting, planned_pairs
from mlcampaign.plan.config_files import ConfigError, load_yaml, validate
from mlcampaign.plan.hyperparameters import batch_sizes
from mlcampaign.plan.launchers import NO_LAUNCHER, check_layout
from mlcampaign.plan.registry import check_model_options, generators, models
from mlcampaign.plan.site_setup import check_site_setup
from mlcampaign.plan.urls import URLError, parse_store_url, shown_url


def deep_merge(base: Mapping, override: Mapping) -> dict:
    """Return ``base`` with ``override`` merged in: mappings merge recursively, other values replace."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


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
    """Each planned pair's layouts fit its system, and its precisions have a peak there (a stated one;
    a detect_host system may have none, and uses the measured roof)."""
    for system_name, benchmark in planned_pairs(campaign_config, systems):
        system = systems[system_name]
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
            # A detected host without a nominal peak divides by the trial's measured roof instead.
            if not system.get("detect_host") and precision not in system["peak_flops_per_device"]:
                raise ConfigError(
                    f"{source}: key '{_matrix_key(campaign_config, benchmark, 'precisions', system_name)}': value "
                    f"'{precision}' has no peak_flops_per_device.{precision} in "
                    f"config/systems/{system_name}.yaml"
                )


def _check_system_references(campaign_config: dict, systems: dict[str, dict], config_dir: Path, source: str) -> None:
    """Systems named by system_matrix_overrides, expected_outcomes and published.systems have a
    config file, and so do the benchmarks that the overrides name (neither need be in this run's
    list: a site runs its part of a campaign, `--config benchmarks=[...]` narrows it; the overrides
    of the others are ignored); expected outcomes name the campaign's benchmarks."""
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
    named_benchmarks = [
        ("matrix_overrides", campaign_config["matrix_overrides"]),
        ("benchmark_overrides", campaign_config["benchmark_overrides"]),
        *(
            (f"system_matrix_overrides.{name}.benchmarks", overrides.get("benchmarks", {}))
            for name, overrides in campaign_config["system_matrix_overrides"].items()
        ),
    ]
    for key, by_benchmark in named_benchmarks:
        for name in by_benchmark:
            if name not in campaign_config["benchmarks"] and not (config_dir / "benchmarks" / f"{name}.yaml").is_file():
                raise ConfigError(f"{source}: key '{key}': value '{name}': no file config/benchmarks/{name}.yaml")


def _check_parallel_plan(
    campaign_config: dict, systems: dict[str, dict], benchmarks: dict[str, dict], sources: dict[str, str], source: str
):
    """Layouts, batch sizes, model options, frameworks and backends that every planned cell can actually
    run. ``sources`` names where each benchmark's config comes from (its file, with the campaign's
    override)."""
    pairs = list(planned_pairs(campaign_config, systems))
    for name, benchmark in benchmarks.items():
        matrices = {
            system_name: benchmark_matrix(campaign_config, name, system_name)
            for system_name, benchmark_name in pairs
            if benchmark_name == name
        }
        for system_name, matrix in matrices.items():
            system = systems[system_name]
            for scale_text, backend in itertools.product(matrix["scales"], matrix["backends"]):
                scale = Scale.parse(scale_text)
                try:
                    check_layout(system, scale.nodes, scale.tasks_per_node, backend)
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
        training, where = benchmark["training"], sources[name]
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
        model = benchmark["model"]
        if "torch" in matrix["frameworks"]:
            try:
                check_model_options(model["name"], model["options"], "torch")
            except ValueError as error:
                raise ConfigError(f"{where}: key 'model.options': {error}") from None
        if "tensorflow" in matrix["frameworks"]:
            try:
                check_model_options(model["name"], model["options"], "tensorflow")
                if benchmark["training"]["optimizer"]["name"] == "lars":
                    raise ValueError("Keras has no LARS optimizer; LARS runs in torch cells only")
                _check_keras_training_settings(benchmark["training"])
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


def _check_keras_training_settings(training: dict) -> None:
    """ValueError for a training setting Keras cells cannot honour: torch.compile (training.compile). Keras
    convolutions are channels-last always, so either channels_last value is honoured (the record says
    channels-last)."""
    setting = compile_setting(training)
    if setting is not None:
        raise ValueError(
            f"key 'training.compile': value {setting} is torch.compile, which Keras cells cannot run; compile in "
            "torch cells only (frameworks: [torch]) or set training.compile.enabled: false"
        )


# The most trials one campaign plans: the plan is held in memory, and Snakemake's DAG of 100 000
# trials takes minutes to build (bench/dag_planning.py); more is a typo rather than a campaign.
MAX_PLANNED_TRIALS = 100_000


# What detect_host reads from the host instead of the system file.
HOST_KEYS = ("cores_per_node", "accelerator", "peak_flops_per_device", "peak_source")


def _check_layout_given(system: dict, path: Path) -> dict:
    """A runnable system without detect_host states its cores and nominal peak."""
    if system["launcher"] != NO_LAUNCHER:
        for key in ("cores_per_node", "peak_flops_per_device"):
            if key not in system:
                raise ConfigError(
                    f"{path}: key '{key}' is missing (state it, or set detect_host: true on a local system)"
                )
    return system


def _check_site_setup(system: dict, path: Path) -> None:
    """The system's site set-up can be submitted and launched as written (mlcampaign.plan.site_setup)."""
    problems = check_site_setup(system)
    if problems:
        lines = [f"  {path}: key '{key}': value {value!r}: {reason}" for key, value, reason in problems]
        raise ConfigError(f"invalid system configuration ({len(lines)} problem(s)):\n" + "\n".join(lines))


def _with_host(system: dict, path: Path) -> dict:
    """The system with its cores, CPU model and nominal peak read from this host (detect_host)."""
    if system["device"] != "cpu":
        raise ConfigError(
            f"{path}: key 'detect_host': value true needs device cpu (the planning host's CPU is the device), "
            f"not {system['device']}"
        )
    given = [key for key in HOST_KEYS if key in system and key != "accelerator"]
    if given:
        raise ConfigError(f"{path}: keys {given} are read from the host (detect_host: true): remove them")
    host = host_cpu()
    peaks = {precision: peak for precision, peak in host.nominal_peak_flops_per_s.items() if peak is not None}
    return system | {
        "cores_per_node": host.cores,
        "accelerator": f"{host.model} ({host.cores} usable cores)",
        "peak_flops_per_device": peaks,
        "peak_source": "; ".join(f"{precision}: {text}" for precision, text in host.peak_source.items()),
    }


def load_campaign(
    campaign_config: dict, config_dir: Path, source: str = "campaign config", cli_keys: Collection[str] = ()
) -> Campaign:
    """Validate the campaign and load + validate every system and benchmark it names.

    ``source`` names the campaign file(s) in error messages, ``cli_keys`` the top-level keys that
    Snakemake's --config set (a wrong value there is blamed on --config); ``config_dir`` holds
    ``systems/`` and ``benchmarks/``.
    """

    def source_of(path: list) -> str:
        return "--config" if path and path[0] in cli_keys else source

    campaign_config = validate(copy.deepcopy(campaign_config), "campaign", source, source_of)
    # The results store's URL holds no password and names a kind of store there is a backend for; checked here
    # rather than by a schema pattern, whose message would quote a password it does not find (mlcampaign.plan.urls).
    try:
        parse_store_url(campaign_config["history"]["store"])
    except URLError as error:
        store = shown_url(campaign_config["history"]["store"])
        raise ConfigError(f"{source_of(['history'])}: key 'history.store': value {store!r}: {error}") from None
    _check_plan_size(campaign_config, source_of)
    config_dir = Path(config_dir)

    systems = {}
    for name in campaign_config["systems"]:
        path = config_dir / "systems" / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"{source}: key 'systems': value '{name}': no file {path}")
        system = validate(load_yaml(path), "system", str(path))
        if system["name"] != name:
            raise ConfigError(f"{path}: key 'name': value '{system['name']}' must equal the file name '{name}'")
        systems[name] = _with_host(system, path) if system.get("detect_host") else _check_layout_given(system, path)
        _check_site_setup(system, path)

    overrides = campaign_config["benchmark_overrides"]
    benchmarks, sources = {}, {}
    for name in campaign_config["benchmarks"]:
        path = config_dir / "benchmarks" / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"{source}: key 'benchmarks': value '{name}': no file {path}")
        raw = load_yaml(path)
        validate(copy.deepcopy(raw), "benchmark", str(path))
        if raw["name"] != name:
            raise ConfigError(f"{path}: key 'name': value '{raw['name']}' must equal the file name '{name}'")
        if name in overrides:
            override_source = source_of(["benchmark_overrides"])
            sources[name] = f"{path} with {override_source} benchmark_overrides.{name}"
            benchmarks[name] = validate(_with_override(raw, overrides[name]), "benchmark", sources[name])
        else:
            sources[name] = str(path)
            benchmarks[name] = validate(raw, "benchmark", sources[name])
        _check_registered(benchmarks[name], sources[name])

    _check_datasets_consistent(benchmarks)
    _check_system_references(campaign_config, systems, config_dir, source)
    _check_plan(campaign_config, systems, source)
    _check_parallel_plan(campaign_config, systems, benchmarks, sources, source)
    campaign = Campaign(campaign_config, systems, benchmarks, config_dir)
    if next(campaign.planned_pairs(), None) is None:
        raise ConfigError(
            f"{source}: key 'systems': value {campaign_config['systems']}: no trial is planned (every system has "
            "launcher none or every pair an expected outcome)"
        )
    return campaign


def _with_override(benchmark: dict, override: dict) -> dict:
    """A benchmark config with a campaign's override deep-merged in. A dataset source is exactly one
    of a generator or a path: an override that names one replaces the file's source whole (a merge
    would keep the file's generator beside the override's path)."""
    dataset = override.get("dataset")
    source = dataset.get("source") if isinstance(dataset, dict) else None
    # Anything but a mapping is merged as it is, and the benchmark schema names it.
    if isinstance(source, dict) and {"generator", "path"} & set(source):
        benchmark = copy.deepcopy(benchmark)
        del benchmark["dataset"]["source"]
    return deep_merge(benchmark, override)


def _check_plan_size(campaign_config: dict, source_of) -> None:
    """Refuse a campaign of more than MAX_PLANNED_TRIALS trials before its matrix is built (an upper
    bound: every system with every benchmark, compressed cells at every scale)."""
    cells = sum(
        math.prod(
            len(matrix[dimension]) for dimension in ("scales", "precisions", "compressions", "frameworks", "backends")
        )
        for matrix in (
            benchmark_matrix(campaign_config, benchmark, system)
            for system in campaign_config["systems"]
            for benchmark in campaign_config["benchmarks"]
        )
    )
    planned = cells * campaign_config["trials"] * campaign_config["replicates"]
    if planned > MAX_PLANNED_TRIALS:
        raise ConfigError(
            f"{source_of(['trials'])}: key 'trials': value {campaign_config['trials']} (replicates "
            f"{campaign_config['replicates']}, {cells} cells): the campaign would plan up to {planned} trials, more "
            f"than the {MAX_PLANNED_TRIALS} one campaign may; lower trials or replicates, or split the campaign"
        )


def _check_registered(benchmark: dict, source: str) -> None:
    """The benchmark's target metric is one its model evaluates, and its generator writes its format."""
    model = models()[benchmark["model"]["name"]]
    metric = benchmark["target"]["metric"]
    if metric not in model.quality_metrics:
        raise ConfigError(
            f"{source}: key 'target.metric': value '{metric}': model '{benchmark['model']['name']}' evaluates "
            f"{list(model.quality_metrics)}"
        )
    dataset = benchmark["dataset"]
    generator = dataset["source"].get("generator")
    if generator is not None and dataset["format"] not in generators()[generator].formats:
        raise ConfigError(
            f"{source}: key 'dataset.source.generator': value '{generator}' writes "
            f"{list(generators()[generator].formats)}, not format '{dataset['format']}'"
        )


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
