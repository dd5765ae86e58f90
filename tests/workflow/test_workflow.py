"""Integration: the real snakemake CLI plans, runs and re-plans a small campaign."""

import json

import pandas as pd
import pytest

from mlcampaign.plan.seeding import derive_seed
from mlcampaign.records.files import read_record
from mlcampaign.records.mlperf.trial_log import check_log

from conftest import latest_run, run_snakemake

pytestmark = pytest.mark.integration


def test_invalid_config_stops_before_any_job(tmp_path, write_config, default_campaign):
    configfile = write_config(default_campaign | {"trials": 0})
    result = run_snakemake(tmp_path, configfile, "--cores", "1")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{configfile}: key 'trials': value 0" in output
    assert "Select jobs to execute" not in output
    assert not (tmp_path / "results").exists()


@pytest.fixture(scope="module")
def tiny_campaign(tmp_path_factory):
    """One digits trial at the default settings and two fast synthetic trials, run once for the module."""
    workdir = tmp_path_factory.mktemp("campaign")
    config = {
        "campaign": "it-tiny",
        "seed": 11,
        "trials": 1,
        "systems": ["local-cpu"],
        "benchmarks": ["resnet50-digits", "resnet50-synthetic"],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
        "benchmark_overrides": {
            "resnet50-synthetic": {
                "dataset": {
                    "name": "synthetic-tiny",
                    "source": {"options": {"train_per_class": 8, "val_per_class": 4, "image_size": 16}},
                },
                "model": {"options": {"image_size": 16}},
                "training": {"epochs_max": 2, "global_batch_size": 16, "warmup_steps": 2},
            }
        },
        "replicates": 2,
        "mlperf": {"org": "mlcampaign CI"},
    }
    configfile = workdir / "campaign.yaml"
    configfile.write_text(json.dumps(config))
    result = run_snakemake(workdir, configfile)
    assert result.returncode == 0, result.stderr[-5000:]
    return workdir, configfile, config


def test_every_planned_trial_has_a_valid_record(tiny_campaign):
    workdir, _, config = tiny_campaign
    table = pd.read_csv(latest_run(workdir, "it-tiny") / "trials.csv")
    assert len(table) == 2 * config["trials"] * config["replicates"]
    assert set(table["trial.benchmark"]) == set(config["benchmarks"])
    assert (
        table["trial.seed"]
        == [derive_seed(11, b, t) for b, t in zip(table["trial.benchmark"], table["trial.trial"], strict=True)]
    ).all()
    records = sorted((latest_run(workdir, "it-tiny") / "trials").rglob("record.json"))
    assert len(records) == len(table)
    for path in records:
        record = read_record(path)
        manifest = json.loads(
            (workdir / "results" / "datasets" / record["dataset"]["name"] / "manifest.json").read_text()
        )
        assert record["dataset"]["dataset_id"] == manifest["dataset_id"]
        assert record["provenance"]["command_line"][0].endswith("mlcampaign/trial/__main__.py")


def test_digits_reaches_its_target_at_default_settings(tiny_campaign):
    workdir, _, _ = tiny_campaign
    table = pd.read_csv(latest_run(workdir, "it-tiny") / "trials.csv")
    digits = table[table["trial.benchmark"] == "resnet50-digits"]
    assert (digits["status"] == "ok").all()
    assert (digits["metrics.achieved_quality"] >= digits["benchmark.target_value"]).all()
    assert digits["metrics.reached_target"].all()
    assert (digits["metrics.throughput_samples_per_s"] > 0).all()
    assert (digits["flops.total"] > 0).all()


def test_mlperf_log_is_written(tiny_campaign):
    workdir, _, _ = tiny_campaign
    for path in (latest_run(workdir, "it-tiny") / "trials").rglob("mllog.txt"):
        events = [json.loads(line.split(":::MLLOG", 1)[1]) for line in path.read_text().splitlines()]
        keys = [event["key"] for event in events]
        assert keys[0] == "init_start"
        assert "run_start" in keys and keys[-1] == "run_stop"
        assert any(event["key"] == "eval_accuracy" for event in events)


def test_every_mlperf_log_passes_the_compliance_checker_in_the_open_division(tiny_campaign):
    workdir, _, _ = tiny_campaign
    run = latest_run(workdir, "it-tiny")
    manifest = json.loads((run / "run.json").read_text())
    logs = sorted((run / "trials").rglob("mllog.txt"))
    assert len(logs) == 4
    for path in logs:
        benchmark = path.relative_to(run / "trials").parts[1]
        result = check_log(path, manifest["benchmarks"][benchmark])
        assert result.passed, f"{path}: {result}"


def test_records_carry_the_software_stack_energy_contention_and_canaries(tiny_campaign):
    workdir, _, _ = tiny_campaign
    run = latest_run(workdir, "it-tiny")
    manifest = json.loads((run / "run.json").read_text())
    for path in sorted((run / "trials").rglob("record.json")):
        record = read_record(path)
        software = record["provenance"]["software"]
        assert software["python_packages_sha256"] == manifest["software"]["python_packages_sha256"]
        for value in (software["gpu_driver"], software["slurm"], *software["container"].values()):
            assert value and isinstance(value, str)  # a version, or "not available: <why>"
        energy = record["energy"]
        # Measured where the machine has a readable power source; else the reason, and no number.
        if energy["energy_to_train_j"] is None:
            assert energy["not_measured"].startswith("not measured: ")
        else:
            assert energy["energy_to_train_j"] > 0 and energy["not_measured"] is None
        assert isinstance(record["contention"]["contended"], bool)
        assert record["system"]["peak_basis"] in ("nominal", "measured")
        # The machine as each 1x1 trial found it: no all-reduce for one process.
        canaries = record["canaries"]
        assert set(canaries) == {"matmul_flops_per_s", "memory_triad_bytes_per_s", "dataset_read_bytes_per_s"}
        assert all(entry["value"] > 0 and entry["repeats"] >= 3 for entry in canaries.values())
    table = pd.read_csv(run / "analysis" / "tables" / "planned_trials.csv")
    for column in ("energy_to_train_j", "samples_per_joule", "energy_not_measured", "contended", "peak_basis"):
        assert column in table.columns
    assert (table["canary.memory_triad_bytes_per_s"] > 0).all()


def test_rerun_has_nothing_to_do(tiny_campaign):
    workdir, configfile, _ = tiny_campaign
    result = run_snakemake(workdir, configfile, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "Nothing to be done" in result.stdout + result.stderr
