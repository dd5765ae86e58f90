"""The campaign history through the real workflow: weekly runs of one campaign whose trends find an
injected slowdown in the run and cell where it started (and nothing in an unchanged run), and one
campaign run as three sites (local, a real Slurm, the Kubernetes emulator) whose runs reach one
results store by bundle and by push and give one ranking of the three systems."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from servers import POSTGRES_USER, FakeKube, fakekube_missing

from conftest import REPO, SNAKEMAKE, repo_system, run_path, workflow_copy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MLCAMPAIGN = [sys.executable, "-m", "mlcampaign"]
# ResNet-50 at 32 x 32 on 160 images: a few seconds a trial, long enough steps that threads matter.
SMALL = {
    "dataset": {
        "name": "history-synthetic",
        "source": {"options": {"num_classes": 4, "train_per_class": 32, "val_per_class": 8, "image_size": 32}},
    },
    "model": {"options": {"image_size": 32, "num_classes": 4}},
    "training": {"epochs_max": 1, "global_batch_size": 16, "warmup_steps": 2},
}


def snakemake(workdir, snakefile, configfile, *args, profile="local", env=None, timeout=1200):
    """The snakemake CLI on ``snakefile`` in ``workdir``; ``profile``: a name in profiles/ or a folder."""
    profile_dir = profile if isinstance(profile, Path) else REPO / "profiles" / profile
    Path(workdir).mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            *(SNAKEMAKE, "--snakefile", str(snakefile), "--directory", str(workdir)),
            *("--profile", str(profile_dir), "--configfile", str(configfile), *args),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | (env or {}),
        cwd=workdir,  # the EIDF plugin mounts the working directory's claim where Snakemake runs
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def mlcampaign(store: str, *args: str, env=None, expect: int = 0) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [*MLCAMPAIGN, "--store", store, *args], capture_output=True, text=True, env=os.environ | (env or {})
    )
    assert result.returncode == expect, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def page_data(page) -> dict:
    html = page.read_text()
    return json.loads(html.split('<script id="page-data" type="application/json">')[1].split("</script>")[0])


def test_weekly_runs_find_an_injected_slowdown_in_its_run_and_cell_and_nothing_in_an_unchanged_run(tmp_path):
    """Three runs of one campaign, its name unchanged: w2 as w1, w3 after an "upgrade" of local-b whose
    oneDNN uses SSE4.1 kernels only (ONEDNN_MAX_CPU_ISA: about 2x slower ResNet-50 steps on AVX2 and
    AVX-512 CPUs alike, whatever else the machine runs; fewer threads is not: under load one thread can
    be as fast as two). The workflow ingests every run into its store and rebuilds the dashboard."""
    local = repo_system("local-cpu")
    snakefile = workflow_copy(tmp_path / "workflow", {"local-a": local, "local-b": local})
    configfile = tmp_path / "weekly.yaml"
    configfile.write_text(
        yaml.safe_dump(
            {
                "campaign": "weekly",
                "seed": 3,
                "trials": 4,
                "systems": ["local-a", "local-b"],
                "benchmarks": ["resnet50-synthetic"],
                "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
                "benchmark_overrides": {"resnet50-synthetic": SMALL},
                # This machine's run-to-run noise is a few per cent; a change must be larger than 20 %.
                "regression": {"metrics": ["throughput_samples_per_s"], "min_relative_change": 0.2},
            }
        )
    )
    work = tmp_path / "site"
    for run in ("w1", "w2"):
        snakemake(work, snakefile, configfile, "--config", f"run={run}")
    slowed = tmp_path / "workflow" / "config" / "systems" / "local-b.yaml"
    sse = {"environment": {"variables": {"ONEDNN_MAX_CPU_ISA": "SSE41"}}}
    slowed.write_text(yaml.safe_dump(local | {"name": "local-b"} | sse))
    snakemake(work, snakefile, configfile, "--config", "run=w3")

    store = f"sqlite:///{work}/results/history.db"
    unchanged = json.loads(mlcampaign(store, "summary", "w2").stdout)
    assert unchanged["changes"] == [] and unchanged["counts"]["regressions"] == 0
    assert unchanged["trials"] == {"planned": 8, "ok": 8, "failed": 0, "not_run": 0}
    slowdown = json.loads(mlcampaign(store, "summary", "w3", expect=1).stdout)  # exit 1: a regression
    found = {(c["system"], c["cell"], c["metric"], c["verdict"], c["previous_run_id"]) for c in slowdown["changes"]}
    assert found == {("local-b", "1x1-fp32", "throughput_samples_per_s", "regression", "w2")}
    (change,) = slowdown["changes"]
    assert change["ratio"] < 0.8 and change["p_value"] < 0.05
    # Beside it, what changed between w2 and w3: the system config's environment.
    isa = {"key": "system_config.environment.variables.ONEDNN_MAX_CPU_ISA", "before": None, "after": "SSE41"}
    assert isa in change["stack_changes"]

    # The dashboard the workflow built after w3: the change marker on local-b's trend, none on local-a's.
    dashboard = work / "results" / "weekly" / "dashboard"
    for system, expected in (("local-a", []), ("local-b", [("w3", "regression")])):
        (page,) = dashboard.glob(f"trends-{system}--resnet50-synthetic.html")
        (cell,) = page_data(page)["cells"]
        series = cell["series"]["throughput_samples_per_s"]
        assert series["run_id"] == ["w1", "w2", "w3"]
        assert [(c["run_id"], c["verdict"]) for c in series["changes"]] == expected
        assert all(low <= high for low, high in zip(series["ci_low"], series["ci_high"], strict=True))


@pytest.fixture
def postgres_url(postgres_server):
    return f"postgresql://{POSTGRES_USER}@127.0.0.1:{postgres_server.port}/{postgres_server.new_database()}"


def test_one_campaign_at_three_sites_gives_one_ranking_through_bundles_and_a_pushed_run(
    tmp_path, slurm, postgres_server, postgres_url
):
    """Local and Slurm sites export their runs as bundles that the centre imports; the EIDF site
    (fakekube) pushes its run straight into the centre's PostgreSQL store through the workflow."""
    reason = fakekube_missing()
    if reason:
        pytest.skip(reason)
    systems = {
        "local-cpu": repo_system("local-cpu"),
        "slurm-localhost": repo_system("slurm-localhost"),
        # fakekube's node runs its pods on this machine's CPU.
        "fakekube-cpu": repo_system("local-cpu", site="eidf", executor="kubernetes", launcher="python"),
    }
    snakefile = workflow_copy(tmp_path / "workflow", systems)
    campaign = {
        "campaign": "three-sites",
        "seed": 5,
        "trials": 2,
        "systems": list(systems),
        "benchmarks": ["resnet50-synthetic"],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
        "benchmark_overrides": {"resnet50-synthetic": SMALL},
        "other_sites": "skip",  # each site runs its own system
    }
    configfile = tmp_path / "three-sites.yaml"
    configfile.write_text(yaml.safe_dump(campaign))
    env = {"PGPASSWORD": postgres_server.password}

    local, slurm_site = tmp_path / "local", tmp_path / "slurm"
    snakemake(local, snakefile, configfile, "--config", "run=w48-local")
    snakemake(slurm_site, snakefile, configfile, "--config", "run=w48-slurm", profile="slurm-localhost")

    kube_work = tmp_path / "eidf"
    kube_work.mkdir()  # the claim's folder
    kube = FakeKube(tmp_path / "fakekube", {"mlcampaign-workdir": kube_work})
    try:
        profile = tmp_path / "eidf-profile"
        profile.mkdir()
        settings = yaml.safe_load((snakefile.parent / "profiles" / "eidf" / "config.yaml").read_text())
        settings |= {"eidf-image": "fakekube-host", "eidf-workdir-mount": str(kube_work), "latency-wait": 5}
        settings |= {"seconds-between-status-checks": 2, "set-resources": {"trial": {"mem_mb": 4000}}}
        del settings["eidf-volumes"]
        (profile / "config.yaml").write_text(yaml.safe_dump(settings))
        # The push: this site's runs go straight into the centre's store (its password from the environment).
        pushed = snakemake(
            kube_work,
            snakefile,
            configfile,
            "--config",
            "run=w48-eidf",
            f"history={{store: '{postgres_url}'}}",
            profile=profile,
            env=env | {"KUBECONFIG": str(kube.kubeconfig)},
        )
    finally:
        kube.stop()
    assert "w48-eidf" in (kube_work / run_path("three-sites", "w48-eidf", "ingested.json")).read_text(), pushed.stdout

    # Before the other sites report, their systems are planned and not run.
    partial = tmp_path / "partial"
    mlcampaign(postgres_url, "tables", "three-sites", "--out", str(partial), env=env)
    capability = pd.read_csv(partial / "capability.csv").set_index("system")
    assert capability.loc["fakekube-cpu", "status"] == "ok"
    assert capability.loc[["local-cpu", "slurm-localhost"], "status"].tolist() == ["not run", "not run"]

    # The bundles: exported at each site (from its own store, and from its run folder) and imported.
    bundles = [tmp_path / "local.tar.gz", tmp_path / "slurm.tar.gz"]
    mlcampaign(f"sqlite:///{local}/results/history.db", "export", "w48-local", "--out", str(bundles[0]))
    mlcampaign(
        "sqlite:///unused.db",
        "export",
        str(slurm_site / run_path("three-sites", "w48-slurm")),
        "--out",
        str(bundles[1]),
    )
    for bundle in bundles:
        mlcampaign(postgres_url, "import", str(bundle), env=env)
    listed = mlcampaign(postgres_url, "runs", "list", "--campaign", "three-sites", env=env).stdout
    assert {line.split("\t")[0] for line in listed.splitlines()} == {"w48-local", "w48-slurm", "w48-eidf"}

    merged = tmp_path / "merged"
    mlcampaign(postgres_url, "tables", "three-sites", "--out", str(merged), env=env)
    ranking = pd.read_csv(merged / "ranking.csv")
    assert set(ranking["system"]) == set(systems)
    assert ranking["ci_boot_low"].notna().all() and (ranking["ci_boot_low"] <= ranking["ci_boot_high"]).all()
    assert (ranking["n"] == 2).all()
    capability = pd.read_csv(merged / "capability.csv")
    assert sorted(zip(capability["system"], capability["cell"], capability["status"], strict=True)) == [
        (system, "1x1-fp32", "ok") for system in sorted(systems)
    ]
