"""A run's manifest is JSON the store accepts for every shipped campaign: pandas' string columns hold a
missing value (a pair with no expected outcome) as NaN, which the manifest writes as null."""

import json
from pathlib import Path

import pandas as pd
import pytest

from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.config_files import load_yaml
from mlcampaign.plan.runs import Run
from mlcampaign.records.run_manifest import run_manifest

from conftest import REPO

SHIPPED = [REPO / "config" / "config.yaml", *sorted((REPO / "config" / "campaigns").glob("*.yaml"))]


@pytest.mark.parametrize("configfile", SHIPPED, ids=[path.name for path in SHIPPED])
def test_a_manifest_is_strict_json_with_missing_values_as_null(configfile):
    campaign = load_campaign(load_yaml(configfile), REPO / "config", source=configfile.name)
    trials = campaign.trial_matrix()
    run = Run("r1", "local", Path("results", campaign.name, "runs", "r1"), "2026-11-30T08:00:00+00:00", True)
    manifest = run_manifest(run, campaign, trials, pd.Series(True, index=trials.index), None)
    json.dumps(manifest, allow_nan=False)  # raises on NaN
    unplanned = campaign.unplanned_cells()
    assert [row["expected_outcome"] for row in manifest["unplanned"]] == [
        None if pd.isna(value) else value for value in unplanned["expected_outcome"]
    ]
