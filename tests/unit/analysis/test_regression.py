"""The regression check: each cell of a run against the accepted baseline as a reference run (judged
with the cell's run-to-run noise), the baseline store and its promotion, and the `snakemake
regression_check` gate."""

import datetime
import json

import numpy as np
import pandas as pd
import pytest
import synthetic_records as synthetic
import yaml
from synthetic_records import synthetic_history

from mlcampaign.analysis import baseline
from mlcampaign.analysis.frame import campaign_frame, flatten, planned_frame, trial_frame
from mlcampaign.analysis.plots import regression_figure
from mlcampaign.analysis.regression import gate_failures, gate_message, regression_table
from mlcampaign.cli import main
from mlcampaign.history.bundle.run_directory import ingest_run_directory
from mlcampaign.history.merge import RUN_COLUMNS, AnalysisSettings
from mlcampaign.history.store import open_store
from mlcampaign.history.trends import compute_trends
from mlcampaign.plan.config_files import ConfigError, validate
from mlcampaign.records.files import write_json_atomic

from conftest import run_path, run_snakemake

BENCHMARK = "resnet50-synthetic"
METRICS = ["throughput_samples_per_s", "achieved_quality"]


def test_the_regression_table_judges_each_cell_of_a_run_against_its_baseline_run():
    """Eight weekly runs of four cells: one 30 % slower from week 7, one whose trials all fail in week 8,
    one the baseline lacks, one unchanged (and run with another global batch)."""
    sites = {"site": ["a", "b"]}
    cells = [("1x1", "fp32"), ("1x2", "fp32")]
    manifests, records = synthetic_history(sites, [BENCHMARK], cells, 8, trials=(3, 3), slowdowns={"a": (6, 0.7)})
    last = "site-2026w08"
    for record in records:
        trial = record["trial"]
        if record["run"]["id"] == last and (trial["system"], trial["cell"]) == ("b", "1x1-fp32"):
            failed = synthetic.record(dict(trial), np.random.default_rng(1), failure_reason="out_of_memory")
            record.update({key: failed[key] for key in ("status", "failure", "metrics", "flops")})
        if record["run"]["id"] == last and (trial["system"], trial["cell"]) == ("b", "1x2-fp32"):
            record["benchmark"]["global_batch_size"] = 64
    settings = AnalysisSettings(confidence=0.95, bootstrap_resamples=200, seed=1, metrics=tuple(METRICS))
    trends = compute_trends(manifests, records, settings)
    first = trends.trials.loc[trends.trials["run_id"] == "site-2026w01"]
    accepted = baseline.campaign_samples(
        first.drop(columns=[*RUN_COLUMNS, "run_order", "used"]),
        flatten([record for record in records if record["run"]["id"] == "site-2026w01"]),
    ).assign(baseline_id="w01@2026-01-05", campaign="synthetic", promoted_utc="2026-01-05T06:00:00+00:00")
    accepted = accepted.loc[~((accepted["system"] == "a") & (accepted["cell"] == "1x2-fp32"))]  # never promoted
    trends = compute_trends(manifests, records, settings, baseline=accepted)
    planned = trends.trials.loc[trends.trials["run_id"] == last]
    table = regression_table(planned, trends.rows_of_run("baseline", last), accepted, METRICS)
    table = table.set_index(["system", "cell", "metric"])
    slow = table.loc[("a", "1x1-fp32", "throughput_samples_per_s")]
    assert slow["verdict"] == "regression" and slow["direction"] == "higher"
    assert slow["ci_low"] < slow["relative_change"] < slow["ci_high"] < 0
    assert -0.4 < slow["relative_change"] < -0.2 and slow["baseline_campaign"] == "synthetic"
    assert table.loc[("a", "1x2-fp32", "throughput_samples_per_s"), "verdict"] == "no baseline"
    failed = table.loc[("b", "1x1-fp32", "throughput_samples_per_s")]
    assert failed["verdict"] == "not measured" and failed["detail"].startswith("no ok trial: failed x3")
    batch = table.loc[("b", "1x2-fp32", "throughput_samples_per_s")]
    assert batch["verdict"] in ("unchanged", "cannot tell yet")
    assert batch["detail"].endswith("not like for like: global batch 64 here, 32 in the baseline")

    failures = gate_failures(table.reset_index())
    assert set(failures["verdict"]) == {"regression", "not measured"}
    message = gate_message(table.reset_index())
    assert message.startswith("2 cell(s) regressed")
    assert f"a {BENCHMARK} 1x1-fp32: throughput_samples_per_s regression, {slow['relative_change']:+.1%}" in message
    assert f"b {BENCHMARK} 1x1-fp32: throughput_samples_per_s not measured (no ok trial" in message
    figure = regression_figure(table.reset_index(), settings.detection.target_change)
    assert len(figure.axes) == len(METRICS)


def synthetic_campaign(seed, slow_cell=None, systems=("local-cpu",), trials=5, name=None):
    """(planned_trials table, flattened records) of a synthetic campaign: 1x1 and 1x2 fp32 cells
    per system; ``slow_cell``'s throughput is 20 % lower."""
    rng = np.random.default_rng(seed)
    rows, records = [], []
    for system in systems:
        for scale in ("1x1", "1x2"):
            for trial in range(trials):
                row = synthetic.plan_row(system, BENCHMARK, scale, "fp32", trial)
                factor = 0.8 if row["cell"] == slow_cell else 1.0
                rows.append(row)
                records.append(synthetic.record(row, rng, base_throughput=250 * factor))
    for record in records:
        record["trial"]["campaign"] = name or f"campaign-{seed}"
        record["provenance"]["workflow_commit"] = f"commit-{seed}"
    planned = campaign_frame(
        planned_frame(pd.DataFrame(rows)), trial_frame(records), {BENCHMARK: synthetic.benchmark_config()}
    )
    return planned, flatten(records), records


def test_promote_keeps_the_history(tmp_path):
    store = tmp_path / "baselines"
    first, first_records, _ = synthetic_campaign(1, systems=("sys-a", "sys-b"))
    second, second_records, _ = synthetic_campaign(2, systems=("sys-a", "sys-b"))
    baseline.promote(
        store, baseline.campaign_samples(first, first_records), "campaign-1", now="2026-01-01T00:00:00+00:00"
    )
    assert sorted(path.name for path in store.iterdir()) == ["sys-a.csv", "sys-b.csv"]

    samples = baseline.select_cells(baseline.campaign_samples(second, second_records), ["sys-a/*/1x2-*"])
    promoted = baseline.promote(store, samples, "campaign-2", note="after the upgrade", now="2026-02-01T00:00:00+00:00")
    assert promoted[["system", "cell", "trials", "superseded_rows"]].values.tolist() == [["sys-a", "1x2-fp32", 5, 5]]

    rows = baseline.load_store(store)
    assert len(rows) == 4 * 5 + 5  # nothing deleted
    old = rows.loc[(rows["system"] == "sys-a") & (rows["cell"] == "1x2-fp32") & (rows["campaign"] == "campaign-1")]
    assert (old["superseded_utc"] == "2026-02-01T00:00:00+00:00").all()
    assert (old["superseded_by"] == "campaign-2@2026-02-01T00:00:00+00:00").all()
    now = baseline.current(rows).set_index(["system", "cell"]).sort_index()
    assert set(now.loc[("sys-a", "1x2-fp32"), "campaign"]) == {"campaign-2"}
    assert set(now.loc[("sys-a", "1x2-fp32"), "note"]) == {"after the upgrade"}
    assert set(now.loc[("sys-a", "1x2-fp32"), "workflow_commit"]) == {"commit-2"}
    assert set(now.drop(("sys-a", "1x2-fp32"))["campaign"]) == {"campaign-1"}
    # The raw samples survive the round trip through the CSV.
    expected = second.loc[(second["system"] == "sys-a") & (second["cell"] == "1x2-fp32"), "throughput_samples_per_s"]
    np.testing.assert_array_equal(now.loc[("sys-a", "1x2-fp32"), "throughput_samples_per_s"], expected)
    history = baseline.summary(rows, history=True)
    assert len(history) == 5 and history["superseded_utc"].notna().sum() == 1


def test_select_cells_names_an_unknown_pattern():
    planned, records, _ = synthetic_campaign(3)
    with pytest.raises(baseline.BaselineError, match=r"\['local-cpu/\*/4x4-\*'\] match no cell.*local-cpu/"):
        baseline.select_cells(baseline.campaign_samples(planned, records), ["local-cpu/*/4x4-*"])


def test_promote_command_line(tmp_path, capsys):
    planned, records, _ = synthetic_campaign(4)
    planned.loc[planned["cell"] == "1x2-fp32", "status"] = "failed"
    campaign_dir = tmp_path / "results" / "campaign-4"
    (campaign_dir / "analysis" / "tables").mkdir(parents=True)
    planned.to_parquet(campaign_dir / baseline.PLANNED_TRIALS)
    records.to_csv(campaign_dir / baseline.RECORDS_TABLE, index=False)
    store = tmp_path / "baselines"

    arguments = ["baseline", "promote", "--baseline-dir", str(store), "--campaign-dir", str(campaign_dir)]
    assert main([*arguments, "--note", "accepted", "--cells", "local-cpu/*/1x1-fp32"]) == 0
    out = capsys.readouterr().out
    assert "promoted 1 cell(s), 5 trial(s)" in out
    assert f"not promoted, no ok trial: local-cpu/{BENCHMARK}/1x2-fp32" in out
    assert main(["baseline", "show", "--baseline-dir", str(store)]) == 0
    shown = capsys.readouterr().out
    assert "campaign-4@" in shown and "1x1-fp32" in shown and "1x2-fp32" not in shown

    assert main(["baseline", "promote", "--campaign-dir", str(tmp_path / "missing")]) == 2
    assert "missing/analysis/tables/planned_trials.parquet" in capsys.readouterr().err


def test_regression_settings_have_defaults_and_are_validated():
    config = {
        "campaign": "c",
        "seed": 1,
        "trials": 1,
        "systems": ["local-cpu"],
        "benchmarks": [BENCHMARK],
        "matrix": {"scales": ["1x1"], "precisions": ["fp32"]},
    }
    filled = validate(config, "campaign", "c.yaml")["regression"]
    assert filled == {
        "baseline_dir": "baselines",
        "metrics": ["throughput_samples_per_s", "time_per_sample_s", "epochs_to_target", "achieved_quality"],
        "target_change": 0.05,
        "min_change": None,
        "false_alarm_rate": 0.01,
        "window": 12,
        "confirmation": 3,
        "keep_contended": False,
    }
    read = AnalysisSettings.from_manifest(
        {
            "campaign_config": {
                "seed": 1,
                "analysis": {"confidence": 0.9, "bootstrap_resamples": 100},
                "regression": filled,
            }
        }
    )
    detection = read.detection
    assert (detection.false_alarm_rate, detection.target_change, detection.window, detection.confirmation) == (
        0.01,
        0.05,
        12,
        3,
    )
    assert detection.min_change is None and detection.change_that_matters == 0.025
    with pytest.raises(ConfigError, match=r"c.yaml: key 'regression.false_alarm_rate': value 0.5"):
        validate(config | {"regression": {"false_alarm_rate": 0.5}}, "campaign", "c.yaml")
    with pytest.raises(ConfigError, match=r"c.yaml: key 'regression.alpha': unknown key"):
        validate(config | {"regression": {"alpha": 0.05}}, "campaign", "c.yaml")


@pytest.mark.integration
def test_regression_check_gates_on_an_injected_slowdown(tmp_path):
    """The weekly use through the CLI: eight earlier runs in the results store give each cell its
    run-to-run noise; the check fails on the slowed cell of the ninth, keeping its table and figure;
    after the slowdown is accepted (promoted), the same check passes."""
    campaign = {
        "campaign": "it-regression",
        "seed": 5,
        "trials": 3,
        "systems": ["local-cpu"],
        "benchmarks": [BENCHMARK],
        "matrix": {"scales": ["1x1", "1x2"], "precisions": ["fp32"]},
        "analysis": {"bootstrap_resamples": 200},
        "regression": {"metrics": ["throughput_samples_per_s"]},
    }
    configfile = tmp_path / "campaign.yaml"
    configfile.write_text(yaml.safe_dump(campaign))
    accepted, accepted_records, _ = synthetic_campaign(6, trials=3)
    baseline.promote(tmp_path / "baselines", baseline.campaign_samples(accepted, accepted_records), "week-1")
    weeks = [(f"w{week}", None) for week in range(1, 9)] + [("w9", "1x2-fp32")]
    for week, (run, slow_cell) in enumerate(weeks):
        _, _, records = synthetic_campaign(7 + week, slow_cell=slow_cell, trials=3, name="it-regression")
        results = tmp_path / run_path("it-regression", run)
        for record in records:
            trial = record["trial"]
            directory = results / "trials" / "local-cpu" / BENCHMARK / trial["cell"] / f"trial{trial['trial']}-rep0"
            write_json_atomic(record | {"run": {"id": run, "site": "local"}}, directory / "record.json")
    # The history, ingested into the store as the workflow does after every run: w8 by the workflow (its
    # manifest and ingest rules); w1-w7 with w8's manifest, a day apart before it, by the ingest rule's function
    # (one Snakemake start each would add nothing the workflow's ingest of w8 does not show).
    ingest = ["--cores", "1", run_path("it-regression", "w8", "ingested.json"), "--allowed-rules", "run_manifest"]
    result = run_snakemake(tmp_path, configfile, *ingest, "ingest", timeout=600, run="w8")
    assert result.returncode == 0, result.stderr[-3000:]
    last = json.loads((tmp_path / run_path("it-regression", "w8", "run.json")).read_text())
    last_start = datetime.datetime.fromisoformat(last["started_utc"])
    with open_store(f"sqlite:///{tmp_path}/results/history.db", create=False) as store:
        for week in range(1, 8):
            started = last_start - datetime.timedelta(days=8 - week)
            manifest = last | {"run_id": f"w{week}", "started_utc": started.isoformat(timespec="seconds")}
            write_json_atomic(manifest, tmp_path / run_path("it-regression", f"w{week}", "run.json"))
            ingest_run_directory(tmp_path / run_path("it-regression", f"w{week}"), store)
        assert [run.run_id for run in store.list_runs(campaign="it-regression")] == [f"w{week}" for week in range(1, 9)]
    # The records above stand for finished trials: no trial or staging job may run.
    rules = ["--allowed-rules", "run_manifest", "aggregate", "trials_table", "regression", "regression_check"]

    result = run_snakemake(
        tmp_path, configfile, "--cores", "1", "regression_check", "trials_table", *rules, timeout=600, run="w9"
    )
    assert result.returncode != 0
    assert "regression check failed: 1 cell(s) regressed" in result.stderr
    assert f"local-cpu {BENCHMARK} 1x2-fp32: throughput_samples_per_s regression" in result.stderr
    results = tmp_path / run_path("it-regression", "w9")
    table = pd.read_csv(results / "analysis" / "tables" / "regression.csv").set_index("cell")
    assert table.loc["1x2-fp32", "verdict"] == "regression"
    assert table.loc["1x2-fp32", "ci_high"] < 0
    assert table.loc["1x1-fp32", "verdict"] in ("unchanged", "cannot tell yet")
    assert (results / "analysis" / "figures" / "regression.png").stat().st_size > 0

    assert (
        main(["baseline", "promote", "--baseline-dir", str(tmp_path / "baselines"), "--campaign-dir", str(results)])
        == 0
    )
    result = run_snakemake(tmp_path, configfile, "--cores", "1", "regression_check", *rules, timeout=600, run="w9")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "regression check passed" in (results / "logs" / "analysis" / "regression_check.log").read_text()
