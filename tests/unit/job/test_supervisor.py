"""The trial job's supervisor (mlcampaign.job.supervisor): what ends a launch is recorded for what it was.

The launches here run a stand-in trial script (``FAKE_TRIAL``: it does what its arguments say and
records its command line) through the real supervisor and the system's launcher; real trials
through the supervisor are tests/unit/trial/test_distributed.py (2 ranks) and the workflow tests.
"""

import contextlib
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from mlcampaign.data.manifest import ID_FILE
from mlcampaign.data.staging import stage_into
from mlcampaign.job import supervisor
from mlcampaign.plan.config import load_campaign
from mlcampaign.records import files as record_module
from mlcampaign.records.builder import launch_failure_record
from mlcampaign.records.files import read_record, write_json_atomic, write_record

from conftest import REPO

# Does what the environment says (MLCAMPAIGN_FAKE: exit:<status>, kill:<signal>, sleep:<s>, eat:<MB>,
# record, stubborn:<s> (sleeps deaf to stop signals), orphan:<s> (leaves a process sleeping that long)),
# after writing its command line to MLCAMPAIGN_FAKE_ARGV and its pid (and the orphan's) beside it.
FAKE_TRIAL = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    from pathlib import Path
    Path(os.environ["MLCAMPAIGN_FAKE_ARGV"] + ".pid").write_text(str(os.getpid()))
    Path(os.environ["MLCAMPAIGN_FAKE_ARGV"]).write_text(json.dumps(sys.argv))
    action, _, value = os.environ["MLCAMPAIGN_FAKE"].partition(":")
    if action == "sleep":
        time.sleep(float(value))
    elif action == "stubborn":
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_IGN)
        time.sleep(float(value))
    elif action == "orphan":
        orphan = subprocess.Popen(["sleep", value])
        Path(os.environ["MLCAMPAIGN_FAKE_ARGV"] + ".orphan").write_text(str(orphan.pid))
    elif action == "kill":
        os.kill(os.getpid(), getattr(signal, value))
    elif action == "eat":
        chunks = [bytearray(1 << 20) for _ in range(int(value))]
    elif action == "record":
        record = Path(sys.argv[sys.argv.index("--record") + 1])
        record.write_text(Path(os.environ["MLCAMPAIGN_FAKE_RECORD"]).read_text())
        sys.exit(1)
    sys.exit(int(value) if action == "exit" else 0)
    """
)


@pytest.fixture(scope="module")
def trial_spec(tmp_path_factory):
    """The spec of a local 1x1 trial and its staged dataset's id file."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config |= {"benchmarks": ["resnet50-synthetic"], "trials": 1}
    config["benchmark_overrides"] = {
        "resnet50-synthetic": {
            "dataset": {
                "name": "synthetic-supervised",
                "source": {"options": {"num_classes": 2, "train_per_class": 4, "val_per_class": 2, "image_size": 8}},
            },
        }
    }
    campaign = load_campaign(config, REPO / "config")
    spec = campaign.trial_spec(next(campaign.trials()), "test-run", "local")
    staged = tmp_path_factory.mktemp("dataset")
    stage_into(spec["benchmark"]["dataset"], staged)
    return spec, staged / ID_FILE


@pytest.fixture
def job(tmp_path, monkeypatch, trial_spec):
    """A trial job of the stand-in trial: call it with the fake's action (and supervise's keywords)."""
    spec, dataset_id = trial_spec
    fake = tmp_path / "fake_trial.py"
    fake.write_text(FAKE_TRIAL)
    monkeypatch.setattr(supervisor, "TRIAL_PROGRAM", (str(fake),))
    monkeypatch.setattr(supervisor, "LOCAL_LOCK", tmp_path / "local-trials.lock")
    paths = {name: tmp_path / "trial" / name for name in ("record.json", "mllog.txt")}

    def run(action: str, spec=spec, time_limit_min=None, **environ):
        environ = dict(os.environ) | environ | {"MLCAMPAIGN_FAKE": action}
        environ["MLCAMPAIGN_FAKE_ARGV"] = str(tmp_path / "argv.json")
        status = supervisor.supervise(
            spec, dataset_id, *paths.values(), tmp_path / "job.log", time_limit_min, environ=environ
        )
        return status, json.loads((tmp_path / "argv.json").read_text()) if (tmp_path / "argv.json").exists() else None

    run.paths, run.log, run.spec, run.dataset_id = paths, tmp_path / "job.log", spec, dataset_id
    return run


def supervise_in_a_process(tmp_path, job, action, name="trial", first_line="", **popen):
    """Start the supervisor of the stand-in trial in a process of its own (to signal it, or to put it
    in a cgroup); ``first_line`` runs before anything else there. Returns the Popen."""
    folder = tmp_path / name
    (tmp_path / f"{name}-spec.json").write_text(json.dumps(job.spec | {"campaign": name}))
    program = "\n".join(
        [
            first_line,
            "import sys",
            f"sys.path.insert(0, {str(REPO)!r})",
            "import json",
            "from pathlib import Path",
            "from mlcampaign.job import supervisor",
            f"supervisor.TRIAL_PROGRAM = ({str(tmp_path / 'fake_trial.py')!r},)",
            f"supervisor.LOCAL_LOCK = Path({str(tmp_path / 'local-trials.lock')!r})",
            f"spec = json.loads(Path({str(tmp_path / f'{name}-spec.json')!r}).read_text())",
            f"folder = Path({str(folder)!r})",
            f"sys.exit(supervisor.supervise(spec, Path({str(job.dataset_id)!r}), folder / 'record.json',"
            " folder / 'mllog.txt', folder / 'job.log', None))",
        ]
    )
    environ = os.environ | {"MLCAMPAIGN_FAKE": action, "MLCAMPAIGN_FAKE_ARGV": str(tmp_path / f"{name}-argv.json")}
    return subprocess.Popen([sys.executable, "-c", program], env=environ, **popen)


def test_a_launch_that_fails_without_a_record_leaves_a_failure_record(job):
    status, _ = job("exit:3")
    assert status == 0  # the job succeeds: its output, a failure record, says what happened
    record = read_record(job.paths["record.json"])
    assert (record["status"], record["failure"]["reason"]) == ("failed", "error")
    assert "the launcher exited with status 3 before rank 0 wrote a record" in record["failure"]["message"]
    assert record["run"] == {"id": "test-run", "site": "local"}
    assert job.paths["mllog.txt"].exists()
    assert "without a record: error" in job.log.read_text()


def test_sigkill_without_an_oom_kill_is_not_called_out_of_memory(job):
    job("kill:SIGKILL")
    failure = read_record(job.paths["record.json"])["failure"]
    assert failure["reason"] == "error"
    if supervisor.oom_kills() is not None:  # the job's memory cgroup is readable: say it was not the OOM killer
        assert "killed by SIGKILL (not the OOM killer: no OOM kill in the job's memory cgroup)" in failure["message"]
    else:
        assert "killed by SIGKILL" in failure["message"]


def test_rank_0s_record_is_kept_when_the_launcher_fails_after_it(job, tmp_path):
    written = launch_failure_record(job.spec, "0123456789abcdef", 1, "diverged", "rank 0's own record")
    source = tmp_path / "rank0.json"
    source.write_text(json.dumps(written))
    job("record", MLCAMPAIGN_FAKE_RECORD=str(source))
    assert read_record(job.paths["record.json"])["failure"]["reason"] == "diverged"


def test_the_spec_travels_in_a_file_whatever_its_size(job):
    spec = json.loads(json.dumps(job.spec))
    spec["benchmark"]["description"] = "x" * 200_000  # beyond the kernel's limit of one argument (128 kB)
    _, argv = job("exit:0", spec=spec)
    spec_file = Path(argv[argv.index("--spec-file") + 1])
    assert json.loads(spec_file.read_text()) == spec
    assert sum(map(len, argv)) < 4000


def test_the_deadline_counts_from_the_jobs_start_less_the_margin(job):
    started = time.time() - 100.0
    job("exit:0", time_limit_min=10, SLURM_JOB_START_TIME=str(int(started)), SLURM_JOB_ID="42")
    _, argv = job("exit:0", time_limit_min=10, SLURM_JOB_START_TIME=str(int(started)), SLURM_JOB_ID="42")
    deadline = float(argv[argv.index("--deadline") + 1])
    assert deadline == pytest.approx(int(started) + 600 - supervisor.deadline_margin_s(10))
    written = json.loads((job.paths["record.json"].parent / supervisor.JOB_FILE).read_text())
    assert (written["scheduler"], written["job_id"]) == ("slurm", "42")


def test_a_failed_write_leaves_no_temporary_file_and_the_previous_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "record.json"
    target.write_text("previous")

    def full_disk(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        write_json_atomic({"a": 1}, target)
    assert [path.name for path in tmp_path.iterdir()] == ["record.json"]
    assert target.read_text() == "previous"


def test_a_record_that_could_not_be_written_is_written_by_the_next_run(job, tmp_path, monkeypatch):
    monkeypatch.setattr(record_module, "RECOVERY_DIR", tmp_path / "recovery")
    record = launch_failure_record(job.spec, "0123456789abcdef", 1, "timeout", "measured, then the disk was full")
    target = job.paths["record.json"]
    original = record_module.write_json_atomic

    def full_results_disk(data, path):
        if Path(path) == target:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(data, path)

    monkeypatch.setattr(record_module, "write_json_atomic", full_results_disk)
    with open(tmp_path / "trial.log", "w") as log, pytest.raises(OSError):
        write_record(record, target, log)
    said = (tmp_path / "trial.log").read_text()
    assert f"could not write the record {target}: [Errno 28] No space left on device" in said
    assert json.dumps(record, sort_keys=True) in said  # the measurement is in the job log too
    monkeypatch.setattr(record_module, "write_json_atomic", original)
    status, argv = job("exit:9")  # the stand-in would fail: it must not run
    assert (status, argv) == (0, None)
    assert read_record(target) == record
    assert not list((tmp_path / "recovery").iterdir())


def test_an_interrupted_trial_writes_no_record_so_it_is_not_run_rather_than_failed(job, tmp_path):
    """SIGTERM to the job (Ctrl-C of a local run, scancel): the trial's processes get it, the
    supervisor writes no record and exits 128 + 15."""
    process = supervise_in_a_process(tmp_path, job, "sleep:60")
    deadline = time.monotonic() + 60
    while not (tmp_path / "trial-argv.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    assert not (tmp_path / "trial" / "record.json").exists()
    said = (tmp_path / "trial" / "job.log").read_text()
    assert "the trial was interrupted (SIGTERM): no record written; it runs again next time" in said


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def started_trial(tmp_path, name="trial", timeout_s=60) -> int:
    """The pid of the stand-in trial of supervisor ``name``, once it has started."""
    pid_file = tmp_path / f"{name}-argv.json.pid"
    deadline = time.monotonic() + timeout_s
    while not (tmp_path / f"{name}-argv.json").exists():
        assert time.monotonic() < deadline, "the stand-in trial did not start"
        time.sleep(0.05)
    return int(pid_file.read_text())


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_a_stop_signal_ends_the_trial_and_the_job_within_seconds(job, tmp_path, number, inherited):
    """Ctrl-C, kill and a closed terminal reach the supervisor, not the trial's session: the supervisor
    forwards them, and ends once the trial has. Also where the job inherited the signals ignored (a
    campaign started in the background): its trial must not inherit that."""
    ignore = "import signal\nfor n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(n, signal.SIG_IGN)"
    process = supervise_in_a_process(tmp_path, job, "sleep:600", first_line=ignore if inherited == "ignored" else "")
    trial = started_trial(tmp_path)
    process.send_signal(number)
    try:
        assert process.wait(timeout=supervisor.INTERRUPT_GRACE_S + 20) == 128 + number
        assert not alive(trial)
    finally:  # nothing left running if the test fails
        process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(trial, signal.SIGKILL)
    assert not (tmp_path / "trial" / "record.json").exists()
    said = (tmp_path / "trial" / "job.log").read_text()
    assert f"the trial was interrupted ({signal.Signals(number).name}): no record written" in said


def test_a_trial_deaf_to_the_signal_is_killed_after_the_grace(job, tmp_path):
    process = supervise_in_a_process(tmp_path, job, "stubborn:600")
    trial = started_trial(tmp_path)
    time.sleep(0.5)  # its handlers set
    interrupted = time.monotonic()
    process.send_signal(signal.SIGINT)
    try:
        assert process.wait(timeout=supervisor.INTERRUPT_GRACE_S + 20) == 128 + signal.SIGINT
        assert time.monotonic() - interrupted < supervisor.INTERRUPT_GRACE_S + 10
        assert not alive(trial)
    finally:  # nothing left running if the test fails
        process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(trial, signal.SIGKILL)


def test_processes_a_trial_leaves_behind_end_with_it(job, tmp_path):
    status, _ = job("orphan:600")
    orphan = int((tmp_path / "argv.json.orphan").read_text())
    try:
        assert status == 0 and not alive(orphan)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)
    assert "processes of the trial left after its launcher ended were ended" in job.log.read_text()


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_while_waiting_for_the_host_s_lock_ends_the_job(job, tmp_path, number):
    with open(tmp_path / "local-trials.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        process = supervise_in_a_process(tmp_path, job, "sleep:1")
        log = tmp_path / "trial" / "job.log"
        deadline = time.monotonic() + 60
        while not (log.exists() and "waiting for the machine's trial lock" in log.read_text()):
            assert time.monotonic() < deadline, "the job did not wait for the lock"
            time.sleep(0.05)
        process.send_signal(number)
        try:
            assert process.wait(timeout=20) == 128 + number
        finally:
            process.kill()
    assert not (tmp_path / "trial-argv.json").exists()  # the trial never started
    assert f"interrupted ({signal.Signals(number).name}) before the trial started: nothing ran" in log.read_text()


def test_trials_of_two_campaigns_on_one_machine_take_turns(job, tmp_path):
    """The host's lock: a second local trial waits until the first has finished (their timings would
    contend for the cores), and says so in its log, naming the holder."""
    first = supervise_in_a_process(tmp_path, job, "sleep:3", name="first")
    time.sleep(1.5)
    started = time.monotonic()
    second = supervise_in_a_process(tmp_path, job, "sleep:3", name="second")
    assert first.wait(timeout=120) == 0 and second.wait(timeout=120) == 0
    assert time.monotonic() - started > 3.5  # it waited for the first (1.5 s left of its 3 s), then slept 3 s
    said = (tmp_path / "second" / "job.log").read_text()
    assert "waiting for the machine's trial lock" in said
    assert "first: " in said  # the holder is named


def test_a_real_oom_kill_is_recorded_as_out_of_memory(job, tmp_path):
    """The stand-in trial outgrows the memory limit of the job's cgroup: the kernel's OOM killer
    kills it, the cgroup counts the kill, and the record says out of memory."""
    parent = supervisor._memory_cgroup()
    if parent is None or os.geteuid() != 0:
        pytest.skip("needs root and a memory cgroup to make a child cgroup with a memory limit")
    cgroup = parent / f"mlcampaign-test-{os.getpid()}"
    try:
        cgroup.mkdir()
        limit = "memory.max" if (parent / "memory.max").exists() else "memory.limit_in_bytes"
        (cgroup / limit).write_text(str(400 << 20))
    except OSError as error:
        pytest.skip(f"cannot make a memory cgroup under {parent}: {error}")
    first_line = f"open({str(cgroup / 'cgroup.procs')!r}, 'w').write(str(__import__('os').getpid()))"
    try:
        process = supervise_in_a_process(tmp_path, job, "eat:2000", first_line=first_line, stderr=subprocess.PIPE)
        _, errors = process.communicate(timeout=120)
    finally:
        for _ in range(50):  # the cgroup empties once its processes have exited
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert process.returncode == 0, errors.decode()[-2000:]
    failure = read_record(tmp_path / "trial" / "record.json")["failure"]
    assert failure["reason"] == "out_of_memory"
    assert "the kernel's OOM killer killed 1 process(es) of this job" in failure["message"]
