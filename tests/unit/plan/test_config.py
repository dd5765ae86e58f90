"""Config validation: every bad value is reported with file, key and value; good configs expand to a matrix."""

import copy
import re

import pytest
import yaml

from mlcampaign.plan.campaign import Scale
from mlcampaign.plan.config import deep_merge, load_campaign
from mlcampaign.plan.config_files import ConfigError, load_yaml
from mlcampaign.plan.seeding import derive_seed

from conftest import REPO, run_snakemake

CONFIG_DIR = REPO / "config"


def load(config):
    return load_campaign(config, CONFIG_DIR, source="campaign.yaml")


@pytest.mark.parametrize(
    ("key_path", "value", "expected"),
    [
        (("trials",), 0, "key 'trials': value 0"),
        (("seed",), -5, "key 'seed': value -5"),
        (("campaign",), "has space", "key 'campaign': value 'has space'"),
        (("matrix", "precisions"), ["fp64"], "key 'matrix.precisions.0': value 'fp64'"),
        (("matrix", "scales"), ["2-16"], "key 'matrix.scales.0': value '2-16'"),
        (("replicates",), 0, "key 'replicates': value 0"),
    ],
)
def test_bad_campaign_value_names_file_key_and_value(default_campaign, key_path, value, expected):
    config = copy.deepcopy(default_campaign)
    node = config
    for key in key_path[:-1]:
        node = node[key]
    node[key_path[-1]] = value
    with pytest.raises(ConfigError) as error:
        load(config)
    assert "campaign.yaml: " + expected in str(error.value)


def test_unknown_top_level_key_is_rejected(default_campaign):
    with pytest.raises(ConfigError, match=r"key 'epochs': unknown key \(allowed here: analysis, "):
        load(default_campaign | {"epochs": 3})


def test_a_lower_case_boolean_from_the_command_line_is_refused_with_the_spelling_that_works(default_campaign):
    # snakemake --config rerun_failed=true passes the string 'true'; only True and False become booleans.
    with pytest.raises(ConfigError) as error:
        load(default_campaign | {"rerun_failed": "true"})
    assert "key 'rerun_failed': value 'true': 'true' is not of type 'boolean' (snakemake --config reads only True" in (
        str(error.value)
    )


def test_every_problem_is_reported_at_once(default_campaign):
    with pytest.raises(ConfigError, match=r"2 problem\(s\)"):
        load(default_campaign | {"trials": 0, "seed": "x"})


def test_missing_system_file_is_named(default_campaign):
    with pytest.raises(ConfigError, match=r"key 'systems': value 'no-such-system': no file .*no-such-system\.yaml"):
        load(default_campaign | {"systems": ["no-such-system"]})


def test_bad_benchmark_override_names_benchmark_file_and_key(default_campaign):
    overrides = {"resnet50-digits": {"training": {"global_batch_size": -1}}}
    with pytest.raises(ConfigError) as error:
        load(default_campaign | {"benchmark_overrides": overrides})
    message = str(error.value)
    assert "resnet50-digits.yaml with campaign.yaml benchmark_overrides.resnet50-digits" in message
    assert "key 'training.global_batch_size': value -1" in message


def test_override_of_benchmark_not_in_campaign_is_rejected(default_campaign):
    with pytest.raises(ConfigError, match="benchmark_overrides"):
        load(default_campaign | {"benchmark_overrides": {"not-in-campaign": {}}})


def test_invalid_system_file(tmp_path, default_campaign):
    config_dir = tmp_path / "config"
    (config_dir / "systems").mkdir(parents=True)
    (config_dir / "benchmarks").symlink_to(CONFIG_DIR / "benchmarks")
    system = yaml.safe_load((CONFIG_DIR / "systems" / "local-cpu.yaml").read_text())
    system["devices_per_node"] = 0
    (config_dir / "systems" / "local-cpu.yaml").write_text(yaml.safe_dump(system))
    with pytest.raises(ConfigError) as error:
        load_campaign(default_campaign, config_dir, source="campaign.yaml")
    assert f"{config_dir / 'systems' / 'local-cpu.yaml'}: key 'devices_per_node': value 0" in str(error.value)


def test_scale_beyond_system_nodes_is_rejected(default_campaign):
    config = copy.deepcopy(default_campaign)
    config["matrix"]["scales"] = ["4x1"]
    with pytest.raises(ConfigError, match="'4x1' needs 4 nodes but system 'local-cpu' has nodes_max 1"):
        load(config)


def test_defaults_are_filled(default_campaign):
    campaign = load(default_campaign)
    training = campaign.benchmarks["resnet50-digits"]["training"]
    assert training["optimizer"]["nesterov"] is False
    assert campaign.config["replicates"] == 1


def test_override_is_deep_merged(default_campaign):
    overrides = {"resnet50-digits": {"training": {"epochs_max": 2}, "model": {"options": {"image_size": 16}}}}
    campaign = load(default_campaign | {"benchmark_overrides": overrides})
    benchmark = campaign.benchmarks["resnet50-digits"]
    assert benchmark["training"]["epochs_max"] == 2
    assert benchmark["training"]["global_batch_size"] == 32  # untouched sibling keys survive
    assert benchmark["model"]["options"]["image_size"] == 16
    assert benchmark["model"]["options"]["num_classes"] == 10


def test_trial_matrix_covers_every_cell(default_campaign):
    config = default_campaign | {"trials": 2, "replicates": 2}
    matrix = load(config).trial_matrix().reset_index(drop=True)
    n_cells = len(config["systems"]) * len(config["matrix"]["scales"]) * len(config["matrix"]["precisions"])
    assert len(matrix) == n_cells * len(config["benchmarks"]) * 2 * 2
    assert not matrix.duplicated(["system", "benchmark", "cell", "trial", "replicate"]).any()
    # Replicates of a trial share the seed; trials differ.
    for _, group in matrix.groupby(["benchmark", "trial"]):
        assert group["seed"].nunique() == 1
    assert matrix.groupby("benchmark")["seed"].nunique().eq(2).all()


def test_scale_parsing():
    scale = Scale.parse("2x16")
    assert (scale.nodes, scale.tasks_per_node, scale.processes, str(scale)) == (2, 16, 32, "2x16")


def test_deep_merge_does_not_mutate_inputs():
    base = {"a": {"b": 1, "c": 2}}
    merged = deep_merge(base, {"a": {"b": 3}})
    assert merged == {"a": {"b": 3, "c": 2}}
    assert base == {"a": {"b": 1, "c": 2}}


def test_seeds_follow_the_documented_formula(default_campaign):
    matrix = load(default_campaign).trial_matrix()
    for row in matrix.itertuples():
        assert row.seed == derive_seed(default_campaign["seed"], row.benchmark, row.trial)


def test_matrix_overrides_give_each_benchmark_its_own_layouts():
    # The EPCC CPU layouts: ResNet-50 as 2 nodes x 16 ranks, DeepCAM as 4 nodes x 8 ranks, in one campaign.
    config = {
        "campaign": "epcc-layouts",
        "seed": 1,
        "trials": 1,
        "systems": ["archer2-cpu"],
        "benchmarks": ["resnet50-digits", "deepcam"],
        "matrix": {"scales": ["2x16"], "precisions": ["fp32"]},
        "matrix_overrides": {"deepcam": {"scales": ["4x8"]}},
    }
    matrix = load(config).trial_matrix().reset_index(drop=True)
    cells = matrix.groupby("benchmark")["cell"].unique().map(list).to_dict()
    assert cells == {"resnet50-digits": ["2x16-fp32"], "deepcam": ["4x8-fp32"]}


def test_matrix_override_problems_name_their_key(default_campaign):
    with pytest.raises(
        ConfigError, match=re.escape("key 'matrix_overrides': value 'nope': no file config/benchmarks/nope.yaml")
    ):
        load(default_campaign | {"matrix_overrides": {"nope": {"scales": ["1x1"]}}})
    # A benchmark this invocation does not run (--config benchmarks=[...] narrowed it): its overrides wait.
    narrowed = load(
        default_campaign | {"benchmarks": ["cosmoflow"], "matrix_overrides": {"deepcam": {"scales": ["3x1"]}}}
    )
    assert set(narrowed.trial_matrix()["benchmark"]) == {"cosmoflow"}
    with pytest.raises(
        ConfigError, match=re.escape("key 'matrix_overrides.deepcam.scales': value '3x1' needs 3 nodes")
    ):
        load(default_campaign | {"matrix_overrides": {"deepcam": {"scales": ["3x1"]}}})
    with pytest.raises(ConfigError, match=re.escape("key 'matrix_overrides.deepcam.precisions.0': value 'fp64'")):
        load(default_campaign | {"matrix_overrides": {"deepcam": {"precisions": ["fp64"]}}})


# -- what the issue "Site operations you can trust" found refused badly or not at all ---------------
@pytest.mark.parametrize(("key", "value"), [("trials", 1.0), ("replicates", 2.0), ("seed", 7.0)])
def test_integers_must_be_written_as_integers(default_campaign, key, value):
    with pytest.raises(
        ConfigError, match=rf"campaign.yaml: key '{key}': value {value}: {value} is not of type 'integer'"
    ):
        load(default_campaign | {key: value})


def test_a_null_dataset_override_is_refused_naming_the_key(default_campaign):
    # Found by tests/unit/plan/test_config_fuzz.py: it crashed with an AttributeError before.
    with pytest.raises(ConfigError, match=r"benchmark_overrides.cosmoflow: key 'dataset': value None"):
        load(default_campaign | {"benchmark_overrides": {"cosmoflow": {"dataset": None}}})


def test_a_plan_beyond_the_bound_is_refused_before_the_matrix_is_built(default_campaign):
    with pytest.raises(ConfigError) as error:
        load(default_campaign | {"trials": 100_000, "replicates": 1000})
    # The default campaign without its matrix_overrides: one cell per benchmark.
    cells = len(default_campaign["benchmarks"])
    assert (
        f"key 'trials': value 100000 (replicates 1000, {cells} cells): the campaign would plan up to {cells * 10**8}"
    ) in str(error.value)


def test_a_value_given_with_config_is_blamed_on_config(default_campaign):
    with pytest.raises(ConfigError, match=r"  --config: key 'trials': value 0"):
        load_campaign(default_campaign | {"trials": 0}, CONFIG_DIR, source="campaign.yaml", cli_keys={"trials"})


def test_a_missing_key_is_named_without_dumping_the_config(default_campaign):
    config = copy.deepcopy(default_campaign)
    del config["seed"]
    with pytest.raises(ConfigError) as error:
        load(config)
    assert str(error.value) == (
        "invalid campaign configuration (1 problem(s)):\n  campaign.yaml: key 'seed': missing (required)"
    )


def test_a_campaign_can_switch_a_benchmark_from_its_generator_to_a_path(default_campaign, tmp_path):
    override = {"dataset": {"name": "site-digits", "source": {"path": str(tmp_path), "subset": {"train": 8}}}}
    campaign = load(default_campaign | {"benchmark_overrides": {"resnet50-digits": override}})
    source = campaign.benchmarks["resnet50-digits"]["dataset"]["source"]
    # No generator (nor its options) left beside the path; the schema's defaults filled in.
    assert source == {"path": str(tmp_path), "subset": {"train": 8, "seed": 0}, "options": {}}


def test_a_source_with_both_a_generator_and_a_path_says_so_in_words(tmp_path, default_campaign):
    benchmark = yaml.safe_load((CONFIG_DIR / "benchmarks" / "resnet50-digits.yaml").read_text())
    benchmark["dataset"]["source"]["path"] = str(tmp_path)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "resnet50-digits.yaml").write_text(yaml.safe_dump(benchmark))
    (tmp_path / "systems").symlink_to(CONFIG_DIR / "systems")
    with pytest.raises(
        ConfigError, match=re.escape("a dataset source is exactly one of a generator (with options) or a path")
    ):
        load_campaign(default_campaign | {"benchmarks": ["resnet50-digits"], "benchmark_overrides": {}}, tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "campaign: a\nseed: 1\ncampaign: b\n",
            "x.yaml:3:1: not valid YAML: key 'campaign' appears twice in one mapping (first on line 1)",
        ),
        ("matrix:\n  scales: [1x1\n  precisions: [fp32]\n", "x.yaml:3:13: not valid YAML"),
        ("", "x.yaml: the file is empty"),
        ("- a\n- b\n", "x.yaml: expected a mapping at the top level, got list"),
    ],
)
def test_yaml_files_are_read_strictly_naming_file_and_line(tmp_path, text, expected):
    (tmp_path / "x.yaml").write_text(text)
    with pytest.raises(ConfigError) as error:
        load_yaml(tmp_path / "x.yaml")
    assert str(error.value).startswith(f"{tmp_path}/") and expected in str(error.value)


@pytest.mark.integration
def test_a_results_store_of_no_known_kind_is_refused_when_planning(tmp_path):
    """The schema checks the URL's form; which kinds exist is the store's (one backend module each)."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["history"] = {"store": "mysql://me@db.example.org/history"}
    configfile = tmp_path / "campaign.yaml"
    configfile.write_text(yaml.safe_dump(config))
    result = run_snakemake(tmp_path, configfile, "-n")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "key 'history.store'" in output and "is not of a supported kind" in output
    assert "sqlite:///path/to/store.db" in output  # the kinds there are, from their backends
