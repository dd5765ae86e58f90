"""The trial job's supervisor: it starts the trial's processes and makes sure the trial ends in a record
that says what happened to it.

The workflow's trial rule runs ``supervise`` (scripts/trial.py) inside the trial's job, on the node
where the job starts, without importing torch. It

1. writes the trial spec beside the record (``spec.json``: the spec never travels on a command
   line, whatever its size) and what the scheduler says of the job (``job.json``: the Slurm job id,
   which mlcampaign.job.slurm_accounting.killed_trials reads if the whole job is killed);
2. on a local system, waits for the host's trial lock, so that trials of different campaigns on one
   machine never share its cores (their timings would contend);
3. starts the system's launcher with the trial program (mlcampaign.job.launch), which stops training by
   itself at the deadline: the job's time limit counted from the job's start (Slurm's, or the pod's
   as the EIDF executor passes it), less ``deadline_margin_s`` to write the record and end the job;
   in a packed allocation, the trial's own limit from its start, within the allocation's end
   (``trial_deadline``);
4. forwards SIGINT (Ctrl-C), SIGTERM (kill, a scheduler) and SIGHUP (the terminal closed) to the
   trial's process group, which then has ``INTERRUPT_GRACE_S`` to end before it is killed; the
   supervisor ends once no process of the group is left, so an interrupted campaign ends within
   seconds and leaves no trial training (the trial runs in a session of its own, where a terminal's
   signals do not reach it). Such a signal before the trial starts (a wait for the host's lock
   among it) ends the job, as a signal that Snakemake passes on to it does (mlcampaign.workflow.stopping:
   SIGTERM to a local campaign). An interrupted trial writes no record, so it is not run rather than
   failed, and the next run starts it again. Once stopped, the job ignores further stop signals while it
   ends (a second Ctrl-C would interrupt that with a traceback);
5. after a launch that ended without rank 0's record, writes a failure record whose reason is what
   happened: Slurm's account of the job's steps, the kernel's OOM killer (the job's memory cgroup
   counts its kills), or the signal or exit status otherwise.

A record that a trial measured but could not write (a full disk) is kept elsewhere
(mlcampaign.records.files.write_record); the job's next run writes it and trains nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from mlcampaign.data.manifest import read_dataset_id
from mlcampaign.job.deadlines import Deadline, deadline_margin_s
from mlcampaign.job.launch import TRIAL_PROGRAM, launch_argv, trial_environment
from mlcampaign.job.slurm_accounting import JOB_FILE, launch_failure_reason
from mlcampaign.plan.runs import utc_now
from mlcampaign.records.builder import launch_failure_record
from mlcampaign.records.files import forget_recovered, recovered_record, supersede, write_json_atomic, write_record

SPEC_FILE = "spec.json"
# What stops a trial job: Ctrl-C, kill and schedulers, a terminal that closes.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long an interrupted trial's processes have to end (a Python trial unwinds, its data loader
# workers exit) before they are killed: seconds on a loaded machine.
INTERRUPT_GRACE_S = 10.0
# Where the host-wide lock of local trials lives (one machine, every checkout and campaign on it).
LOCAL_LOCK = Path(os.environ.get("MLCAMPAIGN_LOCK_DIR", tempfile.gettempdir())) / "mlcampaign-local-trials.lock"


def job_start(environ: Mapping[str, str]) -> float:
    """When the trial's job started (seconds since the epoch): Slurm's SLURM_JOB_START_TIME, the EIDF
    executor's MLCAMPAIGN_JOB_START (the pod's start), else now (a local job starts with this process)."""
    for variable in ("SLURM_JOB_START_TIME", "MLCAMPAIGN_JOB_START"):
        value = environ.get(variable, "")
        if value.replace(".", "", 1).isdigit():
            return float(value)
    return time.time()


def job_end(environ: Mapping[str, str]) -> float | None:
    """When the trial's job will be ended (seconds since the epoch): Slurm's SLURM_JOB_END_TIME (set
    since Slurm 23.02), the EIDF executor's MLCAMPAIGN_JOB_END (the pod's start plus its time limit),
    else None (unknown)."""
    for variable in ("SLURM_JOB_END_TIME", "MLCAMPAIGN_JOB_END"):
        value = environ.get(variable, "")
        if value.replace(".", "", 1).isdigit():
            return float(value)
    return None


def trial_deadline(time_limit_min: float | None, environ: Mapping[str, str]) -> Deadline:
    """When the trial stops itself: its time limit after its start, but never after its job's end, each
    ``deadline_margin_s`` early. A job of one trial ends its limit after the job's start, so that is
    the deadline; a packed allocation (docs/sites.md) runs its trials one after another, each with
    its own limit from its own start, within the allocation's. Without a known job end, the limit
    counts from the job's start."""
    margin = deadline_margin_s(time_limit_min)
    end = job_end(environ)
    if time_limit_min is None or end is None:
        return Deadline.from_limit(time_limit_min, job_start(environ), margin)
    return Deadline(min(Deadline.from_limit(time_limit_min, time.time(), margin).at, end - margin))


def _memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (cgroup v2, or v1's memory controller), if mounted."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and Path("/sys/fs/cgroup", path.lstrip("/"), "memory.events").is_file():
            return Path("/sys/fs/cgroup", path.lstrip("/"))
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory", path.lstrip("/"))
    return None


def oom_kills() -> int | None:
    """Processes the kernel's OOM killer has killed in this process's memory cgroup and below (v2
    memory.events, v1 memory.oom_control: both count ``oom_kill``); None where unreadable."""
    cgroup = _memory_cgroup()
    if cgroup is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        with contextlib.suppress(OSError):
            for line in (cgroup / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


@contextlib.contextmanager
def local_trial_lock(holder: str, log) -> Iterator[None]:
    """Hold the host's lock of local trials for the body; say in the log when another trial has it."""
    LOCAL_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCAL_LOCK, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            print(f"waiting for the machine's trial lock ({LOCAL_LOCK}), held by: {lock.read().strip()}", file=log)
            log.flush()
            waited = time.monotonic()
            fcntl.flock(lock, fcntl.LOCK_EX)
            print(f"got the trial lock after {time.monotonic() - waited:.0f} s", file=log)
        lock.seek(0)
        lock.truncate()
        lock.write(f"{holder} (pid {os.getpid()}, since {utc_now()})\n")
        lock.flush()
        try:
            yield
        finally:
            lock.truncate(0)


class Interrupted(Exception):
    """A stop signal (STOP_SIGNALS) before the trial started."""

    def __init__(self, number: int):
        super().__init__(signal.Signals(number).name)
        self.number = number


@dataclasses.dataclass(frozen=True)
class Process:
    """A live process as /proc/<pid>/stat tells it."""

    pid: int
    parent: int
    group: int


def live_processes() -> Iterator[Process]:
    """The live processes of this machine (zombies, which signals cannot end, left out)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if fields[0] != "Z":
            yield Process(int(stat.parent.name), int(fields[1]), int(fields[2]))


def _group_members(group: int) -> list[int]:
    """The live processes of process group ``group``."""
    return [process.pid for process in live_processes() if process.group == group]


def _signal_group(group: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, number)


def _end_group(group: int, grace_s: float) -> None:
    """Wait up to ``grace_s`` for the processes of ``group`` to end, then kill those left (SIGKILL) and
    wait for them."""
    waited_until = time.monotonic() + grace_s
    while _group_members(group) and time.monotonic() < waited_until:
        time.sleep(0.05)
    if _group_members(group):
        _signal_group(group, signal.SIGKILL)
        killed_until = time.monotonic() + 5
        while _group_members(group) and time.monotonic() < killed_until:
            time.sleep(0.05)


class _StopSignals:
    """The trial job's handling of STOP_SIGNALS (module docstring), installed before the trial starts:
    its processes then start with each signal's default action whatever the job inherited (a handler
    is reset in a new program, while an ignored signal stays ignored: a campaign started where Ctrl-C
    is ignored, as in a background job, would start trials that ignore it)."""

    def __init__(self):
        self.received: list[int] = []
        self.group: int | None = None
        self.left_over: list[int] = []  # processes of the trial's group that outlived its launcher
        self._starting = False
        self._kill_timer: threading.Timer | None = None

    def __enter__(self) -> _StopSignals:
        self._previous = {number: signal.signal(number, self._handle) for number in STOP_SIGNALS}
        return self

    def __exit__(self, *exc_info) -> None:
        for number, handler in self._previous.items():
            # Once stopped, the job only ends: a second Ctrl-C must not interrupt that with a traceback.
            signal.signal(number, signal.SIG_IGN if self.received else handler)
        if self._kill_timer is not None:
            self._kill_timer.cancel()

    def _handle(self, number: int, _frame) -> None:
        self.received.append(number)
        if self.group is not None:
            self._forward(number)
        elif not self._starting:
            raise Interrupted(number)

    def _forward(self, number: int) -> None:
        """Pass the signal on to the trial's group, which is killed if it has not ended INTERRUPT_GRACE_S later."""
        _signal_group(self.group, number)
        if self._kill_timer is None:
            self._kill_timer = threading.Timer(INTERRUPT_GRACE_S, _signal_group, (self.group, signal.SIGKILL))
            self._kill_timer.daemon = True
            self._kill_timer.start()

    def start(self, *popen_args, **popen_keywords) -> subprocess.Popen:
        """Start the trial in a session of its own; a signal meanwhile is forwarded once it has started."""
        self._starting = True
        try:
            process = subprocess.Popen(*popen_args, start_new_session=True, **popen_keywords)
            self.group = process.pid
        finally:
            self._starting = False
        if self.received:
            self._forward(self.received[0])
        return process

    def wait(self, process: subprocess.Popen) -> int:
        """The launcher's exit status, once no process of the trial's group is left."""
        status = process.wait()
        # What the launcher left of the group (a rank, a data loader worker): it ends with the trial.
        self.left_over = _group_members(process.pid)
        if self.left_over:
            _signal_group(process.pid, self.received[0] if self.received else signal.SIGTERM)
            _end_group(process.pid, INTERRUPT_GRACE_S)
        if self._kill_timer is not None:  # the group is gone: its id may be another's soon
            self._kill_timer.cancel()
        return status


def _failure_explanation(status: int, oom_before: int | None, environ: Mapping[str, str]) -> tuple[str, str]:
    """The failure reason and why, for a launch that exited with ``status`` without rank 0's record."""
    reason, explanation = launch_failure_reason(status, environ)
    if reason != "error":  # Slurm's accounting named it
        return reason, explanation
    after = oom_kills()
    if oom_before is not None and after is not None and after > oom_before:
        return "out_of_memory", f"the kernel's OOM killer killed {after - oom_before} process(es) of this job"
    if status < 0 or status > 128:
        number = -status if status < 0 else status - 128
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else f"signal {number}"
        cause = "" if oom_before is None else " (not the OOM killer: no OOM kill in the job's memory cgroup)"
        return "error", f"a process was killed by {name}{cause}"
    return "error", "a process failed or was stopped; its traceback is in the trial log"


def supervise(
    spec: dict,
    dataset_id: Path,
    record: Path,
    mllog: Path,
    log: Path,
    time_limit_min: float | None,
    python: str = sys.executable,
    environ: Mapping[str, str] = os.environ,
) -> int:
    """Run one trial job (module docstring); its exit status (0 once a record exists)."""
    record, mllog = Path(record), Path(mllog)
    trial_dir = record.parent
    trial_dir.mkdir(parents=True, exist_ok=True)
    previous = supersede(record)  # a failed trial run again on request: its failure stays in the history
    mllog.unlink(missing_ok=True)  # an output Snakemake keeps (update()): it belongs to the record just kept
    kept = recovered_record(record, spec["trial"])
    if kept is not None:
        with open(log, "a") as log_file:
            print(f"the previous run measured this trial but could not write {record}: written now", file=log_file)
            write_record(kept, record, log_file)
        mllog.touch()
        forget_recovered(record)
        return 0
    spec_path = trial_dir / SPEC_FILE
    write_json_atomic(spec, spec_path)
    started = job_start(environ)
    write_json_atomic(
        {
            "scheduler": "slurm" if "SLURM_JOB_ID" in environ else spec["trial"]["executor"],
            "job_id": environ.get("SLURM_JOB_ID"),
            "job_started_utc": datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(timespec="seconds"),
        },
        trial_dir / JOB_FILE,
    )
    deadline = trial_deadline(time_limit_min, environ)
    argv = [*launch_argv(spec["system"], spec["trial"], python), *TRIAL_PROGRAM]
    argv += ["--spec-file", str(spec_path), "--dataset-id", str(dataset_id), "--record", str(record)]
    argv += ["--mllog", str(mllog), *(["--deadline", repr(deadline.at)] if deadline.at is not None else [])]
    with open(log, "a") as log_file:
        if previous is not None:
            print(f"the trial's previous record is kept as {previous}", file=log_file)
        lock = (
            local_trial_lock(f"{spec['campaign']}: {trial_dir}", log_file)
            if spec["trial"]["executor"] == "local"
            else contextlib.nullcontext()
        )
        try:
            with _StopSignals() as stop, lock:
                oom_before = oom_kills()
                process = stop.start(argv, stdout=log_file, stderr=subprocess.STDOUT, env=trial_environment(environ))
                status = stop.wait(process)
        except Interrupted as interrupt:
            print(f"interrupted ({interrupt}) before the trial started: nothing ran", file=log_file)
            return 128 + interrupt.number
        if stop.left_over:
            print(f"processes of the trial left after its launcher ended were ended: {stop.left_over}", file=log_file)
        if record.exists():
            forget_recovered(record)
            return 0
        if stop.received:
            name = signal.Signals(stop.received[0]).name
            print(f"the trial was interrupted ({name}): no record written; it runs again next time", file=log_file)
            return 128 + stop.received[0]
        reason, explanation = _failure_explanation(status, oom_before, environ)
        print(f"the launcher exited with status {status} without a record: {reason} ({explanation})", file=log_file)
        mllog.touch()
        failure = launch_failure_record(spec, read_dataset_id(dataset_id), status, reason, explanation)
        write_record(failure, record, log_file)
    return 0
