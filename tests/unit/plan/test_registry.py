"""The registries (mlcampaign.plan.registry) against what they name, and the schemas' enums against the registries."""

import inspect
from pathlib import Path

import pytest
import yaml
from mlperf_logging import compliance_checker

from mlcampaign.plan import launchers, metrics, registry
from mlcampaign.plan.config_files import load_schema
from mlcampaign.trial.keras import models as keras_models
from mlcampaign.trial.torch import models

from conftest import REPO


def keyword_options(function) -> set[str]:
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }


def test_every_benchmark_folder_declares_itself():
    folders = registry.benchmark_folders()
    # Every folder of mlcampaign/benchmarks/ with an __init__.py, found on disk.
    assert set(folders) == {path.parent.name for path in (REPO / "mlcampaign" / "benchmarks").glob("*/__init__.py")}
    assert len(folders) >= 4  # the shipped ones at least: the glob found the folder
    for name, declaration in folders.items():
        entries = [*declaration.models.values(), *declaration.data_formats.values(), *declaration.generators.values()]
        fields = ("torch", "keras", "mlperf", "closed_form_flops", "reader", "writer")
        paths = [getattr(entry, field, None) for entry in entries for field in fields]
        paths += [
            function
            for path in paths
            if isinstance(path, registry.MLPerfRules)
            for function in (path.hyperparameters, path.reproduce)
        ]
        # Every implementation a folder names lies in that folder.
        assert all(path.startswith(f"mlcampaign.benchmarks.{name}.") for path in paths if isinstance(path, str))


def test_a_name_declared_by_two_folders_is_refused(monkeypatch):
    folders = dict(registry.benchmark_folders())
    folders["copy"] = folders["resnet50"]
    monkeypatch.setattr(registry, "benchmark_folders", lambda: folders)
    with pytest.raises(ValueError, match="models 'resnet50' is declared by benchmark folders resnet50 and copy"):
        registry._declared("models")


@pytest.mark.parametrize("name", sorted(registry.models()))
def test_model_options_are_its_builders_keyword_options(name):
    entry = registry.models()[name]
    assert set(entry.options) == keyword_options(models.get(name).build)
    if entry.keras is not None:
        assert set(entry.keras_options) == keyword_options(keras_models.get(name).build)
    else:
        assert entry.keras_options == ()


def test_an_unknown_torch_option_is_named_with_what_the_builder_takes():
    with pytest.raises(ValueError, match=r"the torch model 'resnet50' has no option\(s\) \['widht'\] \(it takes: "):
        registry.check_model_options("resnet50", {"widht": 2}, "torch")
    with pytest.raises(ValueError, match="no Keras implementation of model 'deepcam'"):
        registry.check_model_options("deepcam", {}, "tensorflow")


@pytest.mark.parametrize("name", sorted(registry.data_formats()))
def test_every_format_names_a_reader(name):
    data_format = registry.data_formats()[name]
    reader = registry.resolve(data_format.reader)
    assert callable(reader)
    assert set(data_format.split_dirs) == {"train", "val"}


@pytest.mark.parametrize("name", sorted(registry.generators()))
def test_every_generator_writes_registered_formats_and_states_its_work(name):
    generator = registry.generators()[name]
    assert set(generator.formats) <= set(registry.data_formats())
    writer = registry.resolve(generator.writer)
    takes_format = list(inspect.signature(writer).parameters)[1] == "data_format"
    assert takes_format == generator.takes_format
    # The work of the generator's defaults: planning sizes its staging job from it.
    defaults = {key: p.default for key, p in inspect.signature(writer).parameters.items() if p.default is not p.empty}
    assert generator.work.samples(defaults) > 0 and generator.work.values_per_sample(defaults) > 0


@pytest.mark.parametrize("name", sorted(registry.PRECISIONS))
def test_every_precision_names_its_dtypes(name):
    import torch

    precision = registry.PRECISIONS[name]
    assert isinstance(getattr(torch, precision.torch_dtype), torch.dtype)
    assert precision.keras_policy in ("float32", "mixed_bfloat16", "mixed_float16")
    assert precision.autocast == (precision.torch_dtype != "float32")


def enums(schema, found=None) -> dict:
    """x-registry name -> the enum the schema loader put beside it."""
    found = {} if found is None else found
    if isinstance(schema, dict):
        if "x-registry" in schema:
            found.setdefault(schema["x-registry"], []).append(schema["enum"])
        if "x-registry-keys" in schema:
            found.setdefault(schema["x-registry-keys"]["registry"], []).append(list(schema["properties"]))
        for value in schema.values():
            enums(value, found)
    elif isinstance(schema, list):
        for value in schema:
            enums(value, found)
    return found


def test_schema_enums_are_the_registries():
    found = {}
    for name in ("benchmark", "campaign", "record", "system"):
        enums(load_schema(name), found)
    precisions, compressions = list(registry.PRECISIONS), list(registry.COMPRESSIONS)
    assert found == {
        "models": [list(registry.models())],
        "data_formats": [list(registry.data_formats())],
        "generators": [list(registry.generators())],
        "quality_metrics": [["mae", "iou", "map50", "top1"]],  # in benchmark folder order
        "precisions": [precisions] * 3,  # the campaign's matrix, the record's trial, the system's peaks
        "compressions": [compressions] * 2,
        "comparable_metrics": [list(metrics.COMPARABLE_METRICS)],
        "failure_reasons": [list(registry.FAILURE_REASONS)] * 2,
        "launchers": [[*launchers.LAUNCHERS, launchers.NO_LAUNCHER]],
    }


def test_record_metrics_block_is_the_metric_table():
    block = load_schema("record")["properties"]["metrics"]
    assert set(block["properties"]) == set(metrics.RECORD_METRICS)
    assert set(block["required"]) == {key for key, m in metrics.RECORD_METRICS.items() if m.required}
    assert block["additionalProperties"] is False
    assert block["properties"]["throughput_samples_per_s"]["x-unit"] == "samples/s"


def test_trial_metrics_of_the_counters_fill_the_record_block():
    counters = metrics.TrialCounters(warmup_steps=2, steps=5, measured_steps=3, measured_samples=24)
    counters.data_loading_s, counters.compute_s, counters.communication_s = 1.0, 2.0, 1.0
    counters.quality_history = [{"epoch": 1, "value": 0.5}, {"epoch": 2, "value": 0.9}]
    counters.epochs_to_target = 2
    measured = metrics.trial_metrics(counters)
    assert set(measured) == set(metrics.RECORD_METRICS)
    assert measured["throughput_samples_per_s"] == 24 / 4.0
    assert (measured["achieved_quality"], measured["reached_target"], measured["warmup_steps_excluded"]) == (
        0.9,
        True,
        2,
    )
    assert set(metrics.empty_trial_metrics()) == set(metrics.RECORD_METRICS)


@pytest.mark.parametrize("name", sorted(name for name, model in registry.models().items() if model.mlperf))
def test_mlperf_functions_take_what_their_callers_give(name):
    """The closed-division keys (mlcampaign.records.mlperf.trial_log) and a submission's schedule read back
    (mlcampaign.plan.reproduce): called by name, so their parameters are checked here."""
    rules = registry.models()[name].mlperf
    assert list(inspect.signature(registry.resolve(rules.hyperparameters)).parameters) == ["benchmark", "schedule"]
    if rules.reproduce is not None:
        parameters = list(inspect.signature(registry.resolve(rules.reproduce)).parameters)
        assert parameters == ["settings", "steps_per_epoch"]
    assert registry.mlperf_models(rules.usage, rules.name)[name] is registry.models()[name]
    assert registry.mlperf_rules({"model": {"name": name}}, rules.usage) is rules


def test_a_model_without_mlperf_rules_or_no_longer_registered_has_none():
    assert registry.mlperf_rules({"model": {"name": "extreme_weather"}}) is None
    assert registry.mlperf_rules({"model": {"name": "resnet50"}}, "hpc") is None  # MLPerf training's, not HPC's
    assert registry.mlperf_rules({"model": {"name": "a-removed-model"}}) is None
    assert registry.mlperf_models("hpc", "oc20") == {}


@pytest.mark.parametrize("name", sorted(name for name, model in registry.models().items() if model.mlperf))
def test_mlperf_targets_are_the_ones_the_rules_check(name):
    """The target of each MLPerf benchmark as its rule files check it: closed, and open for the HPC rules."""
    rules = registry.models()[name].mlperf
    folder = Path(compliance_checker.__file__).parent / f"{rules.usage}_{rules.ruleset}"
    operator = "<=" if rules.target_direction == "lower" else ">="
    divisions = ("closed", "open") if rules.usage == "hpc" else ("closed",)
    for division in divisions:
        checks = yaml.safe_load((folder / f"{division}_{rules.name}.yaml").read_text())
        (check,) = [item for item in checks if item.get("KEY", {}).get("NAME") == rules.quality_key]
        expression = check["KEY"]["ATLEAST_ONE_CHECK"]
        assert f"v['value'] {operator} {rules.target:g}" in expression.replace("0.7590", "0.759"), expression
