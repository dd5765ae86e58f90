"""Snakemake executor for Kueue-managed Kubernetes GPU services such as the EIDF GPU service.

Snakemake stays the orchestrator; every job becomes one batch/v1 Job (``manifest.job_manifest``)
whose pod runs Snakemake for that job in the profile's image. The working directory lives on a
PersistentVolumeClaim that the pods mount at the path where Snakemake runs: a shared filesystem,
so inputs and outputs need no remote storage provider.

Built on the stock ``snakemake-executor-plugin-kubernetes`` (0.5.1), whose Secret handling, Job
deletion and cancellation it reuses. It replaces what the EIDF service cannot accept from the stock
plugin: Jobs with fixed names and without the Kueue queue label, no node selector for the GPU
model, GPUs in requests only, and a remote default storage provider. It also replaces the status
check, which asked for the ``previous`` log of a failed container; the kubelet refuses that for a
container that never restarted, and the resulting exception ended the whole run. Here a failed
Job is one failed Snakemake job (with ``--keep-going`` the rest of the workflow continues) and its
reason (exit code, ``OOMKilled``, ``DeadlineExceeded``, ...) is reported with the pod's log.

A packed group of jobs (Snakemake job groups, docs/sites.md) is one Job: its pod's CPUs, memory and
GPUs are the group's (one job at a time), the Snakemake inside runs its jobs on the pod's CPUs with
``--keep-going``, and a Job that fails keeps the outputs of the jobs that finished in it
(mlcampaign.workflow.packing, shared with the Slurm executor). A job may name its
own image (resource ``container_image``: a trial's system's image), which then wins over
``--eidf-image``.
"""

import dataclasses
import json
import uuid
from pathlib import Path

import kubernetes
import kubernetes.client
import kubernetes.config
import urllib3
from snakemake_executor_plugin_kubernetes import Executor as KubernetesExecutor
from snakemake_executor_plugin_kubernetes import (
    PersistentVolume,
    parse_persistent_volumes,
    unparse_persistent_volumes,
)
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase, SharedFSUsage

from mlcampaign.workflow.packing import failed_group_message
from snakemake_executor_plugin_eidf.manifest import (
    CONTAINER_NAME,
    QUEUE_LABEL,
    JobRequest,
    Mount,
    Site,
    job_manifest,
)
from snakemake_executor_plugin_eidf.outcome import job_outcome

# What a failed API request raises: an error status, or no answer (urllib3 retries exhausted).
API_ERRORS = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError)

# The working directory must be shared with the pods for these uses (the workdir claim).
REQUIRED_SHARED_FS = (SharedFSUsage.PERSISTENCE, SharedFSUsage.INPUT_OUTPUT, SharedFSUsage.SOURCES)


# Settings typed "str | None" name their argparse type in the metadata (the plugin interface
# unwraps only typing.Optional); this module has no postponed annotations for the same reason.
@dataclasses.dataclass
class ExecutorSettings(ExecutorSettingsBase):
    image: str | None = dataclasses.field(
        default=None,
        metadata={
            "type": str,
            "help": "Container image of the jobs: must provide `python` on PATH with Snakemake and the "
            "workflow's requirements (the working directory itself comes from the workdir claim).",
            "env_var": True,
        },
    )
    namespace: str | None = dataclasses.field(
        default=None,
        metadata={
            "type": str,
            "help": "Namespace of the Jobs (your project's namespace); default: the namespace of the "
            "kubeconfig's current context.",
            "env_var": True,
        },
    )
    queue_name: str = dataclasses.field(
        default="{namespace}-user-queue",
        metadata={"help": f"Kueue LocalQueue of the Jobs (label {QUEUE_LABEL}); {{namespace}} is replaced."},
    )
    gpu_product: str | None = dataclasses.field(
        default=None,
        metadata={
            "type": str,
            "help": "GPU model of jobs that request GPUs: node selector nvidia.com/gpu.product, e.g. "
            "NVIDIA-A100-SXM4-40GB; a job's gpu_model resource overrides it.",
        },
    )
    workdir_claim: str | None = dataclasses.field(
        default=None,
        metadata={"type": str, "help": "PersistentVolumeClaim that holds Snakemake's working directory (required)."},
    )
    workdir_mount: str | None = dataclasses.field(
        default=None,
        metadata={
            "type": str,
            "help": "Where the workdir claim is mounted, in the pods and where Snakemake runs; the working "
            "directory must lie inside it. Default: the working directory itself.",
        },
    )
    volumes: list[PersistentVolume] = dataclasses.field(
        default_factory=list,
        metadata={
            "help": "Further PersistentVolumeClaims to mount in every job, as <claim>:<path> (e.g. datasets).",
            "type": str,
            "parse_func": parse_persistent_volumes,
            "unparse_func": unparse_persistent_volumes,
            "nargs": "+",
        },
    )
    shm_size_mb: int = dataclasses.field(
        default=0,
        metadata={
            "help": "Size of a memory-backed /dev/shm in MiB (0: the runtime's default of 64 MiB); it counts "
            "against the job's memory limit."
        },
    )
    keep_jobs: bool = dataclasses.field(
        default=False,
        metadata={"help": "Keep finished Jobs and their pods (for kubectl describe) instead of deleting them."},
    )


common_settings = CommonSettings(
    non_local_exec=True,
    # The working directory is on a claim that every pod mounts: no storage provider, no source
    # archive to deploy, no plugins to pip-install in the pods.
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    auto_deploy_default_storage_provider=False,
    # Variables named with --envvars reach the pods through a Secret, not the command line.
    pass_envvar_declarations_to_cmd=False,
)


class Executor(KubernetesExecutor):
    def __post_init__(self):
        settings: ExecutorSettings = self.workflow.executor_settings
        try:
            kubernetes.config.load_kube_config()
            in_cluster = False
        except kubernetes.config.config_exception.ConfigException:
            kubernetes.config.load_incluster_config()
            in_cluster = True
        self.in_cluster = in_cluster
        self.namespace = settings.namespace or _current_namespace(in_cluster)
        if not settings.image:
            raise WorkflowError("eidf executor: set the job image (--eidf-image or SNAKEMAKE_EIDF_IMAGE)")
        if not settings.workdir_claim:
            raise WorkflowError("eidf executor: set --eidf-workdir-claim (the claim holding the working directory)")
        missing = [usage for usage in REQUIRED_SHARED_FS if usage not in self.workflow.storage_settings.shared_fs_usage]
        if missing:
            raise WorkflowError(
                "eidf executor: the working directory is shared with the pods through the workdir claim; "
                f"--shared-fs-usage must include {', '.join(u.item_to_choice() for u in missing)}"
            )
        workdir = Path.cwd()
        mount_path = Path(settings.workdir_mount) if settings.workdir_mount else workdir
        if not workdir.is_relative_to(mount_path):
            raise WorkflowError(
                f"eidf executor: the working directory {workdir} is not inside --eidf-workdir-mount {mount_path}; "
                "run Snakemake where the workdir claim is mounted"
            )

        self.kubeapi = kubernetes.client.CoreV1Api()
        self.batchapi = kubernetes.client.BatchV1Api()
        self.api_client = kubernetes.client.ApiClient()
        # The stock plugin's names: the Secret with --envvars values, and this run's id.
        self.run_namespace = str(uuid.uuid4())
        self.secret_envvars = {}
        self.register_secret()
        self.log_path = self.workflow.persistence.aux_path / "eidf-logs"
        self.log_path.mkdir(parents=True, exist_ok=True)
        self.keep_jobs = settings.keep_jobs
        self.site = Site(
            image=settings.image,
            queue_name=_queue_name(settings.queue_name, self.namespace),
            run_id=self.run_namespace,
            workdir=str(workdir),
            workdir_mount=Mount(settings.workdir_claim, str(mount_path)),
            mounts=tuple(Mount(volume.name, str(volume.path)) for volume in settings.volumes),
            gpu_product=settings.gpu_product,
            shm_size_mb=settings.shm_size_mb,
        )
        self.reported_warnings = set()
        self.logger.info(
            f"eidf executor: namespace {self.namespace}, queue {self.site.queue_name}, image {self.site.image}, "
            f"working directory {workdir} on claim {settings.workdir_claim}"
        )

    def additional_general_args(self):
        # A profile's replace-workflow-config must hold in the jobs too, or each pod would merge
        # the Snakefile's default configfile into the campaign it was planned with. The jobs of a
        # packed group all run even when one of them fails.
        replace = " --replace-workflow-config" if self.workflow.config_settings.replace_workflow_config else ""
        return f"--keep-going{replace}"

    _job_cores: int | None = None  # set while get_job_args builds one job's arguments

    @property
    def cores(self):
        return self._job_cores if self._job_cores is not None else super().cores

    def get_job_args(self, job: JobExecutorInterface):
        # The pod has the job's CPUs (requests = limits), not the node's: the Snakemake inside runs a
        # packed group's jobs on those, one at a time, rather than side by side on the node's count.
        # RemoteExecutor.get_job_args passes no per-job cores on, so `cores` answers for this job meanwhile.
        self._job_cores = job.threads
        try:
            return super().get_job_args(job)
        finally:
            self._job_cores = None

    def report_job_error(self, job_info: SubmittedJobInfo, msg=None, **kwargs):
        msg = failed_group_message(self, job_info, msg, "Kubernetes Job")
        super().report_job_error(job_info, msg=msg, **kwargs)

    def register_secret(self):
        if self.envvars():
            super().register_secret()

    def unregister_secret(self):
        if self.secret_envvars:
            super().unregister_secret()

    def job_request(self, job: JobExecutorInterface) -> JobRequest:
        resources = job.resources
        if resources.get("mem_mb") is None:
            raise WorkflowError(
                f"eidf executor: job {job.name} has no mem_mb resource; the service needs memory requests and "
                "limits (set default-resources: mem_mb=... in the profile)"
            )
        try:
            gpus = int(resources.get("gpu", 0) or 0)
        except ValueError:
            raise WorkflowError(
                f"eidf executor: job {job.name}: resource gpu={resources['gpu']!r} is not a GPU count"
            ) from None
        return JobRequest(
            name=job.name,
            command=self.format_job_exec(job),
            cores=job.threads,
            mem_mb=int(resources["mem_mb"]),
            gpus=gpus,
            gpu_product=resources.get("gpu_model"),
            runtime_min=resources.get("runtime"),
            secret_env=tuple((name, self.run_namespace, key) for key, name in self.secret_envvars.items()),
            image=resources.get("container_image"),
        )

    def run_job(self, job: JobExecutorInterface):
        body = job_manifest(self.site, self.job_request(job))
        try:
            created = self._api(lambda: self.batchapi.create_namespaced_job(self.namespace, body))
        except kubernetes.client.ApiException as error:
            # A refused Job (policy, schema) is refused for every job alike: stop the run here.
            raise WorkflowError(
                f"eidf executor: the API server refused the Job of {job.name}: {_api_message(error)}"
            ) from None
        except API_ERRORS as error:
            raise WorkflowError(f"eidf executor: cannot submit the Job of {job.name}: {error}") from None
        name = created.metadata.name
        (self.log_path / f"{name}.json").write_text(json.dumps(body, indent=1))
        self.logger.info(f"Job {name} submitted to queue {self.site.queue_name} (kubectl describe job {name})")
        self.report_job_submission(SubmittedJobInfo(job=job, external_jobid=name))

    async def check_active_jobs(self, active_jobs: list[SubmittedJobInfo]):
        # Nothing may escape from here: an exception would stop the status checks of the whole run.
        if not active_jobs:  # also the first call, made before __post_init__ has run
            return
        try:
            warnings = self._api(
                lambda: self.kubeapi.list_namespaced_event(self.namespace, field_selector="type=Warning")
            ).items
        except API_ERRORS as error:
            self.logger.warning(f"eidf executor: cannot list events: {error}")
            warnings = []
        for submitted in active_jobs:
            name = submitted.external_jobid
            async with self.status_rate_limiter:
                try:
                    job, pods = self._job_and_pods(name)
                except API_ERRORS as error:
                    self.logger.warning(f"eidf executor: status of Job {name} unavailable, checking again: {error}")
                    yield submitted
                    continue
            if job is None:
                self.report_job_error(submitted, msg=f"Job {name} disappeared (deleted outside Snakemake?). ")
                continue
            self._report_new_warnings(name, pods, warnings)
            outcome = job_outcome(job, pods)
            if outcome is None:
                yield submitted
            elif outcome.succeeded:
                self.report_job_success(submitted)
                self._clean_up(name)
            else:
                log = self._save_log(name, pods, outcome, warnings)
                self.report_job_error(submitted, msg=f"Kubernetes Job {name} failed: {outcome}. ", aux_logs=[log])
                self._clean_up(name)

    def _api(self, request):
        """One API request; an expired token (401) is reloaded from the kubeconfig once."""
        try:
            return request()
        except kubernetes.client.ApiException as error:
            if error.status != 401 or self.in_cluster:
                raise
        kubernetes.config.load_kube_config()
        self.kubeapi = kubernetes.client.CoreV1Api()
        self.batchapi = kubernetes.client.BatchV1Api()
        return request()

    def _job_and_pods(self, name: str) -> tuple[dict | None, list[dict]]:
        try:
            job = self._api(lambda: self.batchapi.read_namespaced_job_status(name, self.namespace))
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None, []
            raise
        pods = self._api(lambda: self.kubeapi.list_namespaced_pod(self.namespace, label_selector=f"job-name={name}"))
        serialize = self.api_client.sanitize_for_serialization
        return serialize(job), [serialize(pod) for pod in pods.items]

    def _report_new_warnings(self, name: str, pods: list[dict], warnings) -> None:
        """Log each distinct Warning event of the Job and its pods once (quota, scheduling, image pulls)."""
        for event in _events_of(name, pods, warnings):
            text = _describe(event)
            if text not in self.reported_warnings:
                self.reported_warnings.add(text)
                self.logger.warning(f"Kubernetes: {text}")

    def _save_log(self, name: str, pods: list[dict], outcome, warnings) -> str:
        """The failed pod's log, after the outcome and the warning events, in .snakemake/eidf-logs/."""
        lines = [f"Kubernetes Job {name}: {outcome}"]
        lines += [_describe(event) for event in _events_of(name, pods, warnings)]
        for pod in pods:
            pod_name = pod["metadata"]["name"]
            try:
                text = self._api(
                    lambda pod_name=pod_name: self.kubeapi.read_namespaced_pod_log(
                        pod_name, self.namespace, container=CONTAINER_NAME
                    )
                )
            except API_ERRORS as error:
                text = f"(log unavailable: {error})"
            lines += [f"----- log of pod {pod_name} -----", text]
        path = self.log_path / f"{name}.log"
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    def _clean_up(self, name: str) -> None:
        if self.keep_jobs:
            return
        try:
            self._api(lambda: self.safe_delete_job(name, ignore_not_found=True))
        except API_ERRORS as error:
            self.logger.warning(f"eidf executor: could not delete Job {name}: {error}")


def _events_of(name: str, pods: list[dict], events) -> list:
    involved = {name, *(pod["metadata"]["name"] for pod in pods)}
    return [event for event in events if event.involved_object.name in involved]


def _describe(event) -> str:
    return f"{event.involved_object.kind} {event.involved_object.name}: {event.reason}: {event.message}"


def _queue_name(template: str, namespace: str) -> str:
    """The Kueue LocalQueue of the Jobs: ``--eidf-queue-name`` with ``{namespace}`` filled in; refused
    before any submission if empty or naming another placeholder (an empty label may leave a Job
    unmanaged by Kueue on a real cluster)."""
    try:
        name = template.format(namespace=namespace)
    except (KeyError, IndexError, ValueError) as error:
        raise WorkflowError(
            f"eidf executor: --eidf-queue-name {template!r}: cannot fill it in ({type(error).__name__}: {error}); "
            "the one placeholder is {namespace}, e.g. '{namespace}-user-queue'"
        ) from None
    if not name.strip():
        raise WorkflowError(
            f"eidf executor: --eidf-queue-name {template!r} is empty; name the namespace's Kueue LocalQueue, "
            "e.g. '{namespace}-user-queue' (the EIDF GPU service refuses Jobs without it)"
        )
    return name


def _current_namespace(in_cluster: bool) -> str:
    if in_cluster:
        return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
    _, context = kubernetes.config.list_kube_config_contexts()
    namespace = context["context"].get("namespace")
    if not namespace:
        raise WorkflowError(
            "eidf executor: the kubeconfig's current context names no namespace; set --eidf-namespace "
            "(or SNAKEMAKE_EIDF_NAMESPACE)"
        )
    return namespace


def _api_message(error: kubernetes.client.ApiException) -> str:
    """The API server's own message (a Status object's), else the HTTP reason."""
    try:
        return f"{error.status} {json.loads(error.body)['message']}"
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"
