# A run's history (mlcampaign.plan.runs, mlcampaign.history; docs/history.md): its manifest, its records
# in the results store the campaign names (history.store), and the campaign's dashboard from every
# run the store holds.


localrules:
    run_manifest,
    ingest,
    dashboard,


# A path, not rules.run_manifest.output, in the ingest rule's input: beside its thousands of records a
# rule reference makes Snakemake hash the record list once per record (10 000 trials: 10^8 hashes).
RUN_MANIFEST = f"{RESULTS}/run.json"


rule run_manifest:
    output:
        manifest=RUN_MANIFEST,
    log:
        f"{RESULTS}/logs/run_manifest.log",
    conda:
        "../envs/analysis.yaml"
    params:
        # The whole campaign's plan (this site's trials and the others'): a change rewrites it.
        manifest=run_manifest(
            RUN, CAMPAIGN, CAMPAIGN_TRIALS, HERE, git_state(WORKFLOW_DIR)[0]
        ),
    script:
        "../scripts/run_manifest.py"


rule ingest:
    input:
        manifest=RUN_MANIFEST,
        records=all_records(),
    output:
        # What the store took; ingest again after every change (the store keeps every record).
        ingested=f"{RESULTS}/ingested.json",
        summary=f"{RESULTS}/summary.json",
    log:
        f"{RESULTS}/logs/ingest.log",
    conda:
        "../envs/history.yaml"
    params:
        store=CAMPAIGN.config["history"]["store"],
    script:
        "../scripts/ingest.py"


rule dashboard:
    input:
        ingested=rules.ingest.output.ingested,
    output:
        page=update(f"results/{CAMPAIGN.name}/dashboard/index.html"),
    log:
        f"{RESULTS}/logs/dashboard.log",
    conda:
        "../envs/history.yaml"
    params:
        store=CAMPAIGN.config["history"]["store"],
        campaign=CAMPAIGN.name,
    script:
        "../scripts/dashboard.py"
