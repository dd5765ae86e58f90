"""Scheduler outcomes: time limits become timeout records; failed launches get the reason Slurm gives."""

import os
import time

import pytest

from mlcampaign import scheduler
from mlcampaign.config import TRIAL_KEYS
from mlcampaign.scheduler import DEADLINE_MARGIN_S, Deadline, killed_trials, launch_failure_reason


def test_deadline_keeps_a_margin_to_write_the_record():
    assert Deadline.from_limit(60, started=1000.0).at == 1000.0 + 3600 - DEADLINE_MARGIN_S
    # Short limits keep 90 % of the time rather than nothing.
    assert Deadline.from_limit(1, started=0.0).at == pytest.approx(54.0)
    assert not Deadline.from_limit(None).passed()
    assert Deadline(time.time() - 1).passed()


@pytest.mark.parametrize(
    ("states", "reason"),
    [
        (["COMPLETED", "OUT_OF_MEMORY"], "out_of_memory"),
        (["RUNNING", "TIMEOUT"], "timeout"),
        (["NODE_FAIL"], "scheduler"),
        (["CANCELLED"], "scheduler"),
    ],
)
def test_slurm_step_state_becomes_the_failure_reason(monkeypatch, states, reason):
    monkeypatch.setattr(scheduler, "slurm_step_states", lambda job_id: states)
    found, explanation = launch_failure_reason(1, {"SLURM_JOB_ID": "77"})
    assert found == reason
    assert "77" in explanation and states[-1] in explanation


def test_without_scheduler_accounting_the_exit_status_decides():
    assert launch_failure_reason(137, {})[0] == "out_of_memory"
    assert launch_failure_reason(1, {})[0] == "error"


def test_a_trial_whose_slurm_job_was_killed_gets_the_job_s_state(tmp_path, monkeypatch):
    """Job-level kills leave no record; the executor's log directory and accounting say why."""
    killed = ("archer2-cpu", "deepcam", "4x8-fp32", 0, 0)
    retried = ("archer2-cpu", "deepcam", "4x8-fp32", 1, 0)
    still_running = ("archer2-cpu", "deepcam", "4x8-fp32", 2, 0)
    never_submitted = ("archer2-cpu", "deepcam", "4x8-fp32", 3, 0)
    for key, job_ids in ((killed, [101]), (retried, [102, 110]), (still_running, [103])):
        directory = tmp_path / "_".join(map(str, key))
        directory.mkdir()
        for job_id in job_ids:
            (directory / f"{job_id}.log").write_text("")
    # A stand-in for Slurm's sacct on PATH: the states of the jobs asked for.
    states = {"101": "CANCELLED by 0", "102": "NODE_FAIL", "110": "TIMEOUT", "103": "RUNNING"}
    sacct = tmp_path / "bin" / "sacct"
    sacct.parent.mkdir()
    sacct.write_text(
        "#!/usr/bin/env python3\nimport sys\n"
        f"states = {states!r}\n"
        "for job_id in sys.argv[sys.argv.index('-j') + 1].split(','):\n"
        "    print(f'{job_id}|{states[job_id]}')\n"
    )
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{sacct.parent}:{os.environ['PATH']}")
    outcomes = {
        tuple(row[key] for key in TRIAL_KEYS): row
        for row in killed_trials([killed, retried, still_running, never_submitted], tmp_path)
    }
    assert set(outcomes) == {killed, retried}
    assert outcomes[killed]["failure_reason"] == "scheduler"
    assert "Slurm job 101 ended CANCELLED" in outcomes[killed]["failure_message"]
    # The last attempt decides.
    assert outcomes[retried]["failure_reason"] == "timeout"
    assert "110" in outcomes[retried]["failure_message"]


def test_without_accounting_no_outcome_is_invented(tmp_path, monkeypatch):
    key = ("local-cpu", "resnet50-digits", "1x1-fp32", 0, 0)
    (tmp_path / "_".join(map(str, key))).mkdir()
    (tmp_path / "_".join(map(str, key)) / "5.log").write_text("")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert killed_trials([key], tmp_path) == []
