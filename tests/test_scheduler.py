"""Scheduler outcomes: time limits become timeout records; failed launches get the reason Slurm gives."""

import time

import pytest

from mlcampaign import scheduler
from mlcampaign.scheduler import DEADLINE_MARGIN_S, Deadline, launch_failure_reason


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
