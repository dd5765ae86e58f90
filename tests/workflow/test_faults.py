"""Fault tolerance: what HPC systems do to campaigns, and that nothing is lost or misreported.

- A job killed with SIGKILL mid-training (snakemake and all its children, as a lost node or a
  killed batch job does) is rerun by the next `snakemake` (rerun-incomplete), once its stale lock
  is removed; finished trials keep their record bytes and mtime, and no partial record is read.
- Ctrl-C (SIGINT), SIGTERM (`kill`, `timeout`, a batch system) and a closed terminal (SIGHUP) end a local
  campaign within seconds and leave no process of it running (the trial runs in a session of its own: its
  job passes the signal on), nor start a trial waiting for the machine's trial lock; a second Ctrl-C prints
  no traceback; the interrupted trial has no record and the next run trains it.
- Trials that diverge or run out of memory are recorded as failed with that reason, and the rest
  of the campaign (tables, figures, report) completes. A trial past its time limit: the trial
  script stops with a timeout record (below), the campaign passes the job's limit to it (below),
  tests/unit/trial/test_train.py and tests/unit/job/test_scheduler.py (Slurm's TIMEOUT) cover the rest; a local job's
  limit is at least a minute, too long to wait for in a campaign here.
- A corrupted dataset file is named before training, through the trial runner.
- Config values with shell metacharacters reach the trial verbatim and never a shell unquoted.
- Two campaigns in one working directory run concurrently without interfering; a second run of
  the same campaign is refused by Snakemake's lock.
(Malformed configs: tests/unit/plan/test_config_fuzz.py.)
"""

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from mlcampaign.analysis.outputs import TABLES
from mlcampaign.analysis.plots import FIGURES
from mlcampaign.data.manifest import DATA_DIR, ID_FILE, MANIFEST_FILE
from mlcampaign.data.staging import stage_into
from mlcampaign.job.launch import TRIAL_PROGRAM, trial_environment
from mlcampaign.job.supervisor import INTERRUPT_GRACE_S, LOCAL_LOCK
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.config_files import ConfigError
from mlcampaign.records.files import read_record
from mlcampaign.trial.protocol import await_main_record, classify_failure, run_trial

from conftest import REPO, latest_run, run_path, run_snakemake, snakemake_argv

LOCK_REFUSED = "Directory cannot be locked"


# -- unit level --------------------------------------------------------------------------------
def test_every_profile_keeps_going_and_reruns_incomplete_jobs():
    # Snakemake loads the workflow profile profiles/default beside every --profile, and its settings win.
    shared = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    assert shared["keep-going"] is True and shared["rerun-incomplete"] is True
    sites = sorted(path for path in (REPO / "profiles").glob("*/config.yaml") if path.parent.name != "default")
    assert len(sites) >= 5
    for path in sites:
        profile = yaml.safe_load(path.read_text())
        assert not {"keep-going", "rerun-incomplete", "rerun-triggers"} & set(profile), (
            f"{path} repeats a shared setting"
        )


def test_a_record_write_killed_before_its_rename_leaves_the_previous_record_whole(tmp_path):
    """SIGKILL after the new record's bytes are written but before the rename (the worst moment)."""
    record_path = tmp_path / "record.json"
    record_path.write_text('{"status": "ok"}\n')
    child = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from mlcampaign.records import files as record
        # Killed where a lost node would leave it: the temporary file complete, not yet renamed.
        record.os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        record.write_json_atomic({{"status": "failed", "padding": "x" * 100000}}, {str(record_path)!r})
        """
    )
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=120)
    assert result.returncode == -signal.SIGKILL
    assert json.loads(record_path.read_text()) == {"status": "ok"}
    (leftover,) = [path for path in tmp_path.iterdir() if path != record_path]
    assert leftover.name.startswith(".record.json.") and leftover.name.endswith(".tmp")


@pytest.mark.parametrize(
    "allocate",
    [
        lambda: torch.empty(1 << 50, dtype=torch.uint8),  # 1 PiB: torch's CPU allocator refuses it
        lambda: np.empty(1 << 50, dtype=np.uint8),  # numpy raises MemoryError
    ],
    ids=["torch", "numpy"],
)
def test_a_real_host_allocation_failure_is_out_of_memory(allocate):
    with pytest.raises(Exception) as error:  # whatever the library raises
        allocate()
    assert classify_failure(error.value) == "out_of_memory"


@pytest.mark.parametrize(
    ("key_path", "named"),
    [
        (("campaign",), "campaign.yaml: key 'campaign'"),
        (("systems", 0), "campaign.yaml: key 'systems.0'"),
        (("benchmarks", 0), "campaign.yaml: key 'benchmarks.0'"),
        (
            ("benchmark_overrides", "resnet50-digits", "dataset", "name"),
            "campaign.yaml benchmark_overrides.resnet50-digits: key 'dataset.name'",
        ),
    ],
)
@pytest.mark.parametrize("name", ["x; rm -rf ~", "$(touch pwned)", "`id`", "it's", "two words"])
def test_names_that_become_paths_refuse_shell_metacharacters(default_campaign, key_path, named, name):
    config = json.loads(json.dumps(default_campaign))
    node = config
    for key in key_path[:-1]:
        node = node.setdefault(key, {})
    node[key_path[-1]] = name
    with pytest.raises(ConfigError) as error:
        load_campaign(config, REPO / "config", source="campaign.yaml")
    assert f"{named}: value {name!r}" in str(error.value)


@pytest.fixture
def tiny_trial(tmp_path):
    """The spec of one tiny resnet50-synthetic trial, its dataset staged as the workflow stages it
    (data, manifest and id file side by side), the manifest, and the trial's paths (data,
    manifest, record, MLPerf log); run_trial takes the id file, record and MLPerf log."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config |= {"benchmarks": ["resnet50-synthetic"], "trials": 1, "benchmark_overrides": {"resnet50-synthetic": TINY}}
    campaign = load_campaign(config, REPO / "config")
    spec = campaign.trial_spec(next(campaign.trials()), "test-run", "local")
    staged = tmp_path / "dataset"
    manifest = stage_into(spec["benchmark"]["dataset"], staged)
    paths = [staged / DATA_DIR, staged / MANIFEST_FILE, tmp_path / "record.json", tmp_path / "mllog.txt"]
    return spec, manifest, paths


def run_tiny(spec, paths):
    """run_trial on the tiny trial's staged dataset (its id file beside data and manifest)."""
    data_dir, _, record_path, mllog_path = paths
    return run_trial(spec, data_dir.parent / ID_FILE, record_path, mllog_path)


def test_a_corrupted_dataset_file_of_unchanged_size_is_named_before_training(tiny_trial):
    """One flipped byte (same size, so only the sha256 can tell), through the trial runner."""
    spec, manifest, paths = tiny_trial
    data_dir, _, record_path, mllog_path = paths
    victim = data_dir / manifest["files"][len(manifest["files"]) // 2]["path"]
    content = bytearray(victim.read_bytes())
    content[len(content) // 2] ^= 0x01
    victim.write_bytes(bytes(content))
    record = run_tiny(spec, paths)
    assert record["status"] == "failed"
    assert record["failure"]["reason"] == "dataset"
    assert f"corrupted file {victim}" in record["failure"]["message"]
    assert record["metrics"]["samples_trained"] is None
    assert read_record(record_path) == record
    assert '"run_start"' not in mllog_path.read_text()  # training never started


def test_the_trial_script_stops_at_its_time_limit_with_a_timeout_record(tiny_trial):
    """mlcampaign/trial/__main__.py as the trial job's supervisor runs it, with a deadline that has passed
    (earlier than the trial's setup ends): it stops at its first step, and exits 1 so that its
    launcher stops other ranks (the supervisor then keeps the record: tests/unit/job/test_supervisor.py)."""
    spec, _, paths = tiny_trial
    data_dir, _, record_path, mllog_path = paths
    spec_file = record_path.with_name("spec.json")
    spec_file.write_text(json.dumps(spec))
    command = [sys.executable, *TRIAL_PROGRAM, "--spec-file", str(spec_file)]
    command += ["--dataset-id", str(data_dir.parent / ID_FILE)]
    command += ["--record", str(record_path), "--mllog", str(mllog_path)]
    trial = subprocess.run(
        [*command, "--deadline", str(time.time())],
        capture_output=True,
        text=True,
        timeout=300,
        env=trial_environment(os.environ),
    )
    assert trial.returncode == 1, trial.stderr[-3000:]
    record = read_record(record_path)
    assert (record["status"], record["failure"]["reason"]) == ("failed", "timeout")
    assert "stopped after 1 steps" in record["failure"]["message"]


# -- through the snakemake CLI -------------------------------------------------------------------
# A ResNet-50 on 16x16 synthetic images: a few seconds a trial on 2 cores.
TINY = {
    "dataset": {
        "name": "faults-synthetic",
        "source": {"options": {"num_classes": 2, "train_per_class": 16, "val_per_class": 4, "image_size": 16}},
    },
    "model": {"options": {"image_size": 16, "num_classes": 2}},
    "training": {"epochs_max": 2, "global_batch_size": 8, "warmup_steps": 1},
}
# Every job's address space is limited as a batch system limits a job's memory (`ulimit -v`);
# a normal trial peaks near 4 GiB of address space.
MEMORY_LIMIT_BYTES = 16 << 30
SHELL_BAIT = 'it\'s "quoted"; touch {sentinel} && $(touch {sentinel}) `touch {sentinel}` | tee {sentinel} #'


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


@pytest.fixture(scope="module")
def failing_campaign(tmp_path_factory):
    """One trial each that succeeds, diverges and runs out of memory, in a working directory and
    campaign file whose path, description and sources are full of shell metacharacters; run once."""
    workdir = tmp_path_factory.mktemp("faults") / "work dir 'q' $(touch PWNED)"
    workdir.mkdir()
    sentinel = workdir.parent / "PWNED"
    bait = SHELL_BAIT.format(sentinel=sentinel)
    config = {
        "campaign": "faults",
        "description": bait,
        "seed": 5,
        "trials": 1,
        "systems": ["local-cpu"],
        "benchmarks": ["resnet50-synthetic", "resnet50-digits", "cosmoflow"],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
        "benchmark_overrides": {
            "resnet50-synthetic": TINY | {"description": bait, "target": {"value": 0.5, "source": bait}},
            # NaN loss at the second step (ResNet-50 at lr 1e20 without warm-up).
            "resnet50-digits": {
                "model": {"options": {"image_size": 16}},
                "training": {"global_batch_size": 16, "optimizer": {"lr": 1.0e20}, "schedule": {"name": "constant"}},
            },
            # A first dense layer of 64 x 2^27 float32 weights (32 GiB): more than the job may allocate.
            "cosmoflow": {
                "model": {"options": {"input_size": 32, "base_filters": 4, "dropout": 0.0, "fc1_size": 1 << 27}},
                "dataset": {
                    "name": "faults-universes",
                    "source": {"options": {"seed": 0, "train_samples": 16, "val_samples": 4, "size": 32}},
                },
                "training": {"global_batch_size": 4},
            },
        },
    }
    configfile = workdir / "campaign $(touch PWNED).yaml"
    configfile.write_text(yaml.safe_dump(config))
    result = run_snakemake(workdir, configfile, "--config", f"description={bait}", preexec_fn=_limit_memory)
    assert result.returncode == 0, result.stderr[-5000:]
    return workdir, config, sentinel


def test_a_failed_rank_waits_for_rank_0s_record_and_no_longer_than_its_limit(tmp_path):
    """A failed rank's exit makes the launcher stop rank 0: it waits for rank 0's failure record first (a
    diverged 2-rank trial was once recorded as reason error: rank 0 was stopped before writing)."""
    record = tmp_path / "record.json"
    writer = threading.Timer(0.3, record.write_text, args=["{}"])
    writer.start()
    started = time.monotonic()
    assert await_main_record(record, wait_s=30.0)
    assert 0.25 <= time.monotonic() - started < 30.0
    writer.join()
    record.unlink()
    started = time.monotonic()
    assert not await_main_record(record, wait_s=0.4)
    assert time.monotonic() - started >= 0.4


@pytest.mark.integration
@pytest.mark.slow
def test_diverged_and_out_of_memory_trials_are_recorded_and_the_campaign_completes(failing_campaign):
    workdir, _, _ = failing_campaign
    results = latest_run(workdir, "faults")
    table = pd.read_csv(results / "trials.csv").set_index("trial.benchmark")
    assert table.loc["resnet50-synthetic", "status"] == "ok"
    assert table.loc["resnet50-digits", "status"] == "failed"
    assert table.loc["resnet50-digits", "failure.reason"] == "diverged"
    assert table.loc["cosmoflow", "status"] == "failed"
    assert table.loc["cosmoflow", "failure.reason"] == "out_of_memory"
    assert "can't allocate memory" in table.loc["cosmoflow", "failure.message"]
    # The rest of the campaign: every table, figure and the report.
    assert (results / "analysis" / "report.html").stat().st_size > 0
    for name in FIGURES:
        assert (results / "analysis" / "figures" / f"{name}.png").stat().st_size > 0
    for name in TABLES:
        assert (results / "analysis" / "tables" / f"{name}.csv").exists()


@pytest.mark.integration
@pytest.mark.slow
def test_shell_metacharacters_in_config_values_reach_the_trial_verbatim(failing_campaign):
    workdir, config, sentinel = failing_campaign
    # The bait's `touch` targets, and what the `$(touch PWNED)` in the directory and file names would create.
    assert not sentinel.exists() and not list(workdir.parent.rglob("PWNED"))
    results = latest_run(workdir, "faults")
    (record_path,) = (results / "trials" / "local-cpu" / "resnet50-synthetic").rglob("record.json")
    record = read_record(record_path)
    argv = record["provenance"]["command_line"]
    # The trial read its spec from the file its job wrote (no spec travels on a command line).
    spec_file = record_path.with_name("spec.json")
    # (relative to the job's working directory, the campaign's)
    assert (workdir / argv[argv.index("--spec-file") + 1]).resolve() == spec_file.resolve()
    spec = json.loads(spec_file.read_text())
    bait = config["description"]
    assert (spec["benchmark"]["description"], spec["benchmark"]["target"]["source"]) == (bait, bait)
    # The job's time limit reached the trial as its deadline (it stops itself before it: tests above).
    started = datetime.datetime.fromisoformat(record["provenance"]["started_utc"]).timestamp()
    assert 0 < float(argv[argv.index("--deadline") + 1]) - started < 60 * spec["system"]["trial_time_limit_minutes"]
    assert (results / "analysis" / "report.html").exists()


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children before grandchildren."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        kids = children.get(queue.pop(0), [])
        found += kids
        queue += kids
    return found


def _signal_tree(pid: int, signum: int) -> None:
    for target in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(target, signum)


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _campaign(name: str, trials: int, epochs: int) -> dict:
    return {
        "campaign": name,
        "seed": 9,
        "trials": trials,
        "systems": ["local-cpu"],
        "benchmarks": ["resnet50-synthetic"],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
        # An unreachable target: every trial trains all its epochs (time to be killed mid-training).
        "benchmark_overrides": {
            "resnet50-synthetic": TINY | {"training": TINY["training"] | {"epochs_max": epochs}, "target": {"value": 2}}
        },
    }


@pytest.mark.integration
@pytest.mark.slow
def test_a_campaign_killed_mid_training_reruns_only_the_killed_trial_and_others_are_unaffected(tmp_path):
    """Snakemake and every child killed with SIGKILL (a lost node, a killed batch job) while a trial
    trains; meanwhile the lock refuses a second run of the campaign. Then, with the stale lock
    removed, the campaign is resumed while another campaign runs in the same directory.

    Snakemake's lock is per file (snakemake.persistence.PersistenceBase.locked): a run is refused
    while another holds, as its outputs or inputs, a file that this run would write, or holds
    as outputs a file this run reads. Campaigns write only under results/<campaign>/, so two
    campaigns share a working directory concurrently; the datasets they share are inputs of
    both once staged (a dataset that both would still stage is an output of both: the second
    run is refused until the first has staged it). A run killed with SIGKILL leaves its lock
    behind: the next run is refused until `snakemake --unlock`.

    (A SIGKILL of the trial process alone is what the kernel's OOM killer does: the rule's
    fallback records it as failed with reason out_of_memory and nothing reruns; see
    mlcampaign.job.slurm_accounting.launch_failure_reason.)
    """
    killed_cfg, other_cfg = tmp_path / "killed.yaml", tmp_path / "other.yaml"
    # Trials run one at a time (each takes both cores): one finishes, the other is killed.
    killed_cfg.write_text(json.dumps(_campaign("killed", trials=2, epochs=3)))
    other_cfg.write_text(json.dumps(_campaign("other", trials=1, epochs=1)))
    trials_dir = tmp_path / run_path("killed", "r1", "trials")
    table = run_path("killed", "r1", "trials.csv")

    run = subprocess.Popen(
        snakemake_argv(tmp_path, killed_cfg, "--cores", "2", table, run="r1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def in_training():
        assert run.poll() is None, run.communicate()[0][-5000:]  # still running
        """Trial directories whose trial has started an epoch and has no record yet."""
        return [
            log.parent
            for log in trials_dir.rglob("mllog.txt")
            if not (log.parent / "record.json").exists() and '"epoch_start"' in log.read_text()
        ]

    try:
        _wait_for(
            lambda: list(trials_dir.rglob("record.json")) and in_training(), 600, "one record and a training trial"
        )
        _signal_tree(run.pid, signal.SIGSTOP)  # frozen: the lock is held, a trial is mid-training
        (victim,) = in_training()
        finished = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in trials_dir.rglob("record.json")}

        second = run_snakemake(tmp_path, killed_cfg, "--cores", "2", table, run="r1")
        assert second.returncode != 0 and LOCK_REFUSED in second.stdout + second.stderr

        _signal_tree(run.pid, signal.SIGKILL)
    finally:
        _signal_tree(run.pid, signal.SIGKILL)
        run.communicate(timeout=60)
    assert not (victim / "record.json").exists()
    # What a kill during write_json_atomic leaves: a partial temporary file, never record.json.
    (victim / ".record.json.4242.tmp").write_text('{"schema_version": "1.0", "status": "o')

    stale = run_snakemake(tmp_path, killed_cfg, "--cores", "2", table, run="r1")
    assert stale.returncode != 0 and LOCK_REFUSED in stale.stdout + stale.stderr
    assert run_snakemake(tmp_path, killed_cfg, "--unlock").returncode == 0

    resumed, other = (
        subprocess.Popen(
            snakemake_argv(tmp_path, configfile, "--cores", "2", run_path(name, "r1", "trials.csv"), run="r1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, configfile in (("killed", killed_cfg), ("other", other_cfg))
    )
    resumed_log, other_log = resumed.communicate(timeout=900)[0], other.communicate(timeout=900)[0]
    assert resumed.returncode == 0, resumed_log[-5000:]
    assert other.returncode == 0, other_log[-5000:]

    rerun = re.findall(r"output: (\S+/record\.json)", resumed_log)
    assert rerun == [str((victim / "record.json").relative_to(tmp_path))]  # the killed trial only
    for path, (content, mtime) in finished.items():
        assert (path.read_bytes(), path.stat().st_mtime_ns) == (content, mtime)
    for name, trials in (("killed", 2), ("other", 1)):
        records = sorted((tmp_path / run_path(name, "r1", "trials")).rglob("record.json"))
        assert len(records) == trials
        rows = pd.read_csv(tmp_path / run_path(name, "r1", "trials.csv"))
        assert sorted(rows["provenance.started_utc"]) == sorted(
            read_record(p)["provenance"]["started_utc"] for p in records
        )
        assert (rows["status"] == "ok").all() and (rows["trial.campaign"] == name).all()
    assert read_record(victim / "record.json")["status"] == "ok"


def _processes_in(workdir: Path) -> list[str]:
    """The live processes whose working directory is ``workdir`` (Snakemake's --directory, where its jobs
    and their trials run), as "pid: command line"."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")) == workdir.resolve():
                command_line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{proc.name}: {command_line}")
        except OSError:  # ended meanwhile, or a zombie
            continue
    return found


def _end_processes_in(workdir: Path) -> None:
    """Kill whatever still runs in ``workdir``, so that a failing test leaves no trial training."""
    for line in _processes_in(workdir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)


def _default_stop_signals() -> None:
    """In the child: the stop signals' default actions, as a terminal's foreground job has them, whatever
    this test run inherited (a CI job started in the background ignores SIGINT, and so would Snakemake)."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


@dataclasses.dataclass(frozen=True)
class Stop:
    """How a campaign is stopped: ``number`` sent to the whole foreground job (Ctrl-C at the terminal, a closed
    terminal, `timeout`, a batch system) or to Snakemake alone (`kill`); ``twice``: again while it cleans up
    (a second Ctrl-C)."""

    number: int
    whole_job: bool = True
    twice: bool = False

    def send(self, run: subprocess.Popen) -> None:
        (os.killpg if self.whole_job else os.kill)(run.pid, self.number)
        if self.twice:
            time.sleep(0.3)  # the trial takes seconds to end: Snakemake is cleaning up
            os.killpg(run.pid, self.number)


STOPS = {
    "Ctrl-C": Stop(signal.SIGINT),
    "Ctrl-C twice": Stop(signal.SIGINT, twice=True),
    "kill": Stop(signal.SIGTERM, whole_job=False),
    "timeout": Stop(signal.SIGTERM),
}
WAITING_STOPS = ["Ctrl-C", "kill", "timeout"]  # a second Ctrl-C finds nothing to clean up there


def _stop_when(
    tmp_path: Path,
    configfile: Path,
    stop: Stop,
    ready,
    what: str,
    after_stop=lambda: None,
    lock_dir: Path | None = None,
) -> tuple[subprocess.Popen, str, float]:
    """Run the campaign of ``configfile`` (run r1) as a terminal's foreground job, and once ``ready()`` (``what``)
    stop it (then call ``after_stop``). Returns Snakemake's process, its output and the seconds it took to end
    after the stop; kills what is left if it fails. Its trials take the trial lock of ``lock_dir`` (by default
    one of their own: they need not wait for other campaigns on this machine, their timings are not read)."""
    campaign = json.loads(configfile.read_text())["campaign"]
    run = subprocess.Popen(
        snakemake_argv(tmp_path, configfile, "--cores", "2", run_path(campaign, "r1", "trials.csv"), run="r1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a shell's foreground job
        preexec_fn=_default_stop_signals,
        env=os.environ | {"MLCAMPAIGN_LOCK_DIR": str(lock_dir or tmp_path)},
    )
    try:
        _wait_for(lambda: run.poll() is None and ready(), 600, what)
        stop.send(run)
        stopped = time.monotonic()
        after_stop()
        log = run.communicate(timeout=INTERRUPT_GRACE_S + 60)[0]
        return run, log, time.monotonic() - stopped
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        _end_processes_in(tmp_path)
        raise


def _interrupt_mid_training(tmp_path: Path, configfile: Path, stop: Stop) -> tuple[subprocess.Popen, str, float]:
    """``_stop_when`` a trial of the campaign trains."""
    trials_dir = tmp_path / run_path(json.loads(configfile.read_text())["campaign"], "r1", "trials")
    return _stop_when(
        tmp_path,
        configfile,
        stop,
        lambda: any('"epoch_start"' in log.read_text() for log in trials_dir.rglob("mllog.txt")),
        "a trial in training",
    )


def _snakemakes_own(output: str) -> str:
    """Snakemake's output without the job logs it shows (show-failed-logs: an interrupted trial's log may end
    in its KeyboardInterrupt)."""
    return re.sub(r"(?ms)^Logfile .*?:\n=+\n.*?^=+$", "", output)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS.values(), ids=STOPS.keys())
def test_a_stop_mid_training_records_no_failure_and_the_next_run_trains_that_trial(tmp_path, stop):
    """Ctrl-C at the terminal (SIGINT to the whole foreground process group: Snakemake and the trial job;
    the trial runs in a session of its own, and its job's supervisor passes the signal on) is an
    interruption, not a trial outcome: the campaign ends within seconds, no trial process outlives it
    (one would train on and write its record into the run the next invocation re-does), the trial writes
    no record, the partial analysis shows it "not run", and the next run trains it. SIGTERM, to Snakemake
    alone (`kill`) or to the whole job (`timeout`, a batch system), does the same (Snakemake alone would
    finish the running jobs first: mlcampaign.workflow.stopping); a second Ctrl-C while Snakemake cleans up
    prints no traceback."""
    configfile = tmp_path / "interrupted.yaml"
    # 300 epochs: minutes of training, so the interrupt lands mid-training on a fast machine too (30 were
    # over in 3 s on an Intel Xeon, and once the run finished before the signal reached it).
    configfile.write_text(json.dumps(_campaign("interrupted", trials=1, epochs=300)))
    trials_dir = tmp_path / run_path("interrupted", "r1", "trials")
    run, log, ended_after_s = _interrupt_mid_training(tmp_path, configfile, stop)
    left = _processes_in(tmp_path)
    _end_processes_in(tmp_path)
    assert not left, f"processes outlived the interrupted Snakemake: {left}"
    assert ended_after_s < INTERRUPT_GRACE_S + 30, log[-3000:]
    assert run.returncode != 0, log[-3000:]
    assert "Traceback" not in _snakemakes_own(log), log[-3000:]
    (trial_dir,) = {path.parent for path in trials_dir.rglob("mllog.txt")}
    assert not (trial_dir / "record.json").exists(), "an interrupted trial must not be recorded as an outcome"

    partial = run_snakemake(tmp_path, configfile, "--cores", "2", "partial_analysis", run="r1")
    assert partial.returncode == 0, partial.stderr[-3000:]
    summary = pd.read_csv(tmp_path / run_path("interrupted", "r1", "partial", "tables", "summary.csv"))
    assert summary.iloc[-1][["planned", "failed", "not_run"]].tolist() == [1, 0, 1]
    assert not (trial_dir / "record.json").exists()  # the partial analysis never starts a trial

    configfile.write_text(json.dumps(_campaign("interrupted", trials=1, epochs=1)))
    resumed = run_snakemake(tmp_path, configfile, "--cores", "2", run_path("interrupted", "r1", "trials.csv"), run="r1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_record(trial_dir / "record.json")["status"] == "ok"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("stop", [STOPS[name] for name in WAITING_STOPS], ids=WAITING_STOPS)
def test_a_trial_waiting_for_the_trial_lock_never_starts_after_a_stop(tmp_path, stop):
    """Another campaign's trial holds the machine's trial lock (here, the test holds it); this campaign's trial
    job waits for it. Stopped meanwhile, the campaign ends within seconds, and when the lock frees a moment
    later no trial starts (Snakemake, on SIGTERM, waited for the waiting job, which then trained)."""
    configfile = tmp_path / "waiting.yaml"
    configfile.write_text(json.dumps(_campaign("waiting", trials=1, epochs=1)))
    logs_dir = tmp_path / run_path("waiting", "r1", "logs", "trials")
    lock_path = tmp_path / "lock" / LOCAL_LOCK.name
    lock_path.parent.mkdir()
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("the test, as another campaign's trial\n")
        lock.flush()
        run, log, ended_after_s = _stop_when(
            tmp_path,
            configfile,
            stop,
            lambda: any("waiting for the machine's trial lock" in path.read_text() for path in logs_dir.rglob("*.log")),
            "the trial job waiting for the trial lock",
            after_stop=lambda: (time.sleep(1), fcntl.flock(lock, fcntl.LOCK_UN)),
            lock_dir=lock_path.parent,
        )
    time.sleep(2)  # what the lock let start would be running now
    left = _processes_in(tmp_path)
    _end_processes_in(tmp_path)
    assert not left, f"processes outlived the stopped Snakemake: {left}"
    assert ended_after_s < 30, log[-3000:]
    assert run.returncode != 0, log[-3000:]
    (job_log,) = logs_dir.rglob("*.log")
    assert "got the trial lock" not in job_log.read_text(), job_log.read_text()
    assert not list((tmp_path / run_path("waiting", "r1", "trials")).rglob("mllog.txt"))


@pytest.mark.integration
@pytest.mark.slow
def test_a_closed_terminal_ends_the_campaign_and_its_training_trial(tmp_path):
    """The terminal closes (SIGHUP to its foreground job): Snakemake ends at once, without its clean-up
    (its lock stays, as after a kill); the trial job's supervisor passes the signal on to the trial and
    ends with it within seconds, recording nothing; the next run, once unlocked, trains the trial."""
    configfile = tmp_path / "hung-up.yaml"
    configfile.write_text(json.dumps(_campaign("hung-up", trials=1, epochs=300)))
    trials_dir = tmp_path / run_path("hung-up", "r1", "trials")
    run, log, _ = _interrupt_mid_training(tmp_path, configfile, Stop(signal.SIGHUP))
    assert run.returncode == -signal.SIGHUP, log[-3000:]
    try:
        _wait_for(lambda: not _processes_in(tmp_path), INTERRUPT_GRACE_S + 30, "the trial job and its trial to end")
    finally:
        _end_processes_in(tmp_path)
    (trial_dir,) = {path.parent for path in trials_dir.rglob("mllog.txt")}
    assert not (trial_dir / "record.json").exists()
    job_log = next((tmp_path / run_path("hung-up", "r1", "logs", "trials")).rglob("*.log")).read_text()
    assert "the trial was interrupted (SIGHUP): no record written" in job_log

    assert run_snakemake(tmp_path, configfile, "--unlock").returncode == 0
    configfile.write_text(json.dumps(_campaign("hung-up", trials=1, epochs=1)))
    resumed = run_snakemake(tmp_path, configfile, "--cores", "2", run_path("hung-up", "r1", "trials.csv"), run="r1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_record(trial_dir / "record.json")["status"] == "ok"


@pytest.mark.integration
@pytest.mark.slow
def test_an_unreadable_record_is_named_skipped_by_the_partial_analysis_and_earlier_tables_are_kept(tmp_path):
    configfile = tmp_path / "campaign.yaml"
    configfile.write_text(json.dumps(_campaign("unreadable", trials=2, epochs=1)))
    table = tmp_path / run_path("unreadable", "r1", "trials.csv")
    first = run_snakemake(tmp_path, configfile, "--cores", "2", run_path("unreadable", "r1", "trials.csv"), run="r1")
    assert first.returncode == 0, first.stderr[-3000:]
    before = table.read_bytes()
    victim = sorted((tmp_path / run_path("unreadable", "r1", "trials")).rglob("record.json"))[0]
    victim.write_text('{"schema_version": "1.1", "status": "o')  # e.g. a file system that lost its tail

    again = run_snakemake(tmp_path, configfile, "--cores", "2", run_path("unreadable", "r1", "trials.csv"), run="r1")
    output = again.stdout + again.stderr
    assert again.returncode != 0
    assert str(victim.relative_to(tmp_path)) in output  # the job's log, shown by the profile, names it
    assert table.read_bytes() == before  # the failed table job lost nothing

    partial = run_snakemake(tmp_path, configfile, "--cores", "2", "partial_analysis", run="r1")
    assert partial.returncode == 0, partial.stderr[-3000:]
    planned = pd.read_csv(tmp_path / run_path("unreadable", "r1", "partial", "tables", "planned_trials.csv"))
    assert sorted(planned["status"]) == ["failed", "ok"]
    (message,) = planned.loc[planned["status"] == "failed", "failure_message"]
    assert message.startswith("unreadable record") and str(victim.name) in message


@pytest.mark.integration
@pytest.mark.slow
def test_rerun_failed_runs_the_failed_trials_again_and_keeps_their_failure_records(failing_campaign):
    """Last of this module: it re-runs the failing campaign's failed trials (the tests above read its
    first outcome)."""
    workdir, config, _ = failing_campaign
    (configfile,) = workdir.glob("campaign*.yaml")
    records = {path: read_record(path) for path in (latest_run(workdir, "faults") / "trials").rglob("record.json")}
    failed = sorted(path for path, record in records.items() if record["status"] == "failed")
    (ok,) = [path for path, record in records.items() if record["status"] == "ok"]
    ok_before = ok.read_bytes(), ok.stat().st_mtime_ns
    failure_before = {path: path.read_bytes() for path in failed}
    description = f"description={config['description']}"

    rerun = run_snakemake(workdir, configfile, "--config", description, "rerun_failed=True", preexec_fn=_limit_memory)
    assert rerun.returncode == 0, rerun.stderr[-5000:]
    ran = sorted(re.findall(r"output: (\S+/record\.json)", rerun.stdout + rerun.stderr))
    assert ran == sorted(str(path.relative_to(workdir)) for path in failed)  # the failed trials only
    assert (ok.read_bytes(), ok.stat().st_mtime_ns) == ok_before
    for path in failed:
        (kept,) = (path.parent / "superseded").iterdir()  # the first failure, kept in the run's history
        assert kept.read_bytes() == failure_before[path]
        assert read_record(path)["failure"]["reason"] == records[path]["failure"]["reason"]

    # Without the switch nothing is stale: the re-run does not repeat.
    plain = run_snakemake(workdir, configfile, "--config", description, "--dry-run")
    assert plain.returncode == 0 and "Nothing to be done" in plain.stdout + plain.stderr
