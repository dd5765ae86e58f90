"""Contention evidence: injected /proc readings with known answers, a real quiet window and a real loaded one."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mlcampaign.measure.contention import ContentionWindow, Thresholds, assess, process_tree, snapshot

TICKS_PER_S = 100


def write_proc(root, cpus, procs_running=2, loadavg=1.0, processes=None, threads=None):
    """A fake /proc: ``cpus`` maps "cpu"/"cpu<N>" to its 8 tick columns (user nice system idle iowait irq softirq
    steal); ``processes`` maps pid -> (ppid, utime, stime, cutime, cstime, thread states);
    ``threads`` maps tid -> (name, involuntary switches) for /proc/self/task."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [f"{name} {' '.join(map(str, columns))} 0 0" for name, columns in cpus.items()]
    (root / "stat").write_text("\n".join([*lines, "intr 0", "ctxt 0", f"procs_running {procs_running}", ""]))
    (root / "loadavg").write_text(f"{loadavg} {loadavg} {loadavg} {procs_running}/100 999\n")
    for pid, (ppid, utime, stime, cutime, cstime, states) in (processes or {}).items():
        rest = f"{ppid} {pid} {pid} 0 -1 0 0 0 0 0 {utime} {stime} {cutime} {cstime} 20 0 {len(states)}"
        (root / str(pid) / "task").mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "stat").write_text(f"{pid} (python (worker)) {states[0]} {rest}\n")
        for offset, state in enumerate(states):
            (root / str(pid) / "task" / str(pid + offset)).mkdir(exist_ok=True)
            (root / str(pid) / "task" / str(pid + offset) / "stat").write_text(f"{pid} (python) {state} {rest}\n")
    for tid, (name, switches) in (threads or {}).items():
        (root / "self" / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
        status = f"Name:\t{name}\nState:\tR (running)\nnonvoluntary_ctxt_switches:\t{switches}\n"
        (root / "self" / "task" / str(tid) / "status").write_text(status)
    return root


def window(tmp_path, start, end, usable_cpus=frozenset({0, 1}), online_cpus=2, **peaks):
    """Snapshots of two fake /procs 10 s apart, assessed. ``start``/``end``: (write_proc kwargs, nivcsw)."""
    snapshots = []
    for name, (kwargs, switches), at in (("start", start, 0.0), ("end", end, 10.0)):
        proc = write_proc(tmp_path / name, **kwargs)
        snapshots.append(snapshot(100, proc, clock=lambda at=at: at, involuntary_switches=lambda s=switches: s))
    return assess(*snapshots, set(usable_cpus), online_cpus, ticks_per_s=TICKS_PER_S, **peaks)


def cpus(busy_per_cpu, steal_per_cpu=0, count=2):
    """Tick columns where each CPU was busy ``busy_per_cpu`` (user) and stolen ``steal_per_cpu`` ticks."""
    lines = {
        f"cpu{n}": [busy_per_cpu, 0, 0, 1000 - busy_per_cpu - steal_per_cpu, 0, 0, 0, steal_per_cpu]
        for n in range(count)
    }
    lines["cpu"] = [sum(column) for column in zip(*lines.values(), strict=True)]
    return lines


ZERO = {name: [0] * 8 for name in ("cpu", "cpu0", "cpu1")}
IDLE_PROCESS = {100: (1, 0, 0, 0, 0, "S")}


def quiet(tmp_path, **peaks):
    # 10 s on 2 CPUs = 2000 ticks of capacity: 1900 busy, 1880 of them the trial's.
    return window(
        tmp_path,
        ({"cpus": ZERO, "processes": IDLE_PROCESS, "threads": {100: ("python", 0)}}, 0),
        (
            {
                "cpus": cpus(950),
                "processes": {100: (1, 1700, 180, 0, 0, "RR")},
                "threads": {100: ("python", 40), 102: ("pt_intra", 7)},
            },
            100,
        ),
        **peaks,
    )


def test_a_quiet_window_is_not_contended(tmp_path):
    found = quiet(tmp_path)
    assert found.others_cpu_fraction == pytest.approx(0.01) and found.own_cpu_fraction == pytest.approx(0.94)
    assert found.steal_fraction == 0.0 and found.involuntary_switches_per_s == 10.0
    assert (found.contended, found.reasons) == (False, [])
    # Thread 102 started in the window: all its switches count.
    assert found.busiest_threads_involuntary_switches == [
        {"thread": "100 python", "involuntary_switches": 40},
        {"thread": "102 pt_intra", "involuntary_switches": 7},
    ]
    assert found.other_runnable_threads_end == 0  # 2 running, both the trial's
    json.dumps(dataclasses.asdict(found))


def test_other_processes_on_the_usable_cpus_are_contention(tmp_path):
    found = window(
        tmp_path,
        ({"cpus": ZERO, "processes": IDLE_PROCESS}, 0),
        ({"cpus": cpus(1000), "processes": {100: (1, 1000, 0, 0, 0, "R")}, "procs_running": 4}, 0),
    )
    assert found.others_cpu_fraction == pytest.approx(0.5) and found.other_runnable_threads_end == 3
    assert found.contended
    assert found.reasons == ["other processes used 50.0% of the usable CPUs' time (threshold 10%)"]


def test_the_trials_child_processes_are_its_own(tmp_path):
    tree = {100: (1, 900, 0, 0, 0, "R"), 101: (100, 1000, 0, 0, 0, "R"), 102: (1, 5, 0, 0, 0, "S")}
    found = window(
        tmp_path,
        ({"cpus": ZERO, "processes": {100: (1, 0, 0, 0, 0, "S"), 101: (100, 0, 0, 0, 0, "S")}}, 0),
        ({"cpus": cpus(950), "processes": tree}, 0),
    )
    assert found.others_cpu_fraction == 0.0 and not found.contended
    assert sorted(process_tree(100, tmp_path / "end")) == [100, 101]


def test_only_the_usable_cpus_count(tmp_path):
    busy_elsewhere = cpus(0)
    busy_elsewhere["cpu0"] = [1000, 0, 0, 0, 0, 0, 0, 0]  # another job's core
    found = window(
        tmp_path,
        ({"cpus": ZERO, "processes": IDLE_PROCESS}, 0),
        ({"cpus": busy_elsewhere, "processes": IDLE_PROCESS}, 0),
        usable_cpus={1},
    )
    assert found.others_cpu_fraction == 0.0 and found.usable_cpus == 1


def test_without_per_cpu_lines_the_machine_total_is_used(tmp_path):
    totals = {"cpu": cpus(1000)["cpu"]}
    found = window(
        tmp_path,
        ({"cpus": {"cpu": ZERO["cpu"]}, "processes": IDLE_PROCESS}, 0),
        ({"cpus": totals, "processes": IDLE_PROCESS}, 0),
    )
    assert found.others_cpu_fraction == pytest.approx(1.0)


def test_steal_time(tmp_path):
    found = window(
        tmp_path,
        ({"cpus": ZERO, "processes": IDLE_PROCESS}, 0),
        ({"cpus": cpus(900, steal_per_cpu=100), "processes": {100: (1, 1800, 0, 0, 0, "R")}}, 0),
    )
    assert found.steal_fraction == pytest.approx(0.1)
    assert found.reasons == ["steal time 10.0% of the CPUs' time (threshold 5%)"]


def test_load_average_above_the_online_cpus(tmp_path):
    found = window(
        tmp_path,
        ({"cpus": ZERO, "processes": IDLE_PROCESS, "loadavg": 1.2}, 0),
        ({"cpus": ZERO, "processes": IDLE_PROCESS, "loadavg": 4.0}, 0),
    )
    assert found.reasons == ["1-minute load average 4 above 2 online CPUs + 0.5"]
    on_a_big_node = window(
        tmp_path / "big",
        ({"cpus": ZERO, "processes": IDLE_PROCESS, "loadavg": 4.0}, 0),
        ({"cpus": ZERO, "processes": IDLE_PROCESS, "loadavg": 4.0}, 0),
        online_cpus=128,
    )
    assert not on_a_big_node.contended


def test_involuntary_context_switches(tmp_path):
    found = window(
        tmp_path,
        ({"cpus": ZERO, "processes": IDLE_PROCESS}, 1000),
        ({"cpus": ZERO, "processes": IDLE_PROCESS}, 6000),
    )
    assert found.involuntary_switches == 5000
    assert found.reasons == ["500 involuntary context switches per second (threshold 100)"]


def test_a_matmul_peak_drop_over_the_threshold(tmp_path):
    dropped = quiet(tmp_path / "a", peak_before_flops_per_s=3.5e11, peak_after_flops_per_s=2.5e11)
    assert dropped.matmul_peak_drop_fraction == pytest.approx(1 / 3.5)
    assert dropped.reasons == ["matmul peak fell 28.6% from 3.5e+11 to 2.5e+11 FLOP/s (threshold 20%)"]
    within_noise = quiet(tmp_path / "b", peak_before_flops_per_s=3.5e11, peak_after_flops_per_s=3.0e11)
    assert not within_noise.contended and within_noise.matmul_peak_drop_fraction == pytest.approx(0.5 / 3.5)
    assert quiet(tmp_path / "c").matmul_peak_drop_fraction is None


def test_thresholds_are_recorded_and_configurable(tmp_path):
    found = window(
        tmp_path,
        ({"cpus": ZERO, "processes": IDLE_PROCESS}, 0),
        ({"cpus": cpus(1000), "processes": {100: (1, 1000, 0, 0, 0, "R")}}, 0),
    )
    assert found.thresholds == dataclasses.asdict(Thresholds())
    relaxed = assess(
        snapshot(100, tmp_path / "start", clock=lambda: 0.0, involuntary_switches=lambda: 0),
        snapshot(100, tmp_path / "end", clock=lambda: 10.0, involuntary_switches=lambda: 0),
        {0, 1},
        2,
        thresholds=Thresholds(others_cpu_fraction=0.6),
        ticks_per_s=TICKS_PER_S,
    )
    assert not relaxed.contended and relaxed.thresholds["others_cpu_fraction"] == 0.6


def busy_window(seconds):
    contention = ContentionWindow().start()
    deadline, spins = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        spins += 1
    return contention.stop()


def test_a_real_window_on_this_machine():
    found = busy_window(0.5)
    json.dumps(dataclasses.asdict(found))
    assert found.window_s >= 0.5 and found.usable_cpus >= 1
    assert 0.0 <= found.others_cpu_fraction <= 1.1 and 0.0 < found.own_cpu_fraction <= 1.1
    assert 0.0 <= found.steal_fraction <= 1.0
    assert found.contended == bool(found.reasons)


def test_busy_processes_on_every_core_show_as_contention():
    """One hog per usable CPU (they inherit the affinity) keeps every usable CPU busy; the window's one
    thread gets at most its fair share, so others take at least about half of the capacity, whatever else the
    machine runs. Direction: up from a quiet baseline, or above 0.4 when the baseline was already busy."""
    baseline = busy_window(1.2)
    # Started through a shell that exits at once, so the hogs are not this process's descendants (whose
    # CPU time the window counts as its own).
    hog = f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"
    spawn = f"for _ in $(seq {len(os.sched_getaffinity(0))}); do {hog}; done"
    started = subprocess.run(["sh", "-c", spawn], capture_output=True, text=True, check=True)
    hogs = [int(pid) for pid in started.stdout.split()]
    try:
        time.sleep(0.2)
        loaded = busy_window(1.2)
    finally:
        for hog in hogs:
            os.kill(hog, signal.SIGKILL)
    assert loaded.others_cpu_fraction > min(baseline.others_cpu_fraction, 0.4)
    assert loaded.others_cpu_fraction > 0.4
    assert loaded.contended and any(reason.startswith("other processes used") for reason in loaded.reasons)
