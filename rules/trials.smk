# One job per trial. The system's launcher starts the trial's processes (mlcampaign.launch);
# rank 0 writes the record. A launch that ends before rank 0 could write one (another rank
# failed and the launcher stopped the rest) leaves a failure record from the fallback command,
# so every planned trial has a record.


rule trial:
    input:
        # The dataset id alone: content, not timestamps, decides whether a trial is stale.
        dataset_id=dataset_path(ID_FILE),
    output:
        record=f"{RESULTS}/trials/{{system}}/{{benchmark}}/{{cell}}/trial{{trial}}-rep{{replicate}}/record.json",
        mllog=f"{RESULTS}/trials/{{system}}/{{benchmark}}/{{cell}}/trial{{trial}}-rep{{replicate}}/mllog.txt",
    log:
        f"{RESULTS}/logs/trials/{{system}}/{{benchmark}}/{{cell}}/trial{{trial}}-rep{{replicate}}.log",
    conda:
        trial_env
    threads: trial_threads
    resources:
        nodes=trial_resource("nodes"),
        tasks=trial_resource("tasks"),
        cpus_per_task=trial_resource("cpus_per_task"),
        mpi=trial_resource("mpi"),
        gpu=trial_resource("gpu"),
        tasks_per_gpu=trial_resource("tasks_per_gpu"),
        mem_mb=trial_resource("mem_mb"),
        runtime=lambda wildcards, attempt: trial_runtime(
            trial_system(wildcards), attempt
        ),
    params:
        spec=trial_spec,
        # The interpreter is the shell's: see MLCAMPAIGN_PYTHON in rules/common.smk.
        launch=lambda wildcards: launch_command(
            trial_system(wildcards), trial_values(wildcards), '"$MLCAMPAIGN_PYTHON"'
        ),
    shell:
        '{params.launch} "$MLCAMPAIGN_RUN_TRIAL" --spec {params.spec:q}'
        " --dataset-id {input.dataset_id:q} --record {output.record:q}"
        " --mllog {output.mllog:q} --time-limit-min {resources.runtime} > {log:q} 2>&1"
        ' || "$MLCAMPAIGN_PYTHON" "$MLCAMPAIGN_RUN_TRIAL" --launch-failed $? --spec {params.spec:q}'
        " --dataset-id {input.dataset_id:q} --record {output.record:q}"
        " --mllog {output.mllog:q} >> {log:q} 2>&1"
