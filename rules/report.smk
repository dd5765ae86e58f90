# Report category of each table view and figure (same name: the table a figure is drawn from).
REPORT_CATEGORIES = {
    "summary": "Campaign",
    "capability": "Campaign",
    "planned_trials": "Campaign",
    "repeatability": "Repeatability",
    "convergence": "Repeatability",
    "ranking": "Valid FLOPS ranking",
    "scaling_strong": "Scaling",
    "scaling_weak": "Scaling",
    "performance": "Scaling",
}


report: "../report/workflow.rst"


localrules:
    table_views,
    figures,
    report,
    partial_analysis,


rule table_views:
    input:
        **{name: table_path(name, "parquet") for name in TABLES},
    output:
        **{
            name: report(
                view_path(name),
                caption=f"../report/tables/{name}.rst",
                category=REPORT_CATEGORIES[name],
                subcategory="Tables",
                labels={"table": name},
            )
            for name in TABLES
        },
    log:
        f"{RESULTS}/logs/{{scope}}/table_views.log",
    conda:
        "../envs/analysis.yaml"
    params:
        # For the captions (confidence level, bootstrap resamples).
        analysis=CAMPAIGN.config["analysis"],
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
        **{
            name: report(
                figure_path(name),
                caption=f"../report/figures/{name}.rst",
                category=REPORT_CATEGORIES[name],
                subcategory="Figures",
                labels={"figure": name},
            )
            for name in FIGURE_TABLES
        },
    log:
        f"{RESULTS}/logs/{{scope}}/figures.log",
    conda:
        "../envs/analysis.yaml"
    params:
        # For the captions (confidence level, bootstrap resamples).
        analysis=CAMPAIGN.config["analysis"],
    script:
        "../scripts/figures.py"


# `snakemake --report` for the outputs of this scope (it reads their metadata).
rule report:
    input:
        rules.table_views.output,
        rules.figures.output,
    output:
        f"{RESULTS}/{{scope}}/report.html",
    log:
        f"{RESULTS}/logs/{{scope}}/report.log",
    conda:
        "../envs/report.yaml"
    params:
        # Names the checkout's Snakefile and the campaign files: moving them re-renders the report.
        snakemake=report_command(),
    shell:
        "{params.snakemake} --report {output:q} {input:q} > {log:q} 2>&1"


rule partial_analysis:
    input:
        analysis_outputs("partial"),
