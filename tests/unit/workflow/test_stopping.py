"""Snakemake's handling of stop signals (mlcampaign.workflow.stopping), in a process standing in for Snakemake:
SIGTERM to it alone is passed on to its job processes, cancels as Ctrl-C does, reaches a job that starts while it
cancels, and a second stop signal changes nothing. (The real campaign: tests/workflow/test_faults.py.)"""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

SNAKEMAKE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time, types
    from mlcampaign.workflow.stopping import stop_as_ctrl_c

    stop_as_ctrl_c(types.SimpleNamespace(local_exec=True))
    job = subprocess.Popen(["sleep", "60"])
    try:
        print("ready", flush=True)
        time.sleep(60)
        print("not stopped", flush=True)
    except KeyboardInterrupt:
        os.kill(os.getpid(), signal.SIGTERM)  # a second stop, while cancelling: nothing happens
        os.kill(os.getpid(), signal.SIGINT)
        late = subprocess.Popen(["sleep", "60"])  # a job Snakemake started just before the stop
        print("cancelled", job.wait(timeout=10), late.wait(timeout=10), flush=True)
    """
)


def _stand_in() -> subprocess.Popen:
    def default_stop_signals():
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)

    process = subprocess.Popen(
        [sys.executable, "-c", SNAKEMAKE],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as Snakemake's at a terminal
        preexec_fn=default_stop_signals,
    )
    assert process.stdout.readline() == "ready\n"
    return process


def test_sigterm_to_a_local_snakemake_ends_its_jobs_and_cancels_as_ctrl_c():
    process = _stand_in()
    try:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert output == f"cancelled {-signal.SIGTERM} {-signal.SIGTERM}\n"
    assert process.returncode == 0


def test_ctrl_c_cancels_and_a_second_one_while_cancelling_changes_nothing():
    """Ctrl-C reaches the jobs from the terminal (here: the whole process group); a job started after it is
    passed SIGINT too."""
    process = _stand_in()
    try:
        os.killpg(process.pid, signal.SIGINT)
        output = process.communicate(timeout=30)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert output == f"cancelled {-signal.SIGINT} {-signal.SIGINT}\n"
    assert process.returncode == 0
