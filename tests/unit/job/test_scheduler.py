"""Scheduler outcomes: time limits become timeout records; failed launches get the reason Slurm gives."""

import json
import os
import time

import pytest

from mlcampaign.job import slurm_accounting as scheduler
from mlcampaign.job.deadlines import MIN_DEADLINE_MARGIN_S, Deadline, deadline_margin_s
from mlcampaign.job.slurm_accounting import JOB_FILE, killed_trials, launch_failure_reason
from mlcampaign.plan.campaign import TRIAL_KEYS


def test_deadline_keeps_a_margin_to_write_the_record():
    assert Deadline.from_limit(60, started=1000.0, margin_s=deadline_margin_s(60)).at == 1000.0 + 3600 - 60
    # A tenth of short limits, never under the minimum.
    assert deadline_margin_s(5) == pytest.approx(30.0)
    assert deadline_margin_s(1) == MIN_DEADLINE_MARGIN_S
    assert not Deadline.from_limit(None, started=0.0, margin_s=deadline_margin_s(None)).passed()
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


def test_without_scheduler_accounting_no_reason_is_invented():
    # SIGKILL (status 137) comes from the OOM killer, a user or a lost node alike.
    assert launch_failure_reason(137, {})[0] == "error"
    assert launch_failure_reason(1, {})[0] == "error"


def write_job_file(trial_dir, job_id, scheduler="slurm"):
    """The job file the trial job's supervisor writes at job start."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    job = {"scheduler": scheduler, "job_id": job_id, "started_utc": "2026-12-01T09:00:00+00:00"}
    (trial_dir / JOB_FILE).write_text(json.dumps(job))


@pytest.fixture
def accounting(tmp_path, monkeypatch):
    """A stand-in for Slurm's sacct on PATH, holding each job id's records oldest first: with
    ``--duplicates`` it prints all of them, without only the newest, as sacct -j does."""

    def install(records: dict[str, list[str]]):
        sacct = tmp_path / "bin" / "sacct"
        sacct.parent.mkdir()
        sacct.write_text(
            "#!/usr/bin/env python3\nimport sys\n"
            f"records = {records!r}\n"
            "assert '-X' in sys.argv, 'job allocations only'\n"
            "for job_id in sys.argv[sys.argv.index('-j') + 1].split(','):\n"
            "    states = records[job_id] if '--duplicates' in sys.argv else records[job_id][-1:]\n"
            "    for state in states:\n"
            "        print(f'{job_id}|{state}')\n"
        )
        sacct.chmod(0o755)
        monkeypatch.setenv("PATH", f"{sacct.parent}:{os.environ['PATH']}")

    return install


def outcomes_by_key(rows):
    return {tuple(row[key] for key in TRIAL_KEYS): row for row in rows}


def test_a_trial_whose_slurm_job_was_killed_gets_the_job_s_state(tmp_path, accounting):
    """Job-level kills leave no record; the job file in the trial directory and accounting say why."""
    keys = [("archer2-cpu", "deepcam", "4x8-fp32", trial, 0) for trial in range(7)]
    cancelled, requeued, rerun_timed_out, running, never_started, kubernetes, finished = keys
    dirs = {key: tmp_path / "trials" / f"trial{key[3]}-rep0" for key in keys}
    for key, job_id in ((cancelled, "101"), (requeued, "102"), (rerun_timed_out, "103"), (running, "104")):
        write_job_file(dirs[key], job_id)
    write_job_file(dirs[kubernetes], "mlc-trial-7f3a", scheduler="kubernetes")
    write_job_file(dirs[finished], "106_2")
    dirs[never_started].mkdir(parents=True)
    accounting(
        {
            "101": ["CANCELLED by 0"],
            # Slurm requeued the job after its node failed; the new attempt waits to start again.
            "102": ["NODE_FAIL", "PENDING"],
            "103": ["NODE_FAIL", "TIMEOUT"],
            "104": ["RUNNING"],
            "106_2": ["COMPLETED"],
        }
    )
    outcomes = outcomes_by_key(killed_trials(dirs))
    assert set(outcomes) == {cancelled, requeued, rerun_timed_out}
    assert outcomes[cancelled]["failure_reason"] == "scheduler"
    assert "Slurm job 101 ended CANCELLED" in outcomes[cancelled]["failure_message"]
    assert outcomes[requeued]["failure_reason"] == "scheduler"
    assert "Slurm job 102 ended NODE_FAIL" in outcomes[requeued]["failure_message"]
    # The last attempt that ran decides.
    assert outcomes[rerun_timed_out]["failure_reason"] == "timeout"


def test_only_the_campaign_s_own_trials_are_looked_up(tmp_path, accounting):
    """Another campaign's cancelled job of the same trial key is not this campaign's failure."""
    key = ("local-cpu", "resnet50-digits", "1x1-fp32", 0, 0)
    trial = "trials/local-cpu/resnet50-digits/1x1-fp32/trial0-rep0"
    write_job_file(tmp_path / "results" / "other" / trial, "7")
    accounting({"7": ["CANCELLED by 0"]})
    assert killed_trials({key: tmp_path / "results" / "this" / trial}) == []
    assert len(killed_trials({key: tmp_path / "results" / "other" / trial})) == 1


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ('{"scheduler": "slurm", "job_id"', "not a readable job file"),
        ('["slurm", "5"]', "must be a JSON object, not list"),
        ('{"scheduler": "slurm", "job_id": 5}', "job_id must be a Slurm job id"),
        ('{"scheduler": "slurm", "job_id": "5; rm -rf /"}', "job_id must be a Slurm job id"),
    ],
)
def test_an_unreadable_job_file_is_named(tmp_path, accounting, content, complaint):
    accounting({"5": ["CANCELLED by 0"]})
    (tmp_path / "job.json").write_text(content)
    with pytest.raises(ValueError, match=complaint) as raised:
        killed_trials({("local-cpu", "resnet50-digits", "1x1-fp32", 0, 0): tmp_path})
    assert str(tmp_path / "job.json") in str(raised.value)


def test_without_accounting_no_outcome_is_invented(tmp_path, monkeypatch):
    key = ("local-cpu", "resnet50-digits", "1x1-fp32", 0, 0)
    write_job_file(tmp_path, "5")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert killed_trials({key: tmp_path}) == []
