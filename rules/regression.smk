# Regression detection (docs/regression.md): the run's cells against the accepted baselines in the
# store (regression.baseline_dir, one CSV per system, kept under version control), each judged with the
# run-to-run noise of its history (the site's earlier runs in the results store, history.store).
# `snakemake regression_check` writes the table and figure, then fails when a cell regressed. The
# failing step is a separate rule without outputs, so Snakemake keeps the table and figure.
REGRESSION = CAMPAIGN.config["regression"]


# The store files of the campaign's systems that exist (a system without one has no baseline).
BASELINE_FILES = [
    path
    for path in (
        f"{REGRESSION['baseline_dir']}/{system}.csv" for system in CAMPAIGN.systems
    )
    if os.path.exists(path)
]


localrules:
    regression,
    regression_check,


rule regression:
    input:
        planned_trials=table_path("planned_trials", "parquet"),
        baselines=BASELINE_FILES,
        manifest=f"{RESULTS}/run.json",  # rules/history.smk writes it
    output:
        **table_files(["regression"]),
        figure=update(figure_path("regression")),
    log:
        f"{RESULTS}/logs/{{scope}}/regression.log",
    conda:
        "../envs/history.yaml"
    params:
        store=CAMPAIGN.config["history"]["store"],
    script:
        "../scripts/regression.py"


rule regression_check:
    input:
        table=table_path("regression", "parquet", "analysis"),
        figure=figure_path("regression", "analysis"),
    log:
        f"{RESULTS}/logs/analysis/regression_check.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/regression_gate.py"
