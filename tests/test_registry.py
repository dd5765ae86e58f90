"""The registries (mlcampaign.registry) against what they name, and the schemas' enums against the registries."""

import inspect

import pytest

from mlcampaign import metrics, models, registry
from mlcampaign.data import generators
from mlcampaign.schemas import load_schema
from mlcampaign.tf.models import KERAS_MODELS


def keyword_options(function) -> set[str]:
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }


@pytest.mark.parametrize("name", sorted(registry.MODELS))
def test_model_options_are_its_builders_keyword_options(name):
    entry = registry.MODELS[name]
    assert set(entry.options) == keyword_options(models.get(name).build)
    if entry.keras_options is None:
        assert name not in KERAS_MODELS
    else:
        assert set(entry.keras_options) == keyword_options(KERAS_MODELS[name].build)


def test_every_keras_model_is_registered_with_its_options():
    assert {name for name, entry in registry.MODELS.items() if entry.keras_options is not None} == set(KERAS_MODELS)


def test_an_unknown_torch_option_is_named_with_what_the_builder_takes():
    with pytest.raises(ValueError, match=r"the torch model 'resnet50' has no option\(s\) \['widht'\] \(it takes: "):
        registry.check_model_options("resnet50", {"widht": 2}, "torch")
    with pytest.raises(ValueError, match="no Keras implementation of model 'deepcam'"):
        registry.check_model_options("deepcam", {}, "tensorflow")


@pytest.mark.parametrize("name", sorted(registry.DATA_FORMATS))
def test_every_format_names_a_reader(name):
    data_format = registry.DATA_FORMATS[name]
    reader = registry.resolve(data_format.reader)
    assert callable(reader)
    assert set(data_format.split_dirs) == {"train", "val"}


@pytest.mark.parametrize("name", sorted(registry.GENERATORS))
def test_every_generator_writes_registered_formats(name):
    generator = registry.GENERATORS[name]
    assert set(generator.formats) <= set(registry.DATA_FORMATS)
    writer = registry.resolve(generator.writer)
    takes_format = list(inspect.signature(writer).parameters)[1] == "data_format"
    assert takes_format == generator.takes_format
    if takes_format:  # a writer of several formats knows exactly those
        assert set(generators.COSMOFLOW_WRITERS) == set(generator.formats)


def enums(schema, found=None) -> dict:
    """x-registry name -> the enum the schema loader put beside it."""
    found = {} if found is None else found
    if isinstance(schema, dict):
        if "x-registry" in schema:
            found.setdefault(schema["x-registry"], []).append(schema["enum"])
        for value in schema.values():
            enums(value, found)
    elif isinstance(schema, list):
        for value in schema:
            enums(value, found)
    return found


def test_schema_enums_are_the_registries():
    found = {}
    for name in ("benchmark", "campaign", "record"):
        enums(load_schema(name), found)
    assert found == {
        "models": [list(registry.MODELS)],
        "data_formats": [list(registry.DATA_FORMATS)],
        "generators": [list(registry.GENERATORS)],
        "quality_metrics": [["top1", "mae", "iou", "map50"]],
        "comparable_metrics": [list(metrics.COMPARABLE_METRICS)],
        "failure_reasons": [list(registry.FAILURE_REASONS)] * 2,
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
