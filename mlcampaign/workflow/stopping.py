"""Stopping a campaign: SIGTERM ends a local campaign as promptly as Ctrl-C, and a second stop signal ends it
quietly.

Snakemake's scheduler takes SIGTERM as "exit after finishing the currently running jobs"
(snakemake.scheduling.job_scheduler.JobScheduler.exit_gracefully): trials of a local campaign trained on for
hours after `kill`, `timeout` or a batch system sent it, and a trial job waiting for the host's trial lock
(mlcampaign.job.supervisor) started training once the lock freed. Ctrl-C is another matter: the terminal sends
SIGINT to its whole foreground job, Snakemake and its jobs, and Snakemake cancels (a KeyboardInterrupt) while
they end (a trial, in a session of its own, through its job's supervisor, within INTERRUPT_GRACE_S). SIGTERM
may reach Snakemake alone.

``stop_as_ctrl_c``, called at the Snakefile's ``onstart`` (once Snakemake's scheduler has set its handler,
before any job starts), makes a local campaign's SIGTERM what Ctrl-C is: Snakemake passes it on to its job
processes (``job_processes``: what Ctrl-C reaches, less Snakemake's parents), and to any job process that
starts while it cancels, then cancels as on Ctrl-C. A job process that starts while Snakemake cancels on Ctrl-C
is passed SIGINT likewise: no trial starts after a stop. Either way, Snakemake then ignores further stop
signals: a second Ctrl-C would interrupt its clean-up with a traceback, and reaches the jobs from the terminal.
Jobs of other executors (Slurm, Kubernetes) are the batch system's: there SIGTERM keeps Snakemake's meaning
(it waits for them), and Ctrl-C has its executor cancel them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from mlcampaign.job.supervisor import live_processes

# How often, while Snakemake cancels, job processes that started after the stop signal are looked for.
NEW_JOB_POLL_S = 0.1


def job_processes() -> set[int]:
    """Snakemake's job processes: the processes of its process group that descend from it (what Ctrl-C at its
    terminal reaches, less its parents; a trial runs in a session of its own, and its job passes signals on)."""
    me, group = os.getpid(), os.getpgrp()
    children: dict[int, list[int]] = {}
    for process in live_processes():
        if process.group == group:
            children.setdefault(process.parent, []).append(process.pid)
    found, pending = set(), list(children.get(me, []))
    while pending:
        pid = pending.pop()
        found.add(pid)
        pending += children.get(pid, [])
    return found


def _signal(pids, number: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, number)


class _Stop:
    """Snakemake's handler of SIGINT (and of SIGTERM, on a local campaign) once the scheduler is set up."""

    def __init__(self, local: bool):
        self.local = local
        self.stopping = False

    def __call__(self, number: int, _frame) -> None:
        if self.stopping:
            return  # the jobs are ending, and Snakemake's clean-up with them
        self.stopping = True
        if self.local:
            started = job_processes()
            if number == signal.SIGTERM:  # a Ctrl-C reached them from the terminal; a SIGTERM may not have
                _signal(started, number)
            threading.Thread(target=self._signal_new_jobs, args=(number, started), daemon=True).start()
        raise KeyboardInterrupt

    @staticmethod
    def _signal_new_jobs(number: int, signalled: set[int]) -> None:
        """Pass ``number`` on to every job process that starts from now on, until Snakemake has ended (a job
        that Snakemake started just before the signal)."""
        while True:
            started = job_processes() - signalled
            _signal(started, number)
            signalled |= started
            time.sleep(NEW_JOB_POLL_S)


def stop_as_ctrl_c(workflow) -> None:
    """Install Snakemake's handling of stop signals (module docstring); ``workflow``: Snakemake's own object."""
    stop = _Stop(local=workflow.local_exec)
    signal.signal(signal.SIGINT, stop)
    if stop.local:
        signal.signal(signal.SIGTERM, stop)
