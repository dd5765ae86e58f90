"""Packing (docs/sites.md, "Packing"): the trials of one cell share one allocation, one after another.

Dry runs count the batch submissions of the published campaigns with and without packing; on the
real single-node Slurm (../shared/tools/slurm-localhost) a packed campaign's records equal an
unpacked one's, and a killed allocation keeps what it finished. The profiles pack with Snakemake's
job groups (profiles/*/config.yaml, "Packing"); snakemake-executor-plugin-slurm-sites keeps the
finished trials of a failed group.
"""

import json
import re
import subprocess
import time

import pytest
import yaml
from servers import slurm_queue

from mlcampaign.job import supervisor
from mlcampaign.records.files import read_record

from conftest import (
    REPO,
    job_counts,
    latest_run,
    repo_system,
    run_snakemake,
    slurm_campaign_config,
    snakemake_argv,
    workflow_copy,
)

PACKING_KEYS = ("groups", "group-components", "resources", "set-resource-scopes")


def batch_submissions(output: str) -> dict[str, list[int]]:
    """What a dry run would submit as batch jobs: every group job (with the trials in it) and every job
    of a batch rule outside a group, one trial or staging job each. Only staging and trials are batch
    jobs in this workflow (tests/site/test_slurm.py checks it on a real Slurm)."""
    groups = []
    for block in re.split(r"^(?:\[[^\]\n]*\] )?Group job \S+ \(jobs in lexicogr\. order\):\n", output, flags=re.M)[1:]:
        members = re.match(r"(?:(?:[ \t].*)?\n)*", block).group(0)  # the indented lines that follow
        groups.append(len(re.findall(r"^\s+rule trial:$", members, re.M)))
    alone = re.findall(r"^rule (trial|stage_dataset):$", output, re.M)
    return {"groups": groups, "trials": [1] * alone.count("trial"), "staging": [1] * alone.count("stage_dataset")}


@pytest.mark.integration
def test_hpcai500_at_cirrus_submits_one_allocation_per_cell(shipped_dry_run):
    output = shipped_dry_run("cirrus", "hpcai500", env={"CIRRUS_ACCOUNT": "ec42"})
    trials = job_counts(output)["trial"]
    submitted = batch_submissions(output)
    # Unpacked, every trial is an sbatch job of its own: 156. Packed: one per cell, its 3 seeded trials.
    assert trials == 156
    assert submitted["trials"] == [] and len(submitted["groups"]) == 52 and set(submitted["groups"]) == {3}
    allocations, staging = len(submitted["groups"]), len(submitted["staging"])
    print(f"hpcai500 at cirrus: {trials} trial jobs -> {allocations} allocations (+ {staging} staging jobs)")


@pytest.mark.integration
def test_epcc_2024_at_its_three_sites_submits_one_allocation_per_cell(shipped_dry_run):
    # Each site's part as the profiles' tests plan it (tests/unit/analysis/test_published.py): the same dry runs.
    trials, allocations = 0, 0
    for profile, config, env, cells in (
        ("archer2", "other_sites=skip", {"ARCHER2_ACCOUNT": "e123"}, 6),
        ("cirrus", "systems=[cirrus-v100]", {"CIRRUS_ACCOUNT": "ec42"}, 3),
        ("eidf", "systems=[eidf-a100]", {}, 3),
    ):
        output = shipped_dry_run(profile, "epcc-2024", config, env=env)
        submitted = batch_submissions(output)
        assert submitted["trials"] == [] and submitted["groups"] == [3] * cells, profile
        trials += job_counts(output)["trial"]
        allocations += len(submitted["groups"])
    assert (trials, allocations) == (36, 12)  # ARCHER2 CPU and MI210, Cirrus, EIDF: 3 benchmarks x 3 trials each


def test_every_site_profile_that_packs_packs_alike():
    """One packing setting, copied in each profile that packs: its four keys agree (the group name,
    its components, and one trial at a time) with the trial rule's trial_slots resource."""
    packing = {}
    for profile in ("archer2", "cirrus", "eidf", "slurm-localhost-packed"):
        settings = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
        packing[profile] = {key: settings[key] for key in PACKING_KEYS}
    first = packing["archer2"]
    assert all(settings == first for settings in packing.values()), packing
    (group,) = first["groups"]
    rule, template = group.split("=")
    assert rule == "trial" and set(re.findall(r"{(\w+)}", template)) == {"system", "benchmark", "cell"}
    assert first["group-components"] == [f"{template}=100000"]  # every trial of a cell (MAX_PLANNED_TRIALS)
    assert first["resources"] == ["trial_slots=1"] and first["set-resource-scopes"] == ["trial_slots=local"]
    assert "trial_slots=1" in (REPO / "rules" / "trials.smk").read_text()
    for profile in ("local", "slurm-localhost"):
        assert not set(PACKING_KEYS) & set(yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text()))


@pytest.mark.integration
def test_more_than_one_packed_trial_at_a_time_is_refused(tmp_path, write_config):
    config = {
        "campaign": "slots",
        "seed": 1,
        "trials": 2,
        "systems": ["slurm-localhost"],
        "benchmarks": ["resnet50-digits"],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
    }
    result = run_snakemake(
        tmp_path, write_config(config), "--dry-run", "--resources", "trial_slots=2", profile="slurm-localhost-packed"
    )
    assert result.returncode != 0
    assert "--resources trial_slots=2: packed trials run one after another" in result.stdout + result.stderr


# -- the deadline of a trial in a packed allocation -------------------------------------------------
def test_a_packed_trial_has_its_own_time_limit_within_the_allocations_end():
    now = time.time()
    margin = supervisor.deadline_margin_s(10)
    # The third trial of an allocation of three 10-minute trials, started 20 minutes in.
    packed = {"SLURM_JOB_START_TIME": str(int(now - 1200)), "SLURM_JOB_END_TIME": str(int(now + 600))}
    assert supervisor.trial_deadline(10, packed).at == pytest.approx(now + 600 - margin, abs=2)
    # An allocation that has less left than the trial's limit (earlier trials ran long): its end wins.
    late = packed | {"SLURM_JOB_END_TIME": str(int(now + 300))}
    assert supervisor.trial_deadline(10, late).at == pytest.approx(now + 300 - margin, abs=1)
    # A job of one trial: its end is its start plus the limit, as before packing.
    single = {"SLURM_JOB_START_TIME": str(int(now - 30)), "SLURM_JOB_END_TIME": str(int(now - 30 + 600))}
    assert supervisor.trial_deadline(10, single).at == pytest.approx(now - 30 + 600 - margin, abs=1)
    # The EIDF executor's pod clock (snakemake-executor-plugin-eidf: MLCAMPAIGN_JOB_START / _END).
    pod = {"MLCAMPAIGN_JOB_START": str(int(now - 1200)), "MLCAMPAIGN_JOB_END": str(int(now + 600))}
    assert supervisor.trial_deadline(10, pod).at == pytest.approx(now + 600 - margin, abs=2)
    assert supervisor.trial_deadline(None, packed).at is None


# -- on a real Slurm --------------------------------------------------------------------------------
def sacct_allocations(started: str, workdir) -> dict[str, dict]:
    """Batch jobs since ``started`` of the campaign in ``workdir`` (their working directory: other tests' jobs
    may have run meanwhile): job id -> comment (the Snakemake rule or group), state, time limit."""
    result = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-S", started, "--format=JobID,Comment,State,TimelimitRaw,WorkDir"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line.split("|") for line in result.stdout.strip().splitlines()]
    return {
        job: {"comment": comment, "state": state, "limit_min": int(limit)}
        for job, comment, state, limit, directory in rows
        if directory == str(workdir)
    }


# What differs between two runs of the same trials by design: when and where they ran (timings,
# throughput, hosts, job ids, the run), what the machine measured besides the trial's result
# (roofline, energy, contention, memory peaks, whether the measured roof exceeded the system file's
# nominal peak) and the rest of the provenance.
VARYING_KEYS = {"provenance", "run", "roofline", "energy", "contention"}
VARYING_SUFFIXES = ("_s", "_per_s", "_utc", "_bytes")
VARYING_NAMES = {
    "fraction_of_peak",
    "achieved_fraction",
    "peak_flops_per_s",
    "peak_basis",
    "peak_source",
    "nominal_peak_exceeded",
    "canaries",
}


def content(record):
    """A record without what varies between runs of the same trial (VARYING_*)."""
    if isinstance(record, dict):
        return {
            key: content(value)
            for key, value in record.items()
            if key not in VARYING_KEYS and key not in VARYING_NAMES and not key.endswith(VARYING_SUFFIXES)
        }
    if isinstance(record, list):
        return [content(item) for item in record]
    return record


def run_records(workdir) -> dict[str, dict]:
    results = latest_run(workdir, json.loads((workdir / "campaign.yaml").read_text())["campaign"])
    return {
        str(path.parent.relative_to(results / "trials")): read_record(path)
        for path in results.glob("trials/*/*/*/*/record.json")
    }


@pytest.mark.integration
def test_a_packed_campaign_records_what_an_unpacked_one_does(slurm_campaign, tmp_path):
    """The session's campaign on Slurm, unpacked (conftest.slurm_campaign), and the same campaign packed."""
    unpacked_dir, unpacked_started = slurm_campaign
    workdir = tmp_path / "slurm-localhost-packed"
    workdir.mkdir()
    (workdir / "campaign.yaml").write_text((unpacked_dir / "campaign.yaml").read_text())
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = run_snakemake(workdir, workdir / "campaign.yaml", profile="slurm-localhost-packed", timeout=1500, run="r1")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    records = {"slurm-localhost": run_records(unpacked_dir), "slurm-localhost-packed": run_records(workdir)}
    allocations = {
        profile: {job: row for job, row in sacct_allocations(since, directory).items() if "trial" in row["comment"]}
        for profile, since, directory in (
            ("slurm-localhost", unpacked_started, unpacked_dir),
            ("slurm-localhost-packed", started, workdir),
        )
    }
    unpacked, packed = records["slurm-localhost"], records["slurm-localhost-packed"]
    assert set(packed) == set(unpacked) and len(packed) == 4
    assert all(record["status"] == "ok" for record in packed.values())
    for trial, record in packed.items():
        assert content(record) == content(unpacked[trial]), trial

    # Unpacked: a job per trial. Packed: a job per cell, its time limit the sum of its trials' (2 x 60 min).
    assert len(allocations["slurm-localhost"]) == 4
    assert len(allocations["slurm-localhost-packed"]) == 2
    for row in allocations["slurm-localhost-packed"].values():
        assert row["state"] == "COMPLETED" and row["limit_min"] == 2 * 60
    # The trials of a cell ran in their cell's allocation.
    job_of = {trial: record["provenance"]["scheduler_job_id"] for trial, record in packed.items()}
    for cell in {trial.split("/")[2] for trial in packed}:
        assert len({job for trial, job in job_of.items() if trial.split("/")[2] == cell}) == 1
    assert set(job_of.values()) == set(allocations["slurm-localhost-packed"])


@pytest.mark.integration
def test_a_killed_allocation_keeps_its_finished_trials_and_runs_the_rest_next_time(slurm, tmp_path):
    """Three trials in one allocation: the first one's launch fails (its set-up exits 3: a failure
    record, and the allocation goes on), the second finishes, the third hangs in its set-up until the
    allocation is cancelled. Both records stay; the next invocation runs the third alone."""
    first, second, release = (tmp_path / name for name in ("first-launch", "second-launch", "release"))
    setup = (
        f"if [ ! -e {first} ]; then touch {first}; exit 3; fi; "
        f"if [ -e {second} ] && [ ! -e {release} ]; then sleep 900; fi; touch {second}"
    )
    system = repo_system("slurm-localhost", environment={"setup": [setup]})
    snakefile = workflow_copy(tmp_path / "workflow", {"slurm-localhost": system})
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "campaign.yaml").write_text(json.dumps(slurm_campaign_config("killed-it", trials=3, scales=["1x1"])))
    packed = {"profile": "slurm-localhost-packed", "run": "r1"}
    arguments = (workdir, workdir / "campaign.yaml", "--snakefile", str(snakefile))
    command = ["timeout", "-s", "INT", "1500", *snakemake_argv(*arguments, **packed)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    trials_dir = workdir / "results" / "killed-it" / "runs" / "r1" / "trials"
    try:
        deadline = time.time() + 1200
        # Two records, and the third trial started (its spec written): it hangs in its set-up.
        while (
            len(list(trials_dir.glob("*/*/*/*/record.json"))) < 2 or len(list(trials_dir.glob("*/*/*/*/spec.json"))) < 3
        ):
            assert process.poll() is None, process.stdout.read()[-4000:]
            assert time.time() < deadline, "the allocation did not finish two trials in time"
            time.sleep(2)
        # squeue, not sacct: the controller knows the job at once, accounting may lag behind.
        (allocation,) = [
            job["job_id"] for job in slurm_queue() if job["workdir"] == str(workdir) and "trial" in job["comment"]
        ]
        subprocess.run(["scancel", allocation], check=True)
        output, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0  # the campaign is not complete
    assert "of the group finished; their outputs are kept" in output, output[-4000:]
    release.touch()

    kept = {path.parent.name: path for path in trials_dir.glob("*/*/*/*/record.json")}
    assert len(kept) == 2, output[-4000:]
    statuses = sorted(read_record(path)["status"] for path in kept.values())
    assert statuses == ["failed", "ok"]
    failed = next(read_record(path) for path in kept.values() if read_record(path)["status"] == "failed")
    assert failed["failure"]["reason"] == "error"  # the set-up's exit, recorded; the next trial ran
    for path in kept.values():
        assert (path.parent / "mllog.txt").exists()
    before = {name: path.read_bytes() for name, path in kept.items()}

    # The next invocation runs the trial that was cut off, and only it; the campaign completes.
    dry = run_snakemake(*arguments, "--dry-run", **packed)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert job_counts(dry.stdout)["trial"] == 1
    again = run_snakemake(*arguments, timeout=1500, **packed)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    records = {path.parent.name: path for path in trials_dir.glob("*/*/*/*/record.json")}
    assert len(records) == 3
    assert {name: records[name].read_bytes() for name in before} == before
