"""Rule entry point: the campaign's static dashboard from every run in the results store."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.cli import build_dashboard
from mlcampaign.rule_script import rule_log

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    pages = build_dashboard(snakemake.params.store, snakemake.params.campaign, Path(snakemake.output.page).parent)
    print(f"{len(pages)} pages: {pages[0]}")
