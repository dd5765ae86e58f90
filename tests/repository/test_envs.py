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


def nodeps_pins() -> list[str]:
    """The pins of requirements-nodeps.txt (installed without their declared dependencies)."""
    lines = (line.split("#", 1)[0].strip() for line in (REPO / "requirements-nodeps.txt").read_text().splitlines())
    pins = [line for line in lines if line]
    for pin in pins:
        assert PIN.match(pin), f"requirements-nodeps.txt: '{pin}' is not pinned with =="
    return pins


def test_the_history_environment_installs_the_no_deps_requirements_as_pinned():
    """envs/history.yaml's post-deploy script installs exactly requirements-nodeps.txt, without dependencies;
    run.sh installs the same file the same way."""
    script = (REPO / "envs" / "history.post-deploy.sh").read_text()
    installs = re.findall(r"^python -m pip install --no-deps (.+)$", script, re.MULTILINE)
    assert installs and sorted(" ".join(installs).split()) == sorted(nodeps_pins())
    assert "--no-deps -r requirements-nodeps.txt" in (REPO / "run.sh").read_text()
    overlap = {normalise(PIN.match(pin).group(1)) for pin in nodeps_pins()} & requirement_pins().keys()
    assert not overlap, f"{overlap}: in both requirements.txt and requirements-nodeps.txt"


def test_every_framework_has_its_trial_environment():
    frameworks = load_schema("campaign")["properties"]["matrix"]["properties"]["frameworks"]["items"]["enum"]
    for framework in frameworks:
        assert (REPO / "envs" / f"{framework}.yaml").is_file(), f"rules/trials.smk needs envs/{framework}.yaml"
