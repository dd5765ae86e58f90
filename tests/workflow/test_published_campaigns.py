"""Published MLPerf HPC results never break a campaign: after an import of the whole v3.0 round, every shipped
campaign (config/config.yaml and config/campaigns/*.yaml, whatever its mix of benchmarks: the HPC AI500 one
has no MLPerf HPC benchmark) gets its ``mlcampaign tables``, its ``mlcampaign dashboard`` and a workflow dry
run with its site profile, the store URL pointing at the store that holds the round. One test per campaign;
its run is synthetic records of its real plan (tests/synthetic_records.py), ingested into a copy of the store
the session imported the round into once."""

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browser import headless_chromium, needs_chromium, wait_until_ready
from mlperf_tools import needs_round, store_copy
from synthetic_records import plan_row, record

from mlcampaign.cli import main
from mlcampaign.history.store import RecordFile, open_store
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.config_files import load_yaml
from mlcampaign.plan.runs import Run
from mlcampaign.records.run_manifest import run_manifest

from conftest import REPO, SNAKEMAKE, job_counts

pytestmark = [pytest.mark.integration, needs_round]
SHIPPED = [REPO / "config" / "config.yaml", *sorted((REPO / "config" / "campaigns").glob("*.yaml"))]
# How each shipped campaign is planned at a site: its profile, --config and environment (docs/campaigns.md).
PLANNING = {
    "config.yaml": ("local", (), {}),
    "epcc-2024-local.yaml": ("local", (), {}),
    "epcc-2024.yaml": ("archer2", ("other_sites=skip",), {"ARCHER2_ACCOUNT": "e123"}),
    "hpcai500.yaml": ("cirrus", (), {"CIRRUS_ACCOUNT": "ec42"}),
}
PLAN_ROW_KEYS = tuple(plan_row("s", "b", "1x1", "fp32", 0))
EXPONENT = re.compile(r"\d[eE][+-]?\d")  # 6.911e+15: not how a person reads a figure


def synthetic_run(configfile: Path) -> tuple[dict, list[RecordFile]]:
    """A run of the campaign of ``configfile`` at the site of its first system: its manifest (the trials of
    that site marked ``at_site``), and an ok synthetic record of each trial of that site."""
    campaign = load_campaign(load_yaml(configfile), REPO / "config", source=configfile.name)
    trials = campaign.trial_matrix().reset_index(drop=True)
    site = campaign.systems[trials["system"].iloc[0]].get("site", "local")
    run = Run(
        "published-r1", site, Path("results", campaign.name, "runs", "published-r1"), "2026-11-30T08:00:00+00:00", True
    )
    here = trials["system"].map(lambda system: campaign.systems[system].get("site", "local") == site)
    manifest = run_manifest(run, campaign, trials, here, None)
    rng = np.random.default_rng(0)
    records = []
    for row in trials.loc[here].to_dict(orient="records"):
        drawn = record({key: row[key] for key in PLAN_ROW_KEYS}, rng, batch_size=max(32, row["processes"]))
        drawn["trial"]["campaign"] = campaign.name
        drawn["run"] = {"id": run.run_id, "site": site}
        records.append(RecordFile(f"{run.directory}/{row['system']}/{row['cell']}/{row['trial']}/record.json", drawn))
    return manifest, records


@pytest.mark.parametrize("configfile", SHIPPED, ids=[path.name for path in SHIPPED])
def test_a_shipped_campaign_still_works_beside_the_whole_round(configfile, whole_round_store, tmp_path, capsys):
    assert configfile.name in PLANNING, f"{configfile}: a shipped campaign this test does not know how to plan"
    url = store_copy(whole_round_store, tmp_path)
    manifest, records = synthetic_run(configfile)
    with open_store(url) as store:
        store.ingest(manifest, records)
        published = store.published_results()
    assert len(published) == 16

    assert main(["--store", url, "tables", manifest["campaign"], "--out", str(tmp_path / "tables")]) == 0
    results = pd.read_csv(tmp_path / "tables" / "mlperf_results.csv")
    assert len(results.loc[results["origin"] == "published"]) >= 22  # every published result, once at least
    assert main(["--store", url, "dashboard", "--campaign", manifest["campaign"], "--out", str(tmp_path / "site")]) == 0
    page = (tmp_path / "site" / "index.html").read_text()
    assert not EXPONENT.search(page.split('<section id="published">')[1].split("</section>")[0])
    capsys.readouterr()

    profile, config, env = PLANNING[configfile.name]
    planned = subprocess.run(
        [
            *(SNAKEMAKE, "all", "--dry-run", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path)),
            *("--profile", str(REPO / "profiles" / profile)),
            *("--config", f"history={{store: '{url}'}}", *config),
            *("--configfile", str(configfile)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | env,
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert job_counts(planned.stdout)["trial"] > 0


@needs_chromium
def test_the_dashboard_shows_the_whole_round_in_human_units(whole_round_store, tmp_path, capsys):
    """The default campaign beside the round in the real browser: every published figure of the MLPerf table a
    person reads (2 min 6 s, 1,074 accelerator-minutes, 6.91 PFLOP/s), never an exponent (6.911e+15); the
    published DeepCAM entries ranked beside the cells, each once."""
    url = store_copy(whole_round_store, tmp_path)
    manifest, records = synthetic_run(REPO / "config" / "config.yaml")
    with open_store(url) as store:
        store.ingest(manifest, records)
    site = tmp_path / "site"
    assert main(["--store", url, "dashboard", "--campaign", manifest["campaign"], "--out", str(site)]) == 0
    capsys.readouterr()
    with headless_chromium(tmp_path / "profile") as driver:
        driver.get((site / "index.html").as_uri())
        wait_until_ready(driver)
        assert [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"] == []
        rows = driver.execute_script(
            "return [...document.querySelectorAll('#published tbody tr.published')]"
            ".map((row) => [...row.cells].map((cell) => cell.textContent.trim()))"
        )
        headers = driver.execute_script(
            "return [...document.querySelectorAll('#published thead th')].map((cell) => cell.textContent)"
        )
        table = [dict(zip(headers, row, strict=True)) for row in rows]
        assert len({(row["system"], row["scaling"], row["benchmark"]) for row in table}) >= 22
        assert not [row for row in table if any(EXPONENT.search(value) for value in row.values())]
        eos = next(row for row in table if row["system"] == "eos_n64_ngc23.09_pytorch")
        assert (eos["time to train"], eos["resource-minutes"]) == ("2 min 6 s", "1,074 accelerator-minutes")
        assert eos["Valid FLOPS, mean"].endswith("FLOP/s") and eos["Valid FLOPS, mean"][0].isdigit()
        weak = next(
            row
            for row in table
            if row["system"] == "eos_n256_ngc23.09_pytorch"
            and row["benchmark"] == "deepcam"
            and row["scaling"] == "weak"
        )
        assert (weak["models (weak)"], weak["instance scale"], weak["throughput (weak)"]) == (
            "128",
            "2048",
            "7.627 models/min",
        )
        badges = driver.execute_script(
            "return [...document.querySelectorAll('section[data-benchmark=deepcam] tr.published .badge')]"
            ".map((e) => e.textContent)"
        )
        assert len(badges) == len(set(badges)) == 4  # Clemson, Dell, Perlmutter, Eos: each once
        driver.execute_script("document.getElementById('published').scrollIntoView()")
        driver.save_screenshot(str(tmp_path / "published.png"))
