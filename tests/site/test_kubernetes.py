"""The EIDF GPU service profile (Kubernetes + Kueue) and its executor plugin.

Unit tests check the Job manifests against the service's rules and the official Kubernetes
OpenAPI schemas (kubernetes-validate). Integration tests run ``snakemake --profile`` against
fakekube (../shared/tools/fakekube): a Kubernetes API emulator with the EIDF admission policies
(queue label, generateName, quota) and fake A100 nodes, whose pods run as local processes.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import kubernetes
import pandas as pd
import pytest
import snakemake_executor_plugin_eidf as eidf_executor
import yaml
from servers import GPU_PRODUCT, NAMESPACE, FakeKube, fakekube_missing
from snakemake_executor_plugin_eidf.manifest import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    QUEUE_LABEL,
    STARTUP_GRACE_S,
    JobRequest,
    Mount,
    Site,
    generate_name,
    job_manifest,
)
from snakemake_executor_plugin_eidf.outcome import job_outcome
from snakemake_interface_common.exceptions import WorkflowError

from mlcampaign.benchmarks.resnet50.generator import synthetic_images
from mlcampaign.records.files import read_record

from conftest import REPO, SNAKEMAKE, run_path, trial_resources

K8S_VERSION = "1.32"  # the API version fakekube serves and validates against
PROFILE = yaml.safe_load((REPO / "profiles" / "eidf" / "config.yaml").read_text())


def validate_manifest(manifest: dict) -> None:
    """Raise if ``manifest`` breaks the official OpenAPI schema (unknown fields included)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate")
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def eidf_site(**changes) -> Site:
    """A Site as profiles/eidf sets it up, for a checkout in /workspace/mlcampaign."""
    volume_claim, volume_path = PROFILE["eidf-volumes"][0].split(":")
    site = Site(
        image="registry.example.org/mlcampaign:1",
        queue_name=f"{NAMESPACE}-user-queue",
        run_id="0f6c0a4e-5d8e-4c47-9d7e-3d1f0b0c2a11",
        workdir=f"{PROFILE['eidf-workdir-mount']}/mlcampaign",
        workdir_mount=Mount(PROFILE["eidf-workdir-claim"], PROFILE["eidf-workdir-mount"]),
        mounts=(Mount(volume_claim, volume_path),),
        gpu_product=PROFILE["eidf-gpu-product"],
        shm_size_mb=PROFILE["eidf-shm-size-mb"],
    )
    return dataclasses.replace(site, **changes)


# -- manifests --------------------------------------------------------------------------------
def test_four_gpu_trial_manifest_follows_the_service_rules():
    command = "python -m snakemake ..."
    request = JobRequest(name="trial", command=command, cores=32, mem_mb=64000, gpus=4, runtime_min=90)
    manifest = job_manifest(eidf_site(), request)
    validate_manifest(manifest)

    assert "name" not in manifest["metadata"] and manifest["metadata"]["generateName"] == "snakejob-trial-"
    assert manifest["metadata"]["labels"][QUEUE_LABEL] == f"{NAMESPACE}-user-queue"
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    resources = container["resources"]
    assert resources["limits"] == {"cpu": "32", "memory": "64000M", GPU_RESOURCE: "4"}
    assert resources["requests"] == resources["limits"]
    assert pod["nodeSelector"] == {GPU_PRODUCT_LABEL: GPU_PRODUCT}
    # The pod's deadline leaves the trial, which counts from the container's start, time to stop itself.
    assert pod["activeDeadlineSeconds"] == 90 * 60 + STARTUP_GRACE_S
    assert pod["restartPolicy"] == "Never" and manifest["spec"]["backoffLimit"] == 0
    assert container["image"] == "registry.example.org/mlcampaign:1"
    assert container["command"] == [
        "/bin/sh",
        "-c",
        'MLCAMPAIGN_JOB_START="$(date +%s)"; export MLCAMPAIGN_JOB_START; '
        f"MLCAMPAIGN_JOB_END=$((MLCAMPAIGN_JOB_START + {90 * 60})); export MLCAMPAIGN_JOB_END; {command}",
    ]
    job_id = {"name": "MLCAMPAIGN_JOB_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}}}
    image = {"name": "MLCAMPAIGN_CONTAINER_IMAGE", "value": "registry.example.org/mlcampaign:1"}
    assert container["env"] == [job_id, image]  # the record's software stack names the pod's image
    assert container["workingDir"] == "/workspace/mlcampaign"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
    assert claims[mounts["/workspace"]] == "mlcampaign-workdir"
    assert claims[mounts["/datasets"]] == "mlcampaign-datasets"
    (shm,) = [v for v in pod["volumes"] if v["name"] == mounts["/dev/shm"]]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8192Mi"}


def test_job_without_gpus_has_no_gpu_selector_and_the_job_gpu_model_wins():
    plain = job_manifest(eidf_site(), JobRequest(name="stage_dataset", command="true", cores=1, mem_mb=8000))
    validate_manifest(plain)
    pod = plain["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and GPU_RESOURCE not in pod["containers"][0]["resources"]["limits"]
    assert plain["metadata"]["generateName"] == "snakejob-stage-dataset-"

    other = JobRequest(name="trial", command="true", cores=8, mem_mb=8000, gpus=1, gpu_product="NVIDIA-H100-80GB-HBM3")
    pod = job_manifest(eidf_site(), other)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}


def test_secret_environment_reaches_the_container():
    request = JobRequest(name="a", command="true", cores=1, mem_mb=10, secret_env=(("TOKEN", "run-secret", "token"),))
    manifest = job_manifest(eidf_site(), request)
    validate_manifest(manifest)
    *_, env = manifest["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "run-secret", "key": "token"}}}


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("", "--eidf-queue-name '' is empty; name the namespace's Kueue LocalQueue"),
        ("  ", "--eidf-queue-name '  ' is empty"),
        ("{project}-user-queue", "--eidf-queue-name '{project}-user-queue': cannot fill it in (KeyError: 'project')"),
    ],
)
def test_a_queue_name_that_cannot_be_right_is_refused_before_submission(template, message):
    with pytest.raises(WorkflowError) as refused:
        eidf_executor._queue_name(template, NAMESPACE)
    assert message in str(refused.value)
    assert eidf_executor._queue_name("{namespace}-user-queue", NAMESPACE) == f"{NAMESPACE}-user-queue"


@pytest.mark.parametrize(
    ("job_name", "prefix"),
    [("trials_table", "snakejob-trials-table-"), ("x" * 80, "snakejob-" + "x" * 31 + "-"), ("A.B", "snakejob-a-b-")],
)
def test_generate_name_is_a_dns_label_prefix(job_name, prefix):
    assert generate_name(job_name) == prefix


# -- outcomes ---------------------------------------------------------------------------------
def pod_with(state: dict, phase: str = "Failed", **status) -> dict:
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": phase, "containerStatuses": [{"name": "main", "state": state}], **status},
    }


def test_outcome_names_the_kubernetes_reason():
    job = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}
    oom = job_outcome(job, [pod_with({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})])
    assert not oom.succeeded and oom.reason == "OOMKilled" and "exit code 137" in oom.message
    error = job_outcome(job, [pod_with({"terminated": {"exitCode": 3, "reason": "Error"}})])
    assert str(error) == "Error: exit code 3"
    deadline = pod_with(
        {"terminated": {"exitCode": 143, "reason": "Error"}},
        reason="DeadlineExceeded",
        message="Pod was active on the node longer than the specified deadline",
    )
    assert job_outcome(job, [deadline]).reason == "DeadlineExceeded"
    # A Job whose pod is gone still has its condition.
    assert job_outcome(job, []).reason == "BackoffLimitExceeded"


def test_outcome_waits_for_queued_and_running_jobs():
    suspended = {"spec": {"suspend": True}, "status": {"conditions": [{"type": "Suspended", "status": "True"}]}}
    assert job_outcome(suspended, []) is None
    assert job_outcome({"status": {}}, [pod_with({"running": {}}, phase="Running")]) is None
    done = job_outcome({"status": {}}, [pod_with({"terminated": {"exitCode": 0}}, phase="Succeeded")])
    assert done.succeeded


# -- the profile, planned ----------------------------------------------------------------------
@pytest.mark.integration
def test_eidf_profile_plans_a_four_gpu_trial_in_one_pod(tmp_path, write_config):
    configfile = write_config(
        {
            "campaign": "eidf-plan",
            "seed": 1,
            "trials": 1,
            "systems": ["eidf-a100"],
            "benchmarks": ["resnet50-synthetic"],
            "matrix": {"scales": ["1x4"], "precisions": ["bf16"]},
        }
    )
    result = subprocess.run(
        [
            *(SNAKEMAKE, "--dry-run", "--snakefile", str(REPO / "Snakefile")),
            *("--directory", str(tmp_path)),
            *("--profile", str(REPO / "profiles" / "eidf"), "--configfile", str(configfile)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (resources,) = trial_resources(result.stdout)
    assert resources["gpu"] == "4" and resources["mem_mb"] == "64000"
    assert resources["tasks"] == "4" and resources["cpus_per_task"] == "8"  # 32 cores of the pod


# -- against fakekube ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = fakekube_missing()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("fakekube")
    claims = {
        "mlcampaign-workdir": base / "campaign",
        "mlcampaign-datasets": base / "datasets",
        "tiny-workdir": base / "tiny",
    }
    for directory in claims.values():
        directory.mkdir()
    kube = FakeKube(base, claims)
    yield kube
    kube.stop()


def write_profile(directory: Path, **settings) -> Path:
    """profiles/eidf with the settings a test changes (paths, image; None drops one), in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    profile = {key: value for key, value in {**PROFILE, **settings}.items() if value is not None}
    (directory / "config.yaml").write_text(yaml.safe_dump(profile))
    return directory


def run_snakemake(workdir: Path, kube: FakeKube, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    # The plugin mounts the workdir claim where Snakemake runs: Snakemake's cwd is the workdir.
    return subprocess.run(
        [SNAKEMAKE, *args],
        cwd=workdir,
        env=dict(os.environ, KUBECONFIG=str(kube.kubeconfig)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


TINY_SNAKEFILE = """
rule all:
    input: "ok.txt", "fail.txt"

rule ok:
    output: "ok.txt"
    shell: "sleep 3; echo done > {output}"

rule fail:
    output: "fail.txt"
    shell: "echo about to fail; exit 3"
"""


def tiny_profile(kube: FakeKube, name: str, **settings) -> Path:
    workdir = kube.claims["tiny-workdir"]
    return write_profile(
        workdir.parent / name,
        **{
            "eidf-image": "fakekube-host",  # the host runtime ignores images
            "eidf-workdir-claim": "tiny-workdir",
            "eidf-workdir-mount": str(workdir),
            "eidf-volumes": None,
            "latency-wait": 5,
            "seconds-between-status-checks": 1,
            "retries": 0,
            **settings,
        },
    )


@pytest.mark.integration
def test_job_without_queue_label_is_refused(cluster):
    manifest = job_manifest(
        eidf_site(workdir="/w", workdir_mount=Mount("tiny-workdir", "/w"), mounts=()),
        JobRequest(name="probe", command="true", cores=1, mem_mb=100),
    )
    unlabelled = json.loads(json.dumps(manifest))
    del unlabelled["metadata"]["labels"][QUEUE_LABEL]
    with pytest.raises(kubernetes.client.ApiException) as refused:
        cluster.batch.create_namespaced_job(NAMESPACE, unlabelled)
    assert refused.value.status in (400, 403, 422)
    assert QUEUE_LABEL in json.loads(refused.value.body)["message"]
    created = cluster.batch.create_namespaced_job(NAMESPACE, manifest)
    assert created.metadata.name.startswith("snakejob-probe-")
    cluster.batch.delete_namespaced_job(created.metadata.name, NAMESPACE, propagation_policy="Background")


@pytest.mark.integration
def test_refused_job_stops_the_run_with_the_servers_reason(cluster):
    workdir = cluster.claims["tiny-workdir"]
    (workdir / "Snakefile").write_text(TINY_SNAKEFILE)
    profile = tiny_profile(cluster, "profile-wrong-queue", **{"eidf-queue-name": "someone-elses-queue"})
    result = run_snakemake(workdir, cluster, "--profile", str(profile), "ok")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "the API server refused the Job of ok" in output and QUEUE_LABEL in output
    assert cluster.batch.list_namespaced_job(NAMESPACE).items == []


@pytest.mark.integration
def test_run_without_an_image_stops_before_any_job(cluster):
    workdir = cluster.claims["tiny-workdir"]
    (workdir / "Snakefile").write_text(TINY_SNAKEFILE)
    result = run_snakemake(
        workdir, cluster, "--profile", str(tiny_profile(cluster, "profile-no-image", **{"eidf-image": None}))
    )
    assert result.returncode != 0
    assert "set the job image (--eidf-image or SNAKEMAKE_EIDF_IMAGE)" in result.stdout + result.stderr
    assert cluster.batch.list_namespaced_job(NAMESPACE).items == []


@pytest.mark.integration
def test_failed_job_is_reported_and_the_run_goes_on(cluster):
    """The stock plugin asks for the previous log of the failed container and aborts the run."""
    workdir = cluster.claims["tiny-workdir"]
    (workdir / "Snakefile").write_text(TINY_SNAKEFILE)
    result = run_snakemake(workdir, cluster, "--profile", str(tiny_profile(cluster, "profile-tiny")))
    output = result.stdout + result.stderr
    assert result.returncode != 0  # one job failed
    assert (workdir / "ok.txt").read_text() == "done\n"  # the other finished after the failure
    assert "Kubernetes Job snakejob-fail-" in output and "failed: Error: exit code 1" in output
    (saved,) = (workdir / ".snakemake" / "auxiliary" / "eidf-logs").glob("snakejob-fail-*.log")
    assert "about to fail" in saved.read_text() and "exit status 3" in saved.read_text()
    assert "previous terminated container" not in output
    assert cluster.batch.list_namespaced_job(NAMESPACE).items == []  # finished Jobs are deleted


def tiny_benchmark(name: str, dataset_dir: Path) -> dict:
    """resnet50-synthetic, small, reading the images staged on the datasets claim."""
    benchmark = yaml.safe_load((REPO / "config" / "benchmarks" / "resnet50-synthetic.yaml").read_text())
    benchmark.update(
        name=name,
        dataset={"name": "tiny-images", "format": "image_folder", "source": {"path": str(dataset_dir)}},
    )
    benchmark["model"]["options"]["image_size"] = 16
    benchmark["training"].update(epochs_max=1, global_batch_size=16, eval_batch_size=40, warmup_steps=1)
    return benchmark


def fakekube_workflow(root: Path, dataset_dir: Path) -> Path:
    """The workflow with a test system (fakekube's nodes) and benchmarks in its config/.

    The system of a campaign is read from the workflow's config/systems/, so the test system
    sits in a copy of the workflow whose code is the checkout's (linked).
    """
    root.mkdir()
    shutil.copy(REPO / "Snakefile", root / "Snakefile")
    for name in ("rules", "scripts", "mlcampaign", "envs", "profiles"):
        (root / name).symlink_to(REPO / name)
    (root / "config" / "systems").mkdir(parents=True)
    (root / "config" / "benchmarks").mkdir()
    (root / "config" / "schemas").symlink_to(REPO / "config" / "schemas")
    # Fakekube's GPU node runs pods on this machine's CPU: the local system's device and peaks,
    # with Kubernetes as executor and torchrun starting the processes of a trial in its pod.
    system = yaml.safe_load((REPO / "config" / "systems" / "local-cpu.yaml").read_text())
    system.update(
        name="fakekube-a100",
        description="fakekube's fake A100 node; trials compute on the host CPU",
        site="eidf",
        executor="kubernetes",
        launcher="torchrun",
        devices_per_node=2,
    )
    (root / "config" / "systems" / "fakekube-a100.yaml").write_text(yaml.safe_dump(system))
    for name in ("tiny-ok", "tiny-diverging"):
        (root / "config" / "benchmarks" / f"{name}.yaml").write_text(yaml.safe_dump(tiny_benchmark(name, dataset_dir)))
    return root


@pytest.fixture(scope="module")
def eidf_campaign(cluster, tmp_path_factory):
    """Two 2-process trials on the fake A100 node (one diverges), through snakemake --profile."""
    workdir, datasets = cluster.claims["mlcampaign-workdir"], cluster.claims["mlcampaign-datasets"]
    synthetic_images(datasets / "tiny-images", seed=1, train_per_class=4, val_per_class=4, image_size=16)
    workflow = fakekube_workflow(tmp_path_factory.mktemp("workflow") / "wf", datasets / "tiny-images")
    campaign = {
        "campaign": "eidf-tiny",
        "seed": 7,
        "trials": 1,
        "systems": ["fakekube-a100"],
        "benchmarks": ["tiny-ok", "tiny-diverging"],
        "matrix": {"scales": ["1x2"], "precisions": ["fp32"]},
        # Its loss is NaN at the second step (checked: ResNet-50 at lr 1e20 without warm-up).
        "benchmark_overrides": {
            "tiny-diverging": {
                "training": {"optimizer": {"lr": 1.0e20}, "schedule": {"name": "constant", "warmup_epochs": 0}}
            }
        },
    }
    configfile = workdir / "campaign.yaml"
    configfile.write_text(yaml.safe_dump(campaign))
    # A default config in the working directory that is no valid campaign: the pods must replace
    # it by the campaign, as the profile's replace-workflow-config does for the main process.
    (workdir / "config").mkdir()
    (workdir / "config" / "config.yaml").write_text("campaign: not-this-one\nunknown_key: 1\n")
    profile = write_profile(
        workdir.parent / "profile-campaign",
        **{
            "eidf-image": "fakekube-host",
            "eidf-workdir-mount": str(workdir),
            "eidf-volumes": [f"mlcampaign-datasets:{datasets}"],
            "latency-wait": 5,
            "seconds-between-status-checks": 2,
            # The test system computes on the CPU, so its trials request no GPUs of their own;
            # 2 of the fake node's GPUs go to each trial pod to show GPU limits and scheduling.
            "set-resources": {"trial": {"gpu": 2, "mem_mb": 4000}},
        },
    )
    started = time.monotonic()
    result = run_snakemake(
        workdir,
        cluster,
        # Trials and their table: what runs on the cluster (aggregation and figures are tested elsewhere).
        run_path("eidf-tiny", "k8s", "trials.csv"),
        *("--snakefile", str(workflow / "Snakefile"), "--profile", str(profile), "--config", "run=k8s"),
        *("--configfile", str(configfile)),
    )
    return {
        "result": result,
        "seconds": time.monotonic() - started,
        "results": workdir / run_path("eidf-tiny", "k8s"),
        "logs": workdir / ".snakemake" / "auxiliary" / "eidf-logs",
    }


@pytest.mark.integration
def test_campaign_completes_and_records_the_failed_trial(eidf_campaign):
    result = eidf_campaign["result"]
    assert result.returncode == 0, result.stderr[-5000:]
    table = pd.read_csv(eidf_campaign["results"] / "trials.csv").set_index("trial.benchmark")
    assert table.loc["tiny-ok", "status"] == "ok"
    assert table.loc["tiny-diverging", "status"] == "failed"
    assert table.loc["tiny-diverging", "failure.reason"] == "diverged"


@pytest.mark.integration
def test_trial_pods_hold_two_gpus_and_run_two_torchrun_processes(eidf_campaign, cluster):
    # The profile packs a cell's trials into one Job (its group, "cell"); each cell here has one trial.
    manifests = [json.loads(path.read_text()) for path in eidf_campaign["logs"].glob("snakejob-cell-*.json")]
    assert len(manifests) == 2
    for manifest in manifests:
        pod = manifest["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"][GPU_RESOURCE] == "2"
        assert pod["nodeSelector"] == {GPU_PRODUCT_LABEL: GPU_PRODUCT}
    pod_dirs = sorted((cluster.state_dir / "pods" / NAMESPACE).glob("snakejob-cell-*"))
    assert len(pod_dirs) == 2
    for pod_dir in pod_dirs:
        env = json.loads((pod_dir / "runtime-cmd.json").read_text())["env"]
        assert len(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2  # the device plugin's view
    record = read_record(next((eidf_campaign["results"] / "trials" / "fakekube-a100" / "tiny-ok").rglob("record.json")))
    assert record["status"] == "ok"
    assert record["distributed"]["world_size"] == 2 and record["distributed"]["launcher"] == "torchrun"
    if cluster.state()["podDNS"] != "off":  # pods get their own hostname only with mount namespaces
        assert {rank["host"] for rank in record["distributed"]["ranks"]} <= {p.name for p in pod_dirs}


@pytest.mark.integration
def test_every_submitted_manifest_is_valid_and_admitted(eidf_campaign, cluster):
    manifests = sorted(eidf_campaign["logs"].glob("*.json"))
    # The trials table is a local rule: no pod of its own; trials run in their cell's Job.
    assert {path.name.split("-")[1] for path in manifests} == {"stage", "cell"}
    for path in manifests:
        validate_manifest(json.loads(path.read_text()))
    state = cluster.state()
    campaign_jobs = ("snakejob-stage-dataset-", "snakejob-cell-")
    assert [denial for denial in state["denials"] if denial["name"].startswith(campaign_jobs)] == []
    assert state["warnings"] == []  # no unknown fields in any manifest of this module
    assert cluster.batch.list_namespaced_job(NAMESPACE).items == []  # deleted once finished
    print(f"EIDF campaign through fakekube: {eidf_campaign['seconds']:.0f} s")
