rule stage_dataset:
    output:
        data=directory(f"results/datasets/{{dataset}}/{DATA_DIR}"),
        manifest=f"results/datasets/{{dataset}}/{MANIFEST_FILE}",
        dataset_id=f"results/datasets/{{dataset}}/{ID_FILE}",
    log:
        "results/datasets/{dataset}/stage.log",
    conda:
        "../envs/torch.yaml"
    resources:
        # Sized from the work (mlcampaign.data.cost): samples x values at the generator's measured
        # rate, or a path source's bytes; each retry gets a multiple of the limit.
        runtime=staging_runtime,
        mem_mb=staging_mem_mb,
    params:
        stage=stage_params,
    script:
        "../scripts/stage_dataset.py"
