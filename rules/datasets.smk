rule stage_dataset:
    output:
        data=directory(f"results/datasets/{{dataset}}/{DATA_DIR}"),
        manifest=f"results/datasets/{{dataset}}/{MANIFEST_FILE}",
        dataset_id=f"results/datasets/{{dataset}}/{ID_FILE}",
    log:
        "results/datasets/{dataset}/stage.log",
    conda:
        "../envs/torch.yaml"
    params:
        stage=stage_params,
    script:
        "../scripts/stage_dataset.py"
