"""Conda environments per step (envs/*.yaml) pin exactly the versions of requirements.txt."""

import re
import sys

import pytest
import yaml

from mlcampaign.plan.config_files import load_schema

from conftest import REPO

ENV_FILES = sorted((REPO / "envs").glob("*.yaml"))
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def requirement_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = PIN.match(line)
            assert match, f"requirements.txt: '{line}' is not pinned with =="
            pins[normalise(match.group(1))] = match.group(2)
    return pins


def env_dependencies(path) -> tuple[list[str], list[str]]:
    """(conda dependencies, pip dependencies) of an environment file."""
    conda, pip = [], []
    for entry in yaml.safe_load(path.read_text())["dependencies"]:
        if isinstance(entry, dict):
            pip += entry["pip"]
        else:
            conda.append(entry)
    return conda, pip


def test_there_are_environments():
    assert {path.stem for path in ENV_FILES} >= {"torch", "tensorflow", "analysis"}


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda path: path.name)
def test_env_pins_match_requirements(path):
    pins = requirement_pins()
    _, pip = env_dependencies(path)
    assert pip, f"{path.name} installs nothing with pip"
    for requirement in pip:
        match = PIN.match(requirement)
        assert match, f"{path.name}: '{requirement}' is not pinned with =="
        name, version = normalise(match.group(1)), match.group(2)
        assert name in pins, f"{path.name}: {name} is not in requirements.txt"
        assert version == pins[name], f"{path.name}: {name}=={version} but requirements.txt pins {pins[name]}"


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda path: path.name)
def test_env_python_is_the_projects(path):
    conda, _ = env_dependencies(path)
    python = [entry for entry in conda if entry.startswith("python")]
    assert python == [f"python={sys.version_info.major}.{sys.version_info.minor}"]


def test_every_framework_has_its_trial_environment():
    frameworks = load_schema("campaign")["properties"]["matrix"]["properties"]["frameworks"]["items"]["enum"]
    for framework in frameworks:
        assert (REPO / "envs" / f"{framework}.yaml").is_file(), f"rules/trials.smk needs envs/{framework}.yaml"
