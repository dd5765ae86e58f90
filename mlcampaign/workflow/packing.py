"""Packed allocations: a Snakemake job group whose jobs run one after another in one batch job (or pod).

A workflow packs jobs with Snakemake's own job groups (``--groups``, ``--group-components``), and
Snakemake plans, submits and accounts for the group as one job. When that one job fails part of the
way through (the allocation is killed, cancelled or loses its node, or one of its jobs fails),
Snakemake 9 fails the whole group: it deletes the outputs of every member, the finished ones too,
and a retry runs every member again (the group's command forces all of them). For a group of
benchmark trials that throws away measurements that completed.

``keep_finished_members`` is called by an executor when it reports a group job's failure
(``failed_group_message``, from its ``report_job_error``), before
Snakemake's error handling runs: each member that finished inside the allocation (its outputs all
exist and none is still marked incomplete; the job inside the allocation unmarks the outputs of a
member as it completes) keeps its outputs, through Snakemake's own mechanism for ``update()``
outputs: a failed job's ``update()`` output is restored from its backup, so the member's current
outputs are backed up here and Snakemake restores them unchanged (and records their metadata, as for
any job it post-processes). The other members' outputs go as Snakemake decides, and they run with
the next invocation. A group with a finished member is not retried in this invocation, because a
retry would run the finished members again; a group in which nothing finished is retried as before.

Only ``update()`` outputs can be kept this way: a member with another output is treated as unfinished.

Both of the project's executor plugins call it (snakemake-executor-plugin-slurm-sites for Slurm allocations,
snakemake-executor-plugin-eidf for Kubernetes Jobs), so it lives here rather than in one of them.
"""

from __future__ import annotations

from pathlib import Path

from snakemake.io import is_flagged


def finished_members(workflow, group) -> list:
    """The members of ``group`` that finished: every output exists and none is marked incomplete."""
    persistence = workflow.persistence
    persistence._clear_cache()  # the allocation's job changed the markers behind this process's cache
    finished = []
    for job in group.jobs:
        keys = [persistence._get_key(f) for f in job.output]
        if all(Path(f).exists() for f in job.output) and not persistence._filter_incomplete_keys(keys):
            finished.append(job)
    return finished


def keep_finished_members(workflow, group) -> str:
    """Keep the outputs of ``group``'s finished members when the group is reported failed (module
    docstring); the sentence that says what was kept, or "" when no member finished."""
    kept = [job for job in finished_members(workflow, group) if all(is_flagged(f, "update") for f in job.output)]
    if not kept:
        return ""
    for job in kept:
        for f in job.output:
            workflow.persistence.backup_output(Path(f))
    # The last attempt: Snakemake does not restart a job whose attempt exceeds its restart_times.
    group.attempt = group.restart_times + 1
    rest = len(group.jobs) - len(kept)
    return (
        f" {len(kept)} of {len(group.jobs)} jobs of the group finished; their outputs are kept. "
        f"The group is not retried now (a retry would run every job again): the other {rest} run "
        "with the next invocation."
    )


def failed_group_message(executor, job_info, msg: str | None, batch_job: str) -> str | None:
    """The message an executor's ``report_job_error`` passes on for ``job_info``: for a group job, its
    finished members' outputs are kept (``keep_finished_members``) and the message says so, and the
    log too, where Snakemake's report of a failed group does not show the message; ``batch_job``
    names what failed (e.g. "Slurm job", "Kubernetes Job")."""
    group = job_info.job
    if not group.is_group():
        return msg
    kept = keep_finished_members(executor.workflow, group)
    if kept:
        executor.logger.warning(f"{batch_job} {job_info.external_jobid} of group {group.groupid} failed.{kept}")
    return f"{msg or ''}{kept}" or None
