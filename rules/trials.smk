rule trial:
    input:
        data=lambda wildcards: f"results/datasets/{dataset_of(wildcards)}/data",
        manifest=lambda wildcards: f"results/datasets/{dataset_of(wildcards)}/manifest.json",
    output:
        record=f"{RESULTS}/trials/{{system}}/{{benchmark}}/{{cell}}/trial{{trial}}-rep{{replicate}}/record.json",
        mllog=f"{RESULTS}/trials/{{system}}/{{benchmark}}/{{cell}}/trial{{trial}}-rep{{replicate}}/mllog.txt",
    log:
        f"{RESULTS}/logs/trials/{{system}}/{{benchmark}}/{{cell}}/trial{{trial}}-rep{{replicate}}.log",
    conda:
        "../envs/torch.yaml"
    threads: lambda wildcards: CAMPAIGN.systems[wildcards.system].get("threads_per_process", 1)
    params:
        spec=trial_spec,
        python=PYTHON,
        script=f"{workflow.basedir}/scripts/run_trial.py",
    shell:
        "{params.python:q} {params.script:q} --spec {params.spec:q} --dataset-dir {input.data:q}"
        " --manifest {input.manifest:q} --record {output.record:q} --mllog {output.mllog:q}"
        " > {log:q} 2>&1"
