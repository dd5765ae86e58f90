"""Snakemake executor ``slurm-sites``: the stock Slurm executor, with cancelled jobs and node failures handled.

Built on ``snakemake-executor-plugin-slurm`` 2.8.0, whose submission, status polling, cancellation
and settings it reuses unchanged (settings are spelled ``--slurm-sites-<name>`` instead of
``--slurm-<name>``). It fixes two faults of that release that break operations at a Slurm site:

1. A cancelled job is never seen to end. For a job cancelled with ``scancel``, ``sacct`` prints
   the state ``CANCELLED by <uid>``; the stock status check (``Executor.check_active_jobs``)
   compares each state exactly with its failure states, which list ``CANCELLED`` only, so it keeps
   such a job as running: the run waits forever. Here every status check first reads the run's job
   states with the stock query (``query_job_status_sacct``, ``query_job_status``) and reports each
   job whose state begins with ``CANCELLED`` as failed; the other jobs go to the stock check (one
   more sacct call per check: the stock check keeps its states to itself). A
   cancellation is somebody's decision, so the job is not retried even where ``retries`` would
   restart a failed job (Snakemake retries while a job's attempt is below its rule's
   ``restart_times``; the plugin interface has no "final failure" flag, so the job's attempt is set
   to its last). With ``--keep-going`` the rest of the workflow goes on.

2. A node failure breaks the retry and leaves a second copy of the job running. Slurm requeues a
   batch job whose node failed (``JobRequeue=1``, its default) unless it was submitted with
   ``--no-requeue``; the stock plugin, unless its ``requeue`` setting is on, reports the job's
   ``NODE_FAIL`` as a failure, so Snakemake resubmits it while Slurm's requeued copy runs on as an
   orphan. Worse, to exclude the failed node the stock plugin asks ``sacct -j <id> -X -o
   nodelist``, which for the requeued job prints ``None assigned``; that text is added to the
   failed nodes and every later submission passes ``--exclude=None assigned``, which sbatch refuses
   ("Unable to open file assigned"). Here jobs are submitted with ``--no-requeue`` unless the
   ``requeue`` setting asks Slurm to requeue them: a node failure then ends the job, Snakemake's
   ``retries`` (the one retry policy of the profile, with the attempt-scaled time limit of the
   rules) resubmit it away from the failed node, and when retries are exhausted the job fails
   cleanly. With ``requeue`` on, Slurm requeues the job under the same id and the stock check
   follows it to its end; only Slurm host lists are kept as failed nodes, so that ``None
   assigned`` (the requeued job's node list) is never passed to ``--exclude``.

It also makes packed allocations (Snakemake job groups: one batch job runs several jobs one after
another) keep what they finished:

3. A job of a group that fails no longer stops the group's other jobs (the job inside the
   allocation runs with ``--keep-going``), and a group that fails keeps the outputs of the jobs
   that finished in it and runs the rest with the next invocation (``mlcampaign.workflow.packing``,
   shared with the EIDF executor; Snakemake 9 would delete them all and retry every job of the group).
"""

import re

from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings, common_settings
from snakemake_executor_plugin_slurm.job_status_query import query_job_status, query_job_status_sacct
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

from mlcampaign.workflow.packing import failed_group_message

__all__ = ["Executor", "ExecutorSettings", "common_settings"]


class FailedNodes(set):
    """The stock executor's set of nodes to exclude, keeping only host lists (such as
    ``nid[001000-001003]``, never with a space): for a job that holds no node (a requeued job
    waiting to start again) sacct prints "None assigned" instead."""

    def add(self, node: str) -> None:
        if node and not re.search(r"\s", node):
            super().add(node)


class Executor(SlurmExecutor):
    def __post_init__(self, test_mode: bool = False):
        super().__post_init__(test_mode)
        settings = self.workflow.executor_settings
        if not settings.requeue:
            # Read by the stock submit command: sbatch ... --no-requeue.
            settings.no_requeue = True
        self._failed_nodes = FailedNodes(self._failed_nodes)

    def additional_general_args(self):
        # The job inside an allocation runs every job of a packed group even when one of them fails.
        return f"{super().additional_general_args()} --keep-going"

    def report_job_error(self, job_info: SubmittedJobInfo, msg=None, **kwargs):
        msg = failed_group_message(self, job_info, msg, "Slurm job")
        super().report_job_error(job_info, msg=msg, **kwargs)

    async def check_active_jobs(self, active_jobs: list[SubmittedJobInfo]):
        cancelled = await self._cancelled_states(active_jobs)
        for job_info in active_jobs:
            if job_info.external_jobid in cancelled:
                self._report_cancelled(job_info, cancelled[job_info.external_jobid])
        running = [job_info for job_info in active_jobs if job_info.external_jobid not in cancelled]
        async for job_info in super().check_active_jobs(running):
            yield job_info

    async def _cancelled_states(self, active_jobs: list[SubmittedJobInfo]) -> dict[str, str]:
        """Accounting state of each active job that was cancelled; empty where sacct cannot answer
        (the stock check then decides alone, as before)."""
        if not active_jobs:
            return {}
        async with self.status_rate_limiter:
            states, _ = await query_job_status(query_job_status_sacct(self.run_uuid), self.logger)
        active = {job_info.external_jobid for job_info in active_jobs}
        return {
            job_id: state
            for job_id, state in (states or {}).items()
            if job_id in active and state.startswith("CANCELLED")
        }

    def _report_cancelled(self, job_info: SubmittedJobInfo, state: str) -> None:
        job = job_info.job
        # The last attempt: Snakemake does not restart a job whose attempt reached its restart_times + 1.
        job.attempt = job.restart_times + 1
        self.report_job_error(
            job_info,
            msg=f"SLURM-job '{job_info.external_jobid}' was cancelled (sacct state '{state}'); not retried.",
            aux_logs=[str(job_info.aux.get("slurm_logfile"))],
        )
