localrules:
    table_views,
    figures,
    report,
    partial_analysis,


rule table_views:
    input:
        **{name: table_path(name, "parquet") for name in TABLES},
    output:
        **{name: update(view_path(name)) for name in TABLES},
    log:
        f"{RESULTS}/logs/{{scope}}/table_views.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/table_views.py"


rule figures:
    input:
        **{
            name: table_path(name, "parquet")
            for name in sorted(
                {table for tables in FIGURE_TABLES.values() for table in tables}
            )
        },
    output:
        **{name: update(figure_path(name)) for name in FIGURE_TABLES},
    log:
        f"{RESULTS}/logs/{{scope}}/figures.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figures.py"


# One self-contained page of every table view and figure with its caption (mlcampaign/analysis/captions/*.rst;
# mlcampaign.analysis.report).
rule report:
    input:
        **rules.table_views.output,
        **{f"figure_{name}": figure_path(name) for name in FIGURE_TABLES},
    output:
        update(f"{RESULTS}/{{scope}}/report.html"),
    log:
        f"{RESULTS}/logs/{{scope}}/report.log",
    conda:
        "../envs/analysis.yaml"
    params:
        # For the captions (campaign name, confidence level, bootstrap resamples).
        config=CAMPAIGN.described_config,
        analysis=CAMPAIGN.config["analysis"],
    script:
        "../scripts/report.py"


rule partial_analysis:
    input:
        analysis_outputs("partial"),
