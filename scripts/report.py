"""Rule entry point: the scope's HTML report from its table views and figures (mlcampaign.analysis.report)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlcampaign.analysis.outputs import FIGURE_TABLES, TABLES
from mlcampaign.analysis.report import build_report
from mlcampaign.job.rule_log import rule_log

snakemake = globals()["snakemake"]
with rule_log(snakemake.log[0]):
    config = snakemake.params.config
    page = build_report(
        f"Benchmark campaign {config['campaign']}",
        {name: snakemake.input[name] for name in TABLES},
        {name: snakemake.input[f"figure_{name}"] for name in FIGURE_TABLES},
        config,
        snakemake.params.analysis,
        snakemake.wildcards.scope,
    )
    Path(snakemake.output[0]).write_text(page)
    print(f"report: {len(TABLES)} tables and {len(FIGURE_TABLES)} figures, {len(page) / 1e6:.1f} MB")
