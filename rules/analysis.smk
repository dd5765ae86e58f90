# Aggregation scopes (results/<campaign>/<scope>/; input functions in rules/common.smk):
# - analysis: needs the record of every planned trial, so it runs once every trial job has
#   finished (a trial that fails writes a failure record, which the capability matrix shows);
# - partial: reads the records that exist when Snakemake starts, never starts a trial, and shows
#   planned trials without a record as "not run". It is for a campaign some of whose jobs died
#   without a record (node failure, scheduler kill): `snakemake partial_analysis`.
ANALYSIS_SCOPES = ("analysis", "partial")


wildcard_constraints:
    scope="|".join(ANALYSIS_SCOPES),


# Reading JSON and writing tables: never a batch job of its own (on a GPU partition, say).
localrules:
    trials_table,
    aggregate,


rule trials_table:
    input:
        records=all_records(),
    output:
        # update(): a failed re-run (an unreadable record) leaves the previous table in place.
        table=update(f"{RESULTS}/trials.csv"),
    log:
        f"{RESULTS}/logs/trials_table.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/trials_table.py"


rule aggregate:
    input:
        records=scope_records,
    output:
        **table_files(TABLES),
    log:
        f"{RESULTS}/logs/{{scope}}/aggregate.log",
    conda:
        "../envs/analysis.yaml"
    params:
        plan=TRIALS.reset_index(drop=True).to_dict(orient="list"),
        # Each planned trial's directory, in plan order: its job file names its Slurm job
        # (mlcampaign.job.slurm_accounting.killed_trials).
        trial_dirs=[trial_dir(row) for row in TRIALS.itertuples()],
        benchmarks={
            name: {"valid_flops": benchmark["valid_flops"]}
            for name, benchmark in CAMPAIGN.benchmarks.items()
        },
        analysis=CAMPAIGN.config["analysis"],
        seed=CAMPAIGN.config["seed"],
        # Pairs not planned as jobs (expected outcomes, systems without a launcher or at other sites).
        unplanned=CAMPAIGN.unplanned_cells(SITE).to_dict(orient="list"),
        existing=existing_records,
        records_state=records_state,
    script:
        "../scripts/aggregate.py"


# Campaigns of a published study (`published` in the campaign): their cells beside the study's
# numbers (config/published/<study>.yaml, loaded by planning; mlcampaign.analysis.published).
if PLAN.published is not None:

    localrules:
        published_comparison,

    rule published_comparison:
        input:
            planned_trials=table_path("planned_trials", "parquet"),
            capability=table_path("capability", "parquet"),
            scaling_strong=table_path("scaling_strong", "parquet"),
            scaling_weak=table_path("scaling_weak", "parquet"),
        output:
            **table_files(["published_comparison"]),
            figure=update(figure_path("published_comparison")),
        log:
            f"{RESULTS}/logs/{{scope}}/published_comparison.log",
        conda:
            "../envs/analysis.yaml"
        params:
            published=PLAN.published,
            # systems and benchmarks that stand in for the study's
            stand_ins=CAMPAIGN.config["published"],
            confidence=CAMPAIGN.config["analysis"]["confidence"],
        script:
            "../scripts/published_comparison.py"
