"""A plain (not editable) ``pip install .`` of the package works on its own: ``mlcampaign --help`` and a trial
of the default campaign run from the installed copy, with the package's own data files (schemas, captions,
dashboard templates) and no checkout of it on any path.

The fresh environment takes the project's pinned dependencies from the test's own environment (a path
in a .pth file) instead of installing them again (torch alone is several GB): what is installed and
tested here is the package.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.integration

# The workflow as a site checks it out, without the package: its code must come from the installed copy.
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "config", "profiles", "envs")
TRIAL = "results/local-default/runs/install/trials/local-cpu/resnet50-digits/1x1-fp32/trial0-rep0/record.json"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh virtual environment with the package installed from a copy of the checkout (not editable)."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv", "results", ".snakemake", "__pycache__", "*.egg-info"),
    )
    venv = root / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "project-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", str(source)],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(source)  # nothing of the checkout is left to import from
    return venv


def test_the_installed_package_runs_from_site_packages(installed, tmp_path):
    python = installed / "bin" / "python"
    where = subprocess.run(
        [python, "-c", "import mlcampaign; print(mlcampaign.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert "site-packages" in where and str(REPO) not in where
    result = subprocess.run([installed / "bin" / "mlcampaign", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "valid-flops" in result.stdout


def test_a_trial_of_the_default_campaign_runs_from_the_installed_package(installed, tmp_path):
    workflow = tmp_path / "workflow"
    workflow.mkdir()
    for part in WORKFLOW_PARTS:
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy2)(REPO / part, workflow / part)
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment["PATH"] = f"{installed / 'bin'}{os.pathsep}{environment['PATH']}"
    snakemake = [installed / "bin" / "python", "-m", "snakemake"]
    result = subprocess.run(
        [*snakemake, TRIAL, "--profile", "profiles/local", "--config", "run=install"],
        cwd=workflow,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert json.loads((workflow / TRIAL).read_text())["status"] == "ok"
