import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def snakemake_argv(workdir: Path, configfile: Path, *args: str, profile: str = "local") -> list[str]:
    """The snakemake command line on the project's Snakefile with a profile of profiles/, in ``workdir``.

    ``--configfile`` takes several files: put an option before any target in ``args``."""
    return [
        SNAKEMAKE,
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--profile",
        str(REPO / "profiles" / profile),
        "--configfile",
        str(configfile),
        *args,
    ]


def run_snakemake(
    workdir: Path,
    configfile: Path,
    *args: str,
    profile: str = "local",
    timeout: int = 900,
    env: dict | None = None,
    preexec_fn=None,
) -> subprocess.CompletedProcess:
    """Run the real snakemake CLI (``snakemake_argv``); ``preexec_fn`` runs in the child before it starts."""
    return subprocess.run(
        [
            *(["timeout", "-s", "INT", str(timeout)] if profile != "local" else []),
            *snakemake_argv(workdir, configfile, *args, profile=profile),
        ],
        capture_output=True,
        text=True,
        # The Slurm plugin ignores SIGTERM: scheduler runs are bounded by `timeout -s INT` above.
        timeout=timeout + 60,
        env=None if env is None else os.environ | env,
        preexec_fn=preexec_fn,
    )


def job_counts(output: str) -> dict[str, int]:
    """Jobs per rule in the first "Job stats" table of Snakemake's output (without the total)."""
    table = output.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.MULTILINE)}


def trial_resources(output: str) -> list[dict]:
    """The `resources:` line of every planned trial job in a dry run, parsed into a dict."""
    resources = []
    for block in output.split("rule trial:")[1:]:
        line = re.search(r"^\s*resources: (.*)$", block, re.MULTILINE).group(1)
        resources.append(dict(item.split("=", 1) for item in line.split(", ")))
    return resources


@pytest.fixture
def write_config(tmp_path):
    """Write a campaign config (a dict) to a YAML file in the test's temp directory."""

    def write(config: dict, name: str = "campaign.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(config))
        return path

    return write


@pytest.fixture
def default_campaign() -> dict:
    with open(REPO / "config" / "config.yaml") as handle:
        return yaml.safe_load(handle)
