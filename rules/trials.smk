# One job per trial: its supervisor (mlcampaign.job.supervisor) starts the trial's processes with the
# system's launcher and ends with the trial's record, which rank 0 writes, or a failure record that
# says what ended the launch; so every planned trial that ran has a record.


rule trial:
    input:
        # The dataset id alone: content, not timestamps, decides whether a trial is stale.
        dataset_id=dataset_path(ID_FILE),
    output:
        # Kept when the trial runs again (not deleted first): the supervisor keeps it among the
        # trial's earlier records, and a failed job restores it.
        record=update(
            f"{RESULTS}/trials/{{system}}/{{benchmark}}/{{cell}}/trial{{trial}}-rep{{replicate}}/record.json"
        ),
        # update() too: the trial rewrites it whole, and a packed allocation that is killed keeps the
        # finished trials' logs with their records (snakemake-executor-plugin-slurm-sites).
        mllog=update(
            f"{RESULTS}/trials/{{system}}/{{benchmark}}/{{cell}}/trial{{trial}}-rep{{replicate}}/mllog.txt"
        ),
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
        slurm_partition=trial_resource("slurm_partition", None),
        qos=trial_resource("qos", None),
        slurm_account=trial_resource("slurm_account", None),
        constraint=trial_resource("constraint", None),
        slurm_extra=trial_resource("slurm_extra", None),
        gres=trial_resource("gres", None),
        # A Kubernetes trial's pod image (the system's container.image; the EIDF executor's own otherwise).
        container_image=trial_resource("container_image", None),
        # Packing (docs/sites.md): with the profile's `resources: [trial_slots=1]` the trials of a
        # packed allocation run one after another and its time limit is the sum of theirs.
        trial_slots=1,
        runtime=trial_job_runtime,
    params:
        spec=trial_spec,
        attempt=trial_attempt,
    script:
        "../scripts/trial.py"
