"""A run as an MLPerf HPC submission folder (mlcampaign.records.mlperf.submission, ``mlcampaign export-mlperf``),
from trial logs the project's MLPerfLog writes: written where package_checker accepts it, refused naming the
rule otherwise (a relaxed target, too few or too many runs, no HPC rules, no org), nothing written then.
The exports of a real campaign run, through mlperf-logging's command lines: tests/workflow/test_mlperf_workflow.py."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_mlperf_trial_log import CPU_SIZED, FULL, reaching, write_trial_log

from mlcampaign.records.mlperf.submission import INCOMPLETE_FILE, SubmissionRefused, export_submission, package_check

MLCAMPAIGN = [sys.executable, "-m", "mlcampaign"]
PROVENANCE = {"cpu_model": "Test CPU", "python": "3.11.7", "platform": "Linux", "packages": {"torch": "2.14.1"}}


def run_folder(root: Path, spec: dict, qualities: list[list[float]], org: str | None = "EPCC") -> Path:
    """A run folder (results/<campaign>/runs/<run>) of one cell whose trial i logs ``qualities[i]``."""
    run = root / "results" / "test" / "runs" / "r1"
    system, benchmark = spec["system"], spec["benchmark"]
    manifest = {
        "run_id": "r1",
        "campaign": "test",
        "site": "local",
        "started_utc": "2026-12-01T08:00:00+00:00",
        "systems": {system["name"]: system},
        "benchmarks": {benchmark["name"]: benchmark},
        "workflow_commit": "0123abc",
    }
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps(manifest))
    for index, trial_qualities in enumerate(qualities):
        trial_spec = copy.deepcopy(spec)
        trial_spec["trial"] |= {"trial": index, "seed": 1000 + index}
        trial_spec["mlperf"] = {key: value for key, value in spec["mlperf"].items() if key != "org" or org}
        trial = trial_spec["trial"]
        folder = run / "trials" / trial["system"] / trial["benchmark"] / trial["cell"] / f"trial{index}-rep0"
        folder.mkdir(parents=True)
        write_trial_log(folder / "mllog.txt", trial_spec, trial_qualities)
        (folder / "record.json").write_text(json.dumps({"trial": trial, "provenance": PROVENANCE}))
    return run


def test_five_deepcam_runs_reaching_the_target_are_a_submission_package_checker_accepts(tmp_path):
    spec = CPU_SIZED["deepcam"]
    run = run_folder(tmp_path, spec, [reaching(spec)] * 5)
    written = export_submission(run, tmp_path / "out")
    folder = tmp_path / "out" / "EPCC"
    assert written.folder == folder and not written.incomplete
    logs = written.results[("local-cpu", "deepcam")]
    assert logs == [folder / "results/local-cpu/strong/deepcam" / f"result_{i}.txt" for i in range(5)]
    for index, log in enumerate(logs):  # the trials' own logs, byte for byte
        assert log.read_bytes() == next((run / "trials").glob(f"*/*/*/trial{index}-rep0/mllog.txt")).read_bytes()
    description = json.loads((folder / "systems" / "local-cpu.json").read_text())
    assert (description["submitter"], description["division"], description["accelerators_per_node"]) == (
        "EPCC",
        "open",
        "0",
    )
    assert description["accelerator_model_name"] == "N/A" and description["framework"] == "PyTorch 2.14.1"
    assert "1 assumed" in description["hw_notes"]
    passed, lines = package_check(folder)
    assert passed, lines
    assert [path.name for path in (tmp_path / "out").iterdir()] == ["EPCC"]  # nothing else left behind


def test_a_relaxed_target_is_refused_naming_the_rule_and_the_target(tmp_path):
    """The CPU-sized CosmoFlow stops at MAE 0.2; MLPerf HPC checks 0.124 in the open division too."""
    spec = CPU_SIZED["cosmoflow"]
    run = run_folder(tmp_path, spec, [[0.31, 0.19]] * 10)
    with pytest.raises(SubmissionRefused) as refused:
        export_submission(run, tmp_path / "out")
    assert len(refused.value.reasons) == 10
    assert refused.value.reasons[0].endswith(
        "mllog.txt: does not reach MLPerf HPC's quality target eval_error <= 0.124 (rule ATLEAST_ONE_CHECK of "
        "eval_error in hpc_3.0.0/<division>_cosmoflow.yaml) (the campaign's target is mae 0.2); the HPC rules "
        "check the target in the open division too, so no division accepts this run"
    )
    assert not (tmp_path / "out").exists()


def test_fewer_runs_than_the_rules_take_are_refused_or_written_marked_incomplete(tmp_path):
    spec = CPU_SIZED["deepcam"]
    run = run_folder(tmp_path, spec, [reaching(spec)] * 3)
    with pytest.raises(SubmissionRefused) as refused:
        export_submission(run, tmp_path / "out")
    assert refused.value.reasons == [
        "local-cpu/deepcam/1x1-fp32: 3 runs; MLPerf HPC takes exactly 5 deepcam runs (mlperf_logging.benchmark_meta): "
        "run that many trials, or export it marked incomplete (--incomplete)"
    ]
    written = export_submission(run, tmp_path / "out", incomplete=True)
    assert written.incomplete
    marker = written.folder / "results" / "local-cpu" / INCOMPLETE_FILE
    assert marker.read_text().startswith("3 of the 5 deepcam runs MLPerf HPC 3.0.0 takes")
    passed, lines = package_check(written.folder)
    assert not passed and any("Incorrect number of files" in line for line in lines)


def test_more_runs_than_the_rules_take_are_refused(tmp_path):
    spec = CPU_SIZED["deepcam"]
    run = run_folder(tmp_path, spec, [reaching(spec)] * 6)
    with pytest.raises(SubmissionRefused, match="6 runs; MLPerf HPC takes exactly 5 deepcam runs"):
        export_submission(run, tmp_path / "out", incomplete=True)


def add_cell(run: Path, spec: dict) -> None:
    """One trial of another benchmark in ``run`` (its log empty: it is never read)."""
    manifest = json.loads((run / "run.json").read_text())
    manifest["benchmarks"][spec["benchmark"]["name"]] = spec["benchmark"]
    (run / "run.json").write_text(json.dumps(manifest))
    trial = spec["trial"]
    folder = run / "trials" / trial["system"] / trial["benchmark"] / trial["cell"] / "trial0-rep0"
    folder.mkdir(parents=True)
    (folder / "mllog.txt").write_text("")
    (folder / "record.json").write_text(json.dumps({"trial": trial, "provenance": PROVENANCE}))


@pytest.mark.parametrize("name", ["resnet50", "extreme-weather"])
def test_a_benchmark_without_hpc_rules_is_left_out_named_or_refused_when_asked_for(tmp_path, name):
    """ResNet-50 is MLPerf training's; extreme weather has no MLPerf rules."""
    spec = CPU_SIZED["deepcam"]
    run = run_folder(tmp_path, spec, [reaching(spec)] * 5)
    add_cell(run, FULL[name])
    reason = (
        f"local-cpu/{name}/1x1-fp32: benchmark {name!r} (model {FULL[name]['benchmark']['model']['name']!r}) "
        "has no MLPerf HPC rules"
    )
    with pytest.raises(SubmissionRefused) as refused:
        export_submission(run, tmp_path / "out", benchmarks=[name])
    assert refused.value.reasons == [reason] and not (tmp_path / "out").exists()
    written = export_submission(run, tmp_path / "out")
    assert written.left_out == [reason] and list(written.results) == [("local-cpu", "deepcam")]


def test_a_campaign_without_an_org_and_an_existing_folder_are_refused(tmp_path):
    spec = CPU_SIZED["deepcam"]
    unnamed = run_folder(tmp_path / "a", spec, [reaching(spec)] * 5, org=None)
    with pytest.raises(SubmissionRefused, match=r"the logs name no submission_org: set the campaign's mlperf\.org"):
        export_submission(unnamed, tmp_path / "out")
    run = run_folder(tmp_path / "b", spec, [reaching(spec)] * 5)
    (tmp_path / "out" / "EPCC").mkdir(parents=True)
    with pytest.raises(SubmissionRefused, match=r"out/EPCC exists: export into another --out"):
        export_submission(run, tmp_path / "out")
    assert list((tmp_path / "out" / "EPCC").iterdir()) == []


def test_the_command_line_exits_2_naming_the_refusal(tmp_path):
    spec = CPU_SIZED["deepcam"]
    run = run_folder(tmp_path, spec, [reaching(spec)] * 4 + [[0.55] * 12])  # the last never reaches 0.82
    result = subprocess.run(
        [*MLCAMPAIGN, "export-mlperf", str(run), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    assert result.returncode == 2
    assert "trial4-rep0/mllog.txt: does not reach MLPerf HPC's quality target eval_accuracy >= 0.82" in result.stderr
    assert not (tmp_path / "out").exists()


def test_systems_description_fields_given_replace_the_recorded_ones(tmp_path):
    spec = CPU_SIZED["deepcam"]
    run = run_folder(tmp_path, spec, [reaching(spec)] * 5)
    given = tmp_path / "system.json"
    given.write_text(json.dumps({"host_processors_per_node": "2", "cooling": "air", "sockets": 2}))
    command = [*MLCAMPAIGN, "export-mlperf", str(run), "--out", str(tmp_path / "out"), "--system-json", str(given)]
    refused = subprocess.run(command, capture_output=True, text=True, env=os.environ)
    assert (
        refused.returncode == 2 and "not an object of systems-description fields (unknown: sockets)" in refused.stderr
    )
    given.write_text(json.dumps({"host_processors_per_node": "2", "cooling": "air"}))
    result = subprocess.run(command, capture_output=True, text=True, env=os.environ)
    assert result.returncode == 0, result.stderr
    description = json.loads((tmp_path / "out" / "EPCC" / "systems" / "local-cpu.json").read_text())
    assert (description["host_processors_per_node"], description["cooling"]) == ("2", "air")
    assert "assumed" not in description["hw_notes"]
