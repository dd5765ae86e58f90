"""The batch/v1 Job of one Snakemake job, as a Kueue-managed GPU service accepts it.

Pure functions over plain values, so that every rule of the service is visible (and testable)
in one place:

- ``metadata.generateName``, never ``metadata.name`` (the EIDF GPU service refuses fixed names);
- the label ``kueue.x-k8s.io/queue-name`` naming the namespace's LocalQueue (Jobs without it are
  refused);
- cpu and memory in requests **and** limits (the namespace quota counts both), equal, so the pod
  is in the Guaranteed QoS class and a trial's timings are not squeezed by neighbours;
- GPUs in limits (an extended resource must have a limit; the request is set equal) and the GPU
  model chosen with the node selector ``nvidia.com/gpu.product`` (GPU feature discovery's label);
- the working directory on a PersistentVolumeClaim mounted at the same path as where Snakemake
  runs, plus further claims (datasets), so inputs and outputs need no storage provider;
- ``/dev/shm`` as a memory-backed emptyDir: the container runtime's default of 64 MiB is too small
  for NCCL between the GPUs of one pod and for data-loader workers;
- the pod's deadline is the job's time limit plus ``STARTUP_GRACE_S``, and the container tells the
  job its start (``MLCAMPAIGN_JOB_START``), the end of its time limit (``MLCAMPAIGN_JOB_END``) and
  its Job's name (``MLCAMPAIGN_JOB_ID``): a trial counts its time limit from the container's start
  (in a packed Job, from its own start, within the Job's end) and stops itself before it
  (mlcampaign.job.supervisor), so Kubernetes' kill, counted from the pod's start, comes only after the
  trial has written its record;
- the image is the job's own where it names one (a trial's system's ``container.image``), else the
  profile's; ``MLCAMPAIGN_CONTAINER_IMAGE`` tells the job which ran (the record's provenance).
"""

from __future__ import annotations

import dataclasses
import re

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
CONTAINER_NAME = "main"
RUN_LABEL = "snakemake-run"
# Seconds a pod may run beyond its job's time limit: its image pull and Snakemake's start, before the
# trial's own clock starts, and the trial's end after its deadline.
STARTUP_GRACE_S = 300
# Job names are at most 63 characters (they become the pods' job-name label); the API server
# appends 5 random characters to generateName.
_MAX_PREFIX = 40


@dataclasses.dataclass(frozen=True)
class Mount:
    """A PersistentVolumeClaim mounted at ``path`` in the job container."""

    claim: str
    path: str


@dataclasses.dataclass(frozen=True)
class Site:
    """What every Job of a run shares: image, queue, storage (from the profile's settings)."""

    image: str
    queue_name: str
    run_id: str
    workdir: str  # the container's working directory: where Snakemake runs, on the workdir claim
    workdir_mount: Mount
    mounts: tuple[Mount, ...] = ()
    gpu_product: str | None = None
    shm_size_mb: int = 0


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """What one Snakemake job asks for (its command and resources)."""

    name: str  # rule or group name
    command: str
    cores: int
    mem_mb: int
    gpus: int = 0
    gpu_product: str | None = None  # overrides Site.gpu_product (Snakemake's gpu_model resource)
    runtime_min: int | None = None
    secret_env: tuple[tuple[str, str, str], ...] = ()  # (variable, secret name, key)
    image: str | None = None  # the job's own image (Snakemake's container_image resource); None: the site's


def generate_name(job_name: str) -> str:
    """``snakejob-<name>-``: a DNS-1123 prefix for ``metadata.generateName``."""
    slug = re.sub(r"[^a-z0-9-]+", "-", job_name.lower()).strip("-")
    return f"snakejob-{slug}"[:_MAX_PREFIX].rstrip("-") + "-"


def job_manifest(site: Site, request: JobRequest) -> dict:
    """The Job manifest (a dict in the API's camelCase) that runs ``request.command`` once."""
    quantities = {"cpu": str(request.cores), "memory": f"{request.mem_mb}M"}
    pod_spec: dict = {"restartPolicy": "Never"}
    if request.gpus:
        quantities[GPU_RESOURCE] = str(request.gpus)
        product = request.gpu_product or site.gpu_product
        if product:
            pod_spec["nodeSelector"] = {GPU_PRODUCT_LABEL: product}
    clock = 'MLCAMPAIGN_JOB_START="$(date +%s)"; export MLCAMPAIGN_JOB_START; '
    if request.runtime_min:
        # Counted from the pod's start, so time waiting in the Kueue queue is not charged.
        pod_spec["activeDeadlineSeconds"] = int(request.runtime_min) * 60 + STARTUP_GRACE_S
        limit_s = int(request.runtime_min) * 60
        clock += f"MLCAMPAIGN_JOB_END=$((MLCAMPAIGN_JOB_START + {limit_s})); export MLCAMPAIGN_JOB_END; "
    image = request.image or site.image

    volumes = [_claim_volume("workdir", site.workdir_mount.claim)]
    mounts = [{"name": "workdir", "mountPath": site.workdir_mount.path}]
    for index, mount in enumerate(site.mounts):
        volumes.append(_claim_volume(f"volume-{index}", mount.claim))
        mounts.append({"name": f"volume-{index}", "mountPath": mount.path})
    if site.shm_size_mb:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{site.shm_size_mb}Mi"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})

    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": [
            "/bin/sh",
            "-c",
            f"{clock}{request.command}",
        ],
        "workingDir": site.workdir,
        "resources": {"requests": dict(quantities), "limits": dict(quantities)},
        "volumeMounts": mounts,
        # The Job's name (the controller labels its pods with it): the trial record's scheduler job id.
        # and the image, which a process cannot see from inside its container (the record's software stack).
        "env": [
            {"name": "MLCAMPAIGN_JOB_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}}},
            {"name": "MLCAMPAIGN_CONTAINER_IMAGE", "value": image},
        ],
    }
    container["env"] += [
        {"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for variable, secret, key in request.secret_env
    ]
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = volumes
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "generateName": generate_name(request.name),
            "labels": {
                QUEUE_LABEL: site.queue_name,
                "app.kubernetes.io/managed-by": "snakemake",
                RUN_LABEL: site.run_id,
            },
        },
        "spec": {
            # Snakemake decides about retries (--retries), with its attempt counter.
            "backoffLimit": 0,
            "template": {"metadata": {"labels": {RUN_LABEL: site.run_id}}, "spec": pod_spec},
        },
    }


def _claim_volume(name: str, claim: str) -> dict:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}
