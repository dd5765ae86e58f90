"""Integration: the partial aggregation of the real workflow, from records written in place.

A campaign some of whose jobs died without a record: `snakemake partial_analysis` must build every
table, figure and the HTML report from the records that exist, without starting any trial.
"""

import numpy as np
import pandas as pd
import pytest
import synthetic_records as synthetic
import yaml

from mlcampaign.analysis.plots import FIGURES
from mlcampaign.records.files import write_json_atomic

from conftest import run_path, run_snakemake

pytestmark = pytest.mark.integration

CAMPAIGN = {
    "campaign": "it-partial",
    "seed": 3,
    "trials": 2,
    "replicates": 2,
    "systems": ["local-cpu"],
    "benchmarks": ["resnet50-digits", "resnet50-synthetic"],
    "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
    "analysis": {"bootstrap_resamples": 200},
}


def test_partial_analysis_reads_the_records_that_exist(tmp_path):
    configfile = tmp_path / "campaign.yaml"
    configfile.write_text(yaml.safe_dump(CAMPAIGN))
    rng = np.random.default_rng(0)
    for trial in range(2):
        for replicate in range(2):
            # digits: every trial ran out of memory; synthetic: trial 1 died without a record.
            for benchmark, failure in (("resnet50-digits", "out_of_memory"), ("resnet50-synthetic", None)):
                if benchmark == "resnet50-synthetic" and trial == 1:
                    continue
                row = synthetic.plan_row("local-cpu", benchmark, "1x1", "fp32", trial, replicate)
                directory = tmp_path / run_path("it-partial", "r1", "trials", "local-cpu", benchmark, row["cell"])
                record = synthetic.record(row, rng, failure_reason=failure)
                write_json_atomic(record, directory / f"trial{trial}-rep{replicate}" / "record.json")

    result = run_snakemake(tmp_path, configfile, "--cores", "1", "partial_analysis", timeout=600, run="r1")
    assert result.returncode == 0, result.stderr[-5000:]
    assert "rule trial:" not in result.stdout + result.stderr

    scope = tmp_path / run_path("it-partial", "r1", "partial")
    capability = pd.read_csv(scope / "tables" / "capability.csv").set_index("benchmark")
    assert capability.loc["resnet50-digits", "outcome"] == "failed: out of memory x4"
    assert capability.loc["resnet50-synthetic", "outcome"] == "partial: 2/4 ok, not run x2"
    summary = pd.read_csv(scope / "tables" / "summary.csv").set_index("system")
    assert (summary.loc["all", "planned"], summary.loc["all", "executed"]) == (8, 6)
    for name in FIGURES:
        assert (scope / "figures" / f"{name}.png").stat().st_size > 0
    report = (scope / "report.html").read_text()
    for name in FIGURES:  # every figure embedded, so the page stands alone
        assert f"<figure id='figure-{name}'><img alt='{name}' src='data:image/png;base64," in report
    assert "Wilson interval" in report  # a caption
    assert "Scope <strong>partial</strong>" in report  # a caption's placeholder filled
