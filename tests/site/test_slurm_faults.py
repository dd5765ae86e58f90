"""Site faults on a real single-node Slurm (../shared/tools/slurm-localhost), through the project's
executor plugin ``slurm-sites`` (snakemake-executor-plugin-slurm-sites/) and the snakemake CLI.

- A job cancelled with scancel fails (not retried) and the run goes on: the stock Slurm executor
  2.8.0 kept such a job ("CANCELLED by 0") as running forever.
- A node failure ends the job (submitted with --no-requeue, Slurm does not requeue it behind
  Snakemake's back); Snakemake's retry is submitted with the failed node excluded, which on this
  one-node cluster sbatch refuses: a clean failure, with no job of the run left in the queue. The
  stock executor passed --exclude=None assigned and left Slurm's requeued copy running.
- The partial analysis's reading of accounting (mlcampaign.job.slurm_accounting.killed_trials) on the real
  sacct: cancelled, failed node, and a node failure hidden behind Slurm's requeued copy.

The integration tests need root (the tool installs and starts the Slurm daemons). Failing the node
kills every job on the cluster, so those tests skip while jobs other than their own are queued.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from servers import slurm_queue
from snakemake_executor_plugin_slurm_sites import FailedNodes

from mlcampaign.job.slurm_accounting import killed_trials

from conftest import SNAKEMAKE

NODE = "localhost"
# Each job sleeps this long: time to act on it while it runs (a job runs within seconds of its submission, and
# the tests act once they see it running), and what the cancelled-job test waits for its survivor.
JOB_S = 20
PROFILE = {
    "executor": "slurm-sites",
    "jobs": 2,
    "retries": 1,
    "latency-wait": 5,
    "slurm-sites-init-seconds-before-status-checks": 5,
    "slurm-sites-keep-successful-logs": True,
    "default-resources": {"slurm_partition": "debug", "slurm_account": "root", "runtime": 5, "mem_mb": 200},
}
TRIAL_KEY = ("slurm-localhost", "tiny", "1x1-fp32", 0, 0)


def write_workflow(workdir: Path, names: list[str]) -> None:
    (workdir / "Snakefile").write_text(
        f"rule all:\n    input: expand('done/{{name}}.txt', name={names!r})\n\n"
        f"rule sleeper:\n    output: 'done/{{name}}.txt'\n    shell: 'sleep {JOB_S}; echo done > {{output}}'\n"
    )
    (workdir / "profile").mkdir()
    (workdir / "profile" / "config.yaml").write_text(json.dumps(PROFILE))


def start_snakemake(workdir: Path, limit_s: int) -> subprocess.Popen:
    """The snakemake CLI on the workflow, with --keep-going, stopped by SIGINT after ``limit_s``
    (the Slurm executor ignores SIGTERM); its output goes to workdir/snakemake.out."""
    return subprocess.Popen(
        [
            *("timeout", "-s", "INT", str(limit_s)),
            *(SNAKEMAKE, "--snakefile", str(workdir / "Snakefile"), "--directory", str(workdir)),
            *("--profile", "profile", "--keep-going"),
        ],
        cwd=workdir,
        stdout=(workdir / "snakemake.out").open("w"),
        stderr=subprocess.STDOUT,
    )


def finish(run: subprocess.Popen, workdir: Path) -> tuple[int, str]:
    returncode = run.wait(timeout=600)
    return returncode, (workdir / "snakemake.out").read_text()


ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"}


def wait_for_running(workdir: Path, run: subprocess.Popen, comment: str, timeout_s: float = 120) -> str:
    """The id of the run's job whose comment ends with ``comment``, once it runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert run.poll() is None, (workdir / "snakemake.out").read_text()[-4000:]
        for job in slurm_queue():
            if job["workdir"] == str(workdir) and job["comment"].endswith(comment) and job["state"] == "RUNNING":
                return job["job_id"]
        time.sleep(1)
    raise AssertionError(f"no running job {comment} after {timeout_s} s: {slurm_queue()}")


def accounting(job_id: str, *options: str) -> list[str]:
    """States of the job's allocation records (sacct -X)."""
    result = subprocess.run(
        ["sacct", "-X", "-n", "-P", "--format=State", "-j", job_id, *options],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return result.stdout.split()


def fail_node_unless_shared(own_job_ids: set[str]) -> None:
    """Set the node down (its jobs end NODE_FAIL); skip while other jobs are queued, which it would kill."""
    others = [job for job in slurm_queue() if job["state"] in ACTIVE and job["job_id"] not in own_job_ids]
    if others:
        pytest.skip(f"other jobs are on the shared test cluster and a node failure would kill them: {others}")
    subprocess.run(["scontrol", "update", f"nodename={NODE}", "state=down", "reason=test"], check=True, timeout=30)


def restore_node() -> None:
    """Resume the node unless Slurm returned it to service already (ReturnToService), and wait until it is up."""
    node_state = ["sinfo", "-h", "-n", NODE, "-o", "%T"]
    if "down" in subprocess.run(node_state, capture_output=True, text=True, timeout=30).stdout:
        subprocess.run(["scontrol", "update", f"nodename={NODE}", "state=resume"], timeout=30)
    deadline = time.monotonic() + 60
    while "down" in (state := subprocess.run(node_state, capture_output=True, text=True, timeout=30).stdout):
        assert time.monotonic() < deadline, f"node {NODE} still {state.strip()} a minute after resume"
        time.sleep(1)


def job_file(trial_dir: Path, job_id: str) -> Path:
    """The job file the trial job's supervisor writes at job start (read by killed_trials)."""
    trial_dir.mkdir(parents=True)
    (trial_dir / "job.json").write_text(json.dumps({"scheduler": "slurm", "job_id": job_id, "started_utc": ""}))
    return trial_dir


@pytest.mark.integration
def test_a_cancelled_job_fails_and_the_run_goes_on(slurm, tmp_path):
    write_workflow(tmp_path, ["cancelled", "survivor"])
    started = time.monotonic()
    run = start_snakemake(tmp_path, limit_s=240)
    job_id = wait_for_running(tmp_path, run, "wildcards_cancelled")
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    returncode, output = finish(run, tmp_path)
    elapsed = time.monotonic() - started

    # The run ended by itself (`timeout` exits 124 when it had to stop it), failed: one job failed.
    assert returncode not in (0, 124), output[-4000:]
    assert f"SLURM-job '{job_id}' was cancelled (sacct state 'CANCELLED by " in output
    assert "Trying to restart job" not in output, "a cancelled job is not retried"
    assert (tmp_path / "done" / "survivor.txt").is_file()
    assert not (tmp_path / "done" / "cancelled.txt").exists()
    print(f"cancelled job {job_id}: run ended after {elapsed:.0f} s (jobs of {JOB_S} s)")

    trial = killed_trials({TRIAL_KEY: job_file(tmp_path / "trial", job_id)})
    assert [(row["failure_reason"], row["failure_message"]) for row in trial] == [
        ("scheduler", f"Slurm job {job_id} ended CANCELLED before the trial wrote a record")
    ]


@pytest.mark.integration
def test_a_node_failure_ends_the_job_and_its_retry_avoids_the_node(slurm, tmp_path):
    write_workflow(tmp_path, ["on_failed_node"])
    started = time.monotonic()
    run = start_snakemake(tmp_path, limit_s=180)
    try:
        job_id = wait_for_running(tmp_path, run, "wildcards_on_failed_node")
        try:
            fail_node_unless_shared({job_id})
        except pytest.skip.Exception:
            run.send_signal(signal.SIGINT)
            run.wait(timeout=120)
            raise
        returncode, output = finish(run, tmp_path)
    finally:
        restore_node()
    elapsed = time.monotonic() - started

    assert returncode not in (0, 124), output[-4000:]
    assert f"SLURM-job '{job_id}' failed due to a node failure" in output
    # Snakemake retried it, on another node: on this one-node cluster sbatch refuses that.
    assert "Trying to restart job" in output
    assert f"--exclude={NODE}" in output and "Requested node configuration is not available" in output
    assert "None assigned" not in output
    # Submitted with --no-requeue: Slurm kept one record of the job, and nothing of the run is queued.
    assert accounting(job_id, "--duplicates") == ["NODE_FAIL"]
    assert [job for job in slurm_queue() if job["workdir"] == str(tmp_path) and job["state"] in ACTIVE] == []
    print(f"node failure of job {job_id}: run ended after {elapsed:.0f} s")

    trial = killed_trials({TRIAL_KEY: job_file(tmp_path / "trial", job_id)})
    assert [row["failure_reason"] for row in trial] == ["scheduler"]
    assert f"Slurm job {job_id} ended NODE_FAIL" in trial[0]["failure_message"]


@pytest.mark.integration
def test_the_node_failure_of_a_job_slurm_requeued_is_seen(slurm, tmp_path):
    """A job submitted with --requeue (Slurm's default for batch jobs): after the node failure its
    newest accounting record is the requeued copy, waiting to start again."""
    submitted = subprocess.run(
        [
            *("sbatch", "--parsable", "--requeue", "--mem=100", "-o", os.devnull, "-D", str(tmp_path)),
            f"--wrap=sleep {JOB_S}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while accounting(job_id) != ["RUNNING"]:
            assert time.monotonic() < deadline, f"job {job_id} not running: {accounting(job_id)}"
            time.sleep(1)
        try:
            fail_node_unless_shared({job_id})
        finally:
            restore_node()
        deadline = time.monotonic() + 60
        while accounting(job_id, "--duplicates") != ["NODE_FAIL", "PENDING"]:
            assert time.monotonic() < deadline, f"job {job_id} not requeued: {accounting(job_id, '--duplicates')}"
            time.sleep(1)
        # Without --duplicates sacct shows only the copy, as if the trial were merely waiting.
        assert accounting(job_id) == ["PENDING"]
        trial = killed_trials({TRIAL_KEY: job_file(tmp_path / "trial", job_id)})
        assert [row["failure_reason"] for row in trial] == ["scheduler"]
        assert f"Slurm job {job_id} ended NODE_FAIL" in trial[0]["failure_message"]
    finally:
        subprocess.run(["scancel", job_id], timeout=30)


def test_only_host_lists_become_excluded_nodes():
    """sacct prints "None assigned" as the node list of a job that holds none (Slurm's requeued copy)."""
    nodes = FailedNodes({"nid001000"})
    for node in ("None assigned", "", "nid[001001-001003]", "gpu-7.ib"):
        nodes.add(node)
    assert nodes == {"nid001000", "nid[001001-001003]", "gpu-7.ib"}
