"""Malformed configs, fuzzed with hypothesis: every campaign, system or benchmark file that the
workflow cannot run is refused with a ConfigError naming the broken file and key, never with
another exception from deep inside; configs that pass also plan (matrix, job resources, launch
commands) without an error. One fuzzed case goes through `snakemake -n` as well.

Each example takes a valid config and applies one to three random edits at random places:
replace a value (any JSON/YAML value, including NaN, huge integers, shell metacharacters and
non-string keys), delete a key or list item, or add a key.
"""

import copy
import json
import math
import os
import shutil
import tempfile
import unittest.mock
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mlcampaign.job.launch import job_resources, launch_argv, trial_runtime
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.config_files import ConfigError

from conftest import REPO, run_snakemake

CONFIG_DIR = REPO / "config"
# Bounded, repeatable and fast: a fixed example sequence per run, no example database on disk.
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# Planning is only attempted for plans of at most this many trials: trials x replicates x cells
# within the schema's limits can still be too many to enumerate in a test.
MAX_PLANNED_TRIALS = 100_000

SHELL_TEXT = st.sampled_from(["; rm -rf /", "$(touch pwned)", "`id`", "'", '"', "a b", "x\ny", "", " ", "-h"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 64)
    | st.sampled_from([2**31, 2**32, 2**63, -(2**63), 10**30])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=10)
    | SHELL_TEXT
    | st.sampled_from(["1x1", "2x16", "0x1", "fp32", "bf16", "torch", "tensorflow", "horovod", "none", "sgd"])
)
# YAML keys need not be strings (`1: x`).
KEYS = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12) | st.integers(0, 3) | st.none() | SHELL_TEXT
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=3),
    max_leaves=5,
)


def _paths(node, prefix=()):
    """Every path to a value inside ``node`` (dict keys and list indices), the root excluded."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key))


@st.composite
def malformed(draw, document: dict):
    """``document`` with one to three random edits."""
    document = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(document))))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        edit = draw(st.sampled_from(["replace", "delete", "add"]))
        if edit == "replace":
            parent[path[-1]] = draw(VALUES)
        elif edit == "delete":
            del parent[path[-1]]
        else:  # into the value at ``path`` if it is a container, else next to it
            target = parent[path[-1]] if isinstance(parent[path[-1]], dict | list) else parent
            if isinstance(target, dict):
                target[draw(KEYS)] = draw(VALUES)
            else:
                target.insert(draw(st.integers(0, len(target))), draw(VALUES))
    return document


def _read(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


DEFAULT_CAMPAIGN = _read(CONFIG_DIR / "config.yaml")
SYSTEMS = {path.stem: _read(path) for path in sorted((CONFIG_DIR / "systems").glob("*.yaml"))}
BENCHMARKS = {path.stem: _read(path) for path in sorted((CONFIG_DIR / "benchmarks").glob("*.yaml"))}


def _campaign_on(system: str) -> dict:
    """A small valid campaign of every benchmark on ``system``."""
    return {
        "campaign": "fuzz",
        "seed": 1,
        "trials": 1,
        "systems": [system],
        "benchmarks": sorted(BENCHMARKS),
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
    }


# The budget codes a Slurm site exports before planning (the systems' slurm.account_variable).
BUDGETS = {"ARCHER2_ACCOUNT": "e000", "CIRRUS_ACCOUNT": "ec000"}


@unittest.mock.patch.dict(os.environ, BUDGETS)
def plan(campaign_config: dict, config_dir: Path, source: str) -> None:
    """What planning (mlcampaign.workflow.planning, and the rules' job functions) does with a campaign before any
    job runs."""
    campaign = load_campaign(campaign_config, config_dir, source=source)
    dimensions = [len(v) for v in campaign.config["matrix"].values() if isinstance(v, list)]
    size = math.prod([campaign.config["trials"], campaign.config["replicates"], *dimensions])
    if size * len(campaign.systems) * len(campaign.benchmarks) > MAX_PLANNED_TRIALS:
        return
    for row in campaign.trials():
        system = campaign.systems[row["system"]]
        job_resources(system, row)
        launch_argv(system, row, "python")
        trial_runtime(system, 1)
        json.dumps({"trial": row, "system": system, "benchmark": campaign.benchmarks[row["benchmark"]]}, sort_keys=True)
    campaign.trial_matrix()


def check_refusal(error: ConfigError, broken_file: str) -> None:
    message = str(error)
    assert broken_file in message, message
    assert "key '" in message, message


def _plans(campaign_config: dict) -> bool:
    try:
        plan(campaign_config, CONFIG_DIR, "campaign.yaml")
    except ConfigError:
        return False
    return True


# Systems fuzzed through a campaign of every benchmark at 1x1 fp32 (some systems plan no such trial,
# e.g. one whose every cell is a declared expected outcome).
FUZZED_SYSTEMS = sorted(name for name in SYSTEMS if _plans(_campaign_on(name)))


def test_the_fuzzed_bases_are_valid():
    plan(DEFAULT_CAMPAIGN, CONFIG_DIR, "campaign.yaml")
    assert {"local-cpu", "archer2-cpu", "cirrus-v100"} <= set(FUZZED_SYSTEMS)
    for benchmark in BENCHMARKS:
        plan(_campaign_on("local-cpu") | {"benchmarks": [benchmark]}, CONFIG_DIR, "campaign.yaml")


@FUZZ
@given(malformed(DEFAULT_CAMPAIGN))
def test_fuzzed_campaign_is_planned_or_refused_clearly(config):
    try:
        plan(config, CONFIG_DIR, "fuzzed-campaign.yaml")
    except ConfigError as error:
        check_refusal(error, "fuzzed-campaign.yaml")


@st.composite
def broken_config_file(draw):
    """(kind, name, malformed content) of one system or benchmark file."""
    kind = draw(st.sampled_from(["systems", "benchmarks"]))
    files = SYSTEMS if kind == "systems" else BENCHMARKS
    name = draw(st.sampled_from(FUZZED_SYSTEMS if kind == "systems" else sorted(BENCHMARKS)))
    return kind, name, draw(malformed(files[name]))


@FUZZ
@given(broken_config_file())
def test_fuzzed_system_or_benchmark_file_is_planned_or_refused_clearly(broken):
    kind, name, content = broken
    with tempfile.TemporaryDirectory() as tmp:
        config_dir = Path(tmp)
        for sub in ("systems", "benchmarks"):
            shutil.copytree(CONFIG_DIR / sub, config_dir / sub)
        (config_dir / kind / f"{name}.yaml").write_text(yaml.safe_dump(content))
        campaign = _campaign_on(name) if kind == "systems" else _campaign_on("local-cpu") | {"benchmarks": [name]}
        try:
            plan(campaign, config_dir, "campaign.yaml")
        except ConfigError as error:
            check_refusal(error, f"{kind}/{name}.yaml")


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        # YAML reads `1:` as an integer key; mixed with string keys, sorting them used to raise TypeError.
        ({"benchmark_overrides": {1: {}, "x": {}}}, "key 'benchmark_overrides.1': value 1"),
        ({"matrix_overrides": {"cosmoflow": {"scales": ["1x1"]}, 2: {}}}, "key 'matrix_overrides.2': value 2"),
        # Trial specs are JSON with sorted keys: json.dumps raised TypeError while planning.
        (
            {"benchmark_overrides": {"cosmoflow": {"model": {"options": {None: 1, "input_size": 32}}}}},
            "key 'benchmark_overrides.cosmoflow.model.options.None': value None",
        ),
    ],
)
def test_keys_that_are_not_strings_are_refused_with_their_key(edit, named):
    with pytest.raises(ConfigError) as error:
        plan(DEFAULT_CAMPAIGN | edit, CONFIG_DIR, "campaign.yaml")
    assert f"campaign.yaml: {named}: keys must be strings" in str(error.value)


@pytest.mark.integration
@settings(FUZZ, max_examples=2)
@given(malformed(DEFAULT_CAMPAIGN))
def test_fuzzed_campaign_through_snakemake_dry_run_is_a_clear_workflow_error(config):
    with tempfile.TemporaryDirectory() as tmp:
        configfile = Path(tmp) / "campaign.yaml"
        configfile.write_text(yaml.safe_dump(config))
        try:
            plan(yaml.safe_load(configfile.read_text()), CONFIG_DIR, str(configfile))
        except ConfigError as error:
            expected = str(error)
        else:
            assume(False)  # only refused configs are worth a snakemake run
        result = run_snakemake(Path(tmp), configfile, "--dry-run")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "WorkflowError" in output
    for line in expected.splitlines():
        assert line.strip() in output
    assert "Traceback" not in output
    assert "/mlcampaign/" not in output  # no frame from inside the package
    assert "Select jobs to execute" not in output
