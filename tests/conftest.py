import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def snakemake_argv(
    workdir: Path, configfile: Path, *args: str, profile: str = "local", run: str | None = None
) -> list[str]:
    """The snakemake command line on the project's Snakefile with a profile of profiles/, in ``workdir``;
    ``run`` names the run (``--config run=``, so that its files have known paths: ``run_path``).

    ``--configfile`` takes several files: put an option before any target in ``args``."""
    return [
        SNAKEMAKE,
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--profile",
        str(REPO / "profiles" / profile),
        *(("--config", f"run={run}") if run else ()),
        "--configfile",
        str(configfile),
        *args,
    ]


def workflow_copy(root: Path, systems: dict[str, dict]) -> Path:
    """The workflow in ``root`` with ``systems`` (name -> system config) as its config/systems/, its
    code, schemas and benchmarks the checkout's (linked): a campaign's systems are read from the
    workflow's config/, so a test system lives in a copy. Returns the copy's Snakefile."""
    root.mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.name not in ("config", "results", ".git", ".snakemake", ".venv") and not entry.name.startswith("."):
            (root / entry.name).symlink_to(entry)
    (root / "config" / "systems").mkdir(parents=True)
    for name in ("schemas", "benchmarks"):
        (root / "config" / name).symlink_to(REPO / "config" / name)
    for name, system in systems.items():
        (root / "config" / "systems" / f"{name}.yaml").write_text(yaml.safe_dump(system | {"name": name}))
    return root / "Snakefile"


def repo_system(name: str, **changes) -> dict:
    """The checkout's config/systems/<name>.yaml with ``changes``."""
    return yaml.safe_load((REPO / "config" / "systems" / f"{name}.yaml").read_text()) | changes


def run_path(campaign: str, run: str, *parts: str) -> str:
    """A file of a run, relative to the working directory (mlcampaign.plan.runs)."""
    return "/".join(["results", campaign, "runs", run, *parts])


def latest_run(workdir: Path, campaign: str) -> Path:
    """The folder of the campaign's run last worked on in ``workdir`` (results/<campaign>/latest)."""
    return (Path(workdir) / "results" / campaign / "latest").resolve()


def run_snakemake(
    workdir: Path,
    configfile: Path,
    *args: str,
    profile: str = "local",
    timeout: int = 900,
    env: dict | None = None,
    preexec_fn=None,
    run: str | None = None,
) -> subprocess.CompletedProcess:
    """Run the real snakemake CLI (``snakemake_argv``); ``preexec_fn`` runs in the child before it starts."""
    return subprocess.run(
        [
            *(["timeout", "-s", "INT", str(timeout)] if profile != "local" else []),
            *snakemake_argv(workdir, configfile, *args, profile=profile, run=run),
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


@pytest.fixture(scope="session")
def whole_round(tmp_path_factory) -> Path:
    """The whole MLPerf HPC v3.0 round (mlperf_tools.ROUND_ARCHIVE) extracted once for the session: its
    hpc_results_v3.0/ folder, read-only (a test that changes it works on a copy)."""
    from mlperf_tools import extract_round

    return extract_round(tmp_path_factory.mktemp("whole-round"))


@pytest.fixture(scope="session")
def whole_round_import(whole_round, tmp_path_factory) -> tuple[str, subprocess.CompletedProcess]:
    """The whole v3.0 round imported once for the session by ``mlcampaign import-mlperf`` into a new SQLite
    store: (its URL, the command's exit status and output). Importing the round takes minutes on 2 cores: the
    test of the command reads its output, the others the store (``whole_round_store``)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('whole-round-store')}/history.db"
    command = [sys.executable, "-m", "mlcampaign", "--store", url, "import-mlperf", str(whole_round)]
    return url, subprocess.run(command, capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope="session")
def whole_round_store(whole_round_import) -> str:
    """The URL of a SQLite store holding the whole v3.0 round (``whole_round_import``); copy it
    (mlperf_tools.store_copy) to write into it."""
    url, imported = whole_round_import
    assert imported.returncode == 0, imported.stdout[-3000:] + imported.stderr[-3000:]
    (report,) = [json.loads(line)["report"] for line in imported.stdout.splitlines() if line.startswith('{"report"')]
    assert report["problems"] == 0, imported.stdout[-3000:]
    return url


@pytest.fixture(scope="session")
def whole_round_summarizer(whole_round, tmp_path_factory) -> dict[str, dict]:
    """mlperf-logging's result_summarizer on a clean copy of each submitter folder of the whole v3.0 round
    (mlperf_tools.round_summarizer_figures), run once for the session (about a minute and a half)."""
    from mlperf_tools import round_summarizer_figures

    return round_summarizer_figures(whole_round, tmp_path_factory.mktemp("whole-round-summarizer"))


@pytest.fixture(scope="session")
def shipped_dry_run(tmp_path_factory):
    """``snakemake --dry-run`` of a shipped campaign (config/campaigns/<campaign>.yaml) with a site profile, its
    ``--config`` items and environment: its output, each dry run run once for the session. A published campaign
    plans hundreds of jobs (half a minute on 2 cores) and its plan is only read, by the profiles' tests
    (tests/unit/analysis/test_published.py) and the packing tests (tests/site/test_packing.py) alike."""
    outputs = {}

    def dry_run(profile: str, campaign: str, *config: str, env: dict | None = None) -> str:
        key = (profile, campaign, config, tuple(sorted((env or {}).items())))
        if key not in outputs:
            result = run_snakemake(
                tmp_path_factory.mktemp("dry-run"),
                REPO / "config" / "campaigns" / f"{campaign}.yaml",
                "--dry-run",
                *(("--config", *config) if config else ()),
                profile=profile,
                timeout=600,
                env=env,
            )
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
            outputs[key] = result.stdout
        return outputs[key]

    return dry_run


def pytest_collection_finish(session):
    """Where the session will start the real Slurm anyway, start it before its first test: with Slurm's commands
    installed and no controller, every Snakemake start waits about 9 s (snakemake-executor-plugin-slurm asks
    ``scontrol show config`` as it loads), 14 starts in the whole suite's order before the first Slurm test.
    Where it cannot start, the ``slurm`` fixture says why in the tests that need it."""
    if not session.config.option.collectonly and any("slurm" in item.fixturenames for item in session.items):
        from servers import start_slurm

        with contextlib.suppress(pytest.skip.Exception, AssertionError, subprocess.TimeoutExpired):
            start_slurm()


@pytest.fixture(scope="session")
def slurm():
    """The real single-node Slurm (tests/servers.py), started once for the session."""
    from servers import start_slurm

    start_slurm()


def slurm_campaign_config(name: str, trials: int, scales: list[str]) -> dict:
    """A tiny deterministic resnet50-synthetic campaign on the real single-node Slurm's system (seconds a trial)."""
    return {
        "campaign": name,
        "seed": 5,
        "trials": trials,
        "deterministic": True,
        "systems": ["slurm-localhost"],
        "benchmarks": ["resnet50-synthetic"],
        "matrix": {"scales": scales, "precisions": ["fp32"]},
        "benchmark_overrides": {
            "resnet50-synthetic": {
                "dataset": {
                    "name": f"synthetic-{name}",
                    "source": {"options": {"train_per_class": 8, "val_per_class": 4, "image_size": 16}},
                },
                "model": {"options": {"image_size": 16}},
                "training": {"epochs_max": 2, "global_batch_size": 16, "warmup_steps": 2},
            }
        },
    }


@pytest.fixture(scope="session")
def slurm_campaign(slurm, tmp_path_factory) -> tuple[Path, str]:
    """Two trials of each of a 1-rank and a 2-rank cell (``slurm_campaign_config``) through profiles/slurm-localhost
    on the real Slurm, run once for the session (run r1): (working directory, the time it started as sacct's -S
    takes it). Read, never changed, by the Slurm test (its batch jobs, ranks and accounting) and the packing test
    (the records a packed run of the same trials must equal)."""
    workdir = tmp_path_factory.mktemp("slurm-campaign")
    (workdir / "campaign.yaml").write_text(json.dumps(slurm_campaign_config("slurm-it", 2, ["1x1", "1x2"])))
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = run_snakemake(workdir, workdir / "campaign.yaml", profile="slurm-localhost", timeout=1500, run="r1")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return workdir, started


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server in a temporary directory on a free port (tests/servers.py), for the session."""
    from servers import postgres_server as server

    with server() as running:
        yield running


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
    """config/config.yaml without its per-benchmark matrix (tests set the matrix they plan)."""
    with open(REPO / "config" / "config.yaml") as handle:
        config = yaml.safe_load(handle)
    del config["matrix_overrides"]
    return config
