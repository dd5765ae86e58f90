rule trials_table:
    input:
        records=all_records(),
    output:
        table=f"{RESULTS}/trials.csv",
    log:
        f"{RESULTS}/logs/trials_table.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/trials_table.py"
