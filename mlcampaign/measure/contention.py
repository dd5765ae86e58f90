"""Evidence that a timed measurement was disturbed by something else running on the machine.

``ContentionWindow`` snapshots the machine when the timed steps start and again when they stop;
``assess`` turns the two snapshots into evidence and a verdict. All from Linux ``/proc`` (any other root
can be passed, for tests):

- ``steal_fraction``: the ``steal`` column of ``/proc/stat`` over all columns, for the CPUs this process
  may use (the per-CPU lines of its affinity): time the hypervisor gave this VM's CPUs to someone else.
- ``others_cpu_fraction``: busy time of those CPUs (user, nice, system, irq, softirq) minus the CPU time
  of the trial's own process tree (``/proc/<pid>/stat`` utime + stime + cutime + cstime of ``root_pid`` and
  its live descendants, e.g. DataLoader workers), over their capacity (window x usable CPUs). The most
  direct evidence: CPU time other processes took on the cores the trial was meant to have. Resolution:
  ticks of 1/``SC_CLK_TCK`` s (10 ms) per CPU, so windows under ~1 s are coarse.
- ``own_cpu_fraction``: the trial's CPU time over the same capacity.
- ``involuntary_switches`` / ``involuntary_switches_per_s``: ``getrusage(RUSAGE_SELF).ru_nivcsw`` over the
  window (the process's threads were preempted while runnable), and the busiest eight threads from
  ``/proc/self/task/<tid>/status`` (a thread started in the window counts from its start).
- ``loadavg_1min_start`` / ``_end``: ``/proc/loadavg``; a one-minute average lags a short window.
- ``other_runnable_threads_start`` / ``_end``: ``procs_running`` of ``/proc/stat`` minus the trial's own
  threads in state R, at the two instants (a spot reading, reported, not judged).

Verdict (``Thresholds``; each reason names the value and the threshold):

- others' CPU time above 10 % of the usable CPUs: a CPU-bound trial loses about that much throughput,
  more than the few-percent run-to-run noise of an idle machine;
- steal above 5 %: the same loss caused by the hypervisor, a common alarm level for cloud VMs;
- load average above online CPUs + 0.5: more runnable threads than CPUs on the whole machine. Online
  CPUs, not usable ones, because the load average counts the whole machine, and on a shared node a
  load beyond the trial's cores says nothing about them (the others' CPU rule covers those);
- more than 50 involuntary switches per second per usable CPU: a thread alone on its CPU is
  preempted a few times a second (kernel work), a thread sharing it every scheduler slice (milliseconds).
  Weaker evidence: the rate also depends on the scheduler's slice length;
- a matmul peak after training more than 20 % below the one before (``peak_before_flops_per_s`` /
  ``peak_after_flops_per_s``, FLOP/s, measured by the caller with ``mlcampaign.measure.roofline``): the machine
  changed under the trial (throttling, contention) by more than repeat-to-repeat matmul noise.

Multi-process trials: pass the PID of the ranks' common parent as ``root_pid`` (torchrun's agent:
``os.getppid()`` in a rank), else the sibling ranks count as "others"; ranks bound to disjoint cores
(srun) need nothing, the others' figure only looks at this process's usable CPUs.

Limits: a child reaped during the window adds its whole lifetime's CPU time to the trial's (its parent's
cutime), which can hide others' time up to that amount; the involuntary-switch threshold is a reasoned
figure, not one calibrated on an idle machine.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Above these a window is contended: fractions of CPU time (0-1), switches per second per usable CPU,
    and the fractional fall of the matmul peak (FLOP/s) from before to after."""

    others_cpu_fraction: float = 0.10
    steal_fraction: float = 0.05
    loadavg_above_online_cpus: float = 0.5
    involuntary_switches_per_s_per_cpu: float = 50.0
    matmul_peak_drop_fraction: float = 0.20


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The machine at one instant, as far as contention goes. CPU times in ticks, the rest as named."""

    time_s: float
    cpu_ticks: dict[str, list[int]]  # /proc/stat "cpu<N>" (and "cpu") -> its columns
    procs_running: int | None
    loadavg_1min: float
    own_cpu_ticks: int
    own_running_threads: int
    involuntary_switches: int
    thread_involuntary_switches: dict[str, int]  # "<tid> <name>" -> nonvoluntary_ctxt_switches


@dataclasses.dataclass(frozen=True)
class Contention:
    """Evidence over one window and the verdict; JSON-serialisable with ``dataclasses.asdict``."""

    window_s: float
    usable_cpus: int
    online_cpus: int
    steal_fraction: float | None
    others_cpu_fraction: float | None
    own_cpu_fraction: float | None
    involuntary_switches: int
    involuntary_switches_per_s: float | None
    busiest_threads_involuntary_switches: list[dict]  # {thread: '<tid> <name>', involuntary_switches}
    loadavg_1min_start: float
    loadavg_1min_end: float
    other_runnable_threads_start: int | None
    other_runnable_threads_end: int | None
    matmul_peak_before_flops_per_s: float | None
    matmul_peak_after_flops_per_s: float | None
    matmul_peak_drop_fraction: float | None
    contended: bool
    reasons: list[str]
    thresholds: dict[str, float]


# /proc/stat cpu columns: user nice system idle iowait irq softirq steal guest guest_nice. guest time is
# already inside user (and guest_nice inside nice), so it is not added again.
_BUSY_COLUMNS = (0, 1, 2, 5, 6)
_STEAL_COLUMN = 7
_TOTAL_COLUMNS = range(8)


def _read_proc_stat(proc: Path) -> tuple[dict[str, list[int]], int | None]:
    cpu_ticks, procs_running = {}, None
    for line in (proc / "stat").read_text().splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu"):
            columns = [int(value) for value in rest.split()]
            cpu_ticks[name] = columns + [0] * (10 - len(columns))  # old kernels have fewer columns
        elif name == "procs_running":
            procs_running = int(rest)
    return cpu_ticks, procs_running


def _stat_fields(path: Path) -> list[str] | None:
    """The fields after ``(comm)`` of a /proc/<pid>/stat (comm may hold spaces and parentheses)."""
    try:
        text = path.read_text()
    except OSError:
        return None  # the process or thread ended meanwhile
    return text[text.rfind(")") + 2 :].split()


def process_tree(root_pid: int, proc: Path = PROC) -> list[int]:
    """``root_pid`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry / "stat")
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, pending = [], [root_pid]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, []))
    return tree


def _tree_cpu(root_pid: int, proc: Path) -> tuple[int, int]:
    """(utime + stime + cutime + cstime ticks, threads in state R) of the process tree."""
    ticks, running = 0, 0
    for pid in process_tree(root_pid, proc):
        fields = _stat_fields(proc / str(pid) / "stat")
        if fields is None:
            continue
        ticks += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
        for task in (proc / str(pid) / "task").glob("*/stat"):
            task_fields = _stat_fields(task)
            running += task_fields is not None and task_fields[0] == "R"
    return ticks, running


def _thread_switches(proc: Path) -> dict[str, int]:
    switches = {}
    tasks = proc / "self" / "task"
    for task in tasks.iterdir() if tasks.is_dir() else ():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if "nonvoluntary_ctxt_switches" in fields:
            switches[f"{task.name} {fields.get('Name', '').strip()}"] = int(fields["nonvoluntary_ctxt_switches"])
    return switches


def snapshot(
    root_pid: int | None = None,
    proc: Path = PROC,
    clock: Callable[[], float] = time.monotonic,
    involuntary_switches: Callable[[], int] = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw,
) -> Snapshot:
    cpu_ticks, procs_running = _read_proc_stat(proc)
    own_ticks, own_running = _tree_cpu(os.getpid() if root_pid is None else root_pid, proc)
    return Snapshot(
        time_s=clock(),
        cpu_ticks=cpu_ticks,
        procs_running=procs_running,
        loadavg_1min=float((proc / "loadavg").read_text().split()[0]),
        own_cpu_ticks=own_ticks,
        own_running_threads=own_running,
        involuntary_switches=involuntary_switches(),
        thread_involuntary_switches=_thread_switches(proc),
    )


def assess(
    start: Snapshot,
    end: Snapshot,
    usable_cpus: set[int],
    online_cpus: int,
    peak_before_flops_per_s: float | None = None,
    peak_after_flops_per_s: float | None = None,
    thresholds: Thresholds = Thresholds(),
    ticks_per_s: int | None = None,
) -> Contention:
    """Evidence of contention between two snapshots and whether it crosses ``thresholds``."""
    ticks_per_s = os.sysconf("SC_CLK_TCK") if ticks_per_s is None else ticks_per_s
    window_s = end.time_s - start.time_s
    names = [f"cpu{cpu}" for cpu in sorted(usable_cpus)]
    if not all(name in start.cpu_ticks and name in end.cpu_ticks for name in names):
        names = ["cpu"]  # no per-CPU lines: the machine's total
    delta = [sum(end.cpu_ticks[name][column] - start.cpu_ticks[name][column] for name in names) for column in range(10)]
    total = sum(delta[column] for column in _TOTAL_COLUMNS)
    busy = sum(delta[column] for column in _BUSY_COLUMNS)
    capacity_ticks = window_s * ticks_per_s * len(usable_cpus)
    own_ticks = end.own_cpu_ticks - start.own_cpu_ticks
    switches = end.involuntary_switches - start.involuntary_switches
    drop = None
    if peak_before_flops_per_s and peak_after_flops_per_s is not None:
        drop = (peak_before_flops_per_s - peak_after_flops_per_s) / peak_before_flops_per_s

    def others_runnable(snap: Snapshot) -> int | None:
        return None if snap.procs_running is None else max(0, snap.procs_running - snap.own_running_threads)

    evidence = Contention(
        window_s=window_s,
        usable_cpus=len(usable_cpus),
        online_cpus=online_cpus,
        steal_fraction=delta[_STEAL_COLUMN] / total if total > 0 else None,
        others_cpu_fraction=max(0.0, (busy - own_ticks) / capacity_ticks) if capacity_ticks > 0 else None,
        own_cpu_fraction=own_ticks / capacity_ticks if capacity_ticks > 0 else None,
        involuntary_switches=switches,
        involuntary_switches_per_s=switches / window_s if window_s > 0 else None,
        busiest_threads_involuntary_switches=_busiest_threads(start, end),
        loadavg_1min_start=start.loadavg_1min,
        loadavg_1min_end=end.loadavg_1min,
        other_runnable_threads_start=others_runnable(start),
        other_runnable_threads_end=others_runnable(end),
        matmul_peak_before_flops_per_s=peak_before_flops_per_s,
        matmul_peak_after_flops_per_s=peak_after_flops_per_s,
        matmul_peak_drop_fraction=drop,
        contended=False,
        reasons=[],
        thresholds=dataclasses.asdict(thresholds),
    )
    reasons = _reasons(evidence, thresholds)
    return dataclasses.replace(evidence, contended=bool(reasons), reasons=reasons)


def _busiest_threads(start: Snapshot, end: Snapshot) -> list[dict]:
    """The eight threads with the most involuntary switches over the window, most first."""
    # A thread started during the window (torch's intra-op pool on first use) had all its switches in it.
    by_thread = {
        thread: count - start.thread_involuntary_switches.get(thread, 0)
        for thread, count in end.thread_involuntary_switches.items()
        if count > start.thread_involuntary_switches.get(thread, 0)
    }
    # A list, not a mapping by thread: thread ids differ from trial to trial, and a record's keys must not.
    return [
        {"thread": thread, "involuntary_switches": count}
        for thread, count in sorted(by_thread.items(), key=lambda item: -item[1])[:8]
    ]


def _reasons(evidence: Contention, thresholds: Thresholds) -> list[str]:
    """Each piece of ``evidence`` that crosses its threshold, naming the value and the threshold."""
    reasons = []
    others, steal = evidence.others_cpu_fraction, evidence.steal_fraction
    if others is not None and others > thresholds.others_cpu_fraction:
        limit = thresholds.others_cpu_fraction
        reasons.append(f"other processes used {others:.1%} of the usable CPUs' time (threshold {limit:.0%})")
    if steal is not None and steal > thresholds.steal_fraction:
        reasons.append(f"steal time {steal:.1%} of the CPUs' time (threshold {thresholds.steal_fraction:.0%})")
    online_cpus = evidence.online_cpus
    load_limit = online_cpus + thresholds.loadavg_above_online_cpus
    load = max(evidence.loadavg_1min_start, evidence.loadavg_1min_end)
    if load > load_limit:
        reasons.append(
            f"1-minute load average {load:g} above {online_cpus} online CPUs + {thresholds.loadavg_above_online_cpus:g}"
        )
    switches_per_s = evidence.involuntary_switches_per_s
    switch_limit = thresholds.involuntary_switches_per_s_per_cpu * evidence.usable_cpus
    if switches_per_s is not None and switches_per_s > switch_limit:
        reasons.append(f"{switches_per_s:.0f} involuntary context switches per second (threshold {switch_limit:g})")
    drop, before, after = (
        evidence.matmul_peak_drop_fraction,
        evidence.matmul_peak_before_flops_per_s,
        evidence.matmul_peak_after_flops_per_s,
    )
    if drop is not None and drop > thresholds.matmul_peak_drop_fraction:
        reasons.append(
            f"matmul peak fell {drop:.1%} from {before:.4g} to {after:.4g} FLOP/s "
            f"(threshold {thresholds.matmul_peak_drop_fraction:.0%})"
        )
    return reasons


class ContentionWindow:
    """``start()`` before the timed steps, ``stop()`` after them (with the matmul peaks, if measured)."""

    def __init__(self, root_pid: int | None = None, proc: Path = PROC, thresholds: Thresholds = Thresholds()):
        self._root_pid, self._proc, self._thresholds = root_pid, proc, thresholds
        self._start: Snapshot | None = None

    def start(self) -> ContentionWindow:
        self._start = snapshot(self._root_pid, self._proc)
        return self

    def stop(
        self, peak_before_flops_per_s: float | None = None, peak_after_flops_per_s: float | None = None
    ) -> Contention:
        if self._start is None:
            raise RuntimeError("ContentionWindow.stop() before start()")
        end = snapshot(self._root_pid, self._proc)
        return assess(
            self._start,
            end,
            usable_cpus=os.sched_getaffinity(0),
            online_cpus=os.cpu_count() or len(os.sched_getaffinity(0)),
            peak_before_flops_per_s=peak_before_flops_per_s,
            peak_after_flops_per_s=peak_after_flops_per_s,
            thresholds=self._thresholds,
        )
