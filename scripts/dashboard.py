"""Rule entry point: the campaign's static dashboard from every run in the results store."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.history.dashboard import build_from_store
from mlcampaign.job.rule_log import rule_log

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    pages = build_from_store(snakemake.params.store, snakemake.params.campaign, Path(snakemake.output.page).parent)
    print(f"{len(pages)} pages: {pages[0]}")
