rule stage_dataset:
    output:
        data=directory("results/datasets/{dataset}/data"),
        manifest="results/datasets/{dataset}/manifest.json",
    log:
        "results/datasets/{dataset}/stage.log",
    conda:
        "../envs/torch.yaml"
    params:
        dataset=lambda wildcards: json.dumps(
            next(
                b["dataset"]
                for b in CAMPAIGN.benchmarks.values()
                if b["dataset"]["name"] == wildcards.dataset
            ),
            sort_keys=True,
        ),
    script:
        "../scripts/stage_dataset.py"
