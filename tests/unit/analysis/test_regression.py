"""Regression detection: the comparison with the baseline, the baseline store and its promotion,
and the `snakemake regression_check` gate."""

import numpy as np
import pandas as pd
import pytest
import synthetic_records as synthetic
import yaml

from mlcampaign.analysis import baseline
from mlcampaign.analysis.frame import campaign_frame, flatten, planned_frame, trial_frame
from mlcampaign.analysis.plots import regression_figure
from mlcampaign.analysis.regression import (
    Thresholds,
    compare_samples,
    gate_failures,
    gate_message,
    regression_table,
    smallest_p_value,
)
from mlcampaign.cli import main
from mlcampaign.plan.config_files import ConfigError, validate
from mlcampaign.records.files import write_json_atomic

from conftest import run_path, run_snakemake

THRESHOLDS = Thresholds(min_relative_change=0.05, alpha=0.05, confidence=0.95, bootstrap_resamples=500, min_trials=3)
# Run-to-run noise of throughput: lognormal with sigma 0.05 (CV about 5 %, as the synthetic records).
NOISE = 0.05
BENCHMARK = "resnet50-synthetic"


def throughputs(rng, n=5, factor=1.0):
    return 250.0 * factor * rng.lognormal(0, NOISE, n)


def test_injected_slowdown_is_detected():
    rng = np.random.default_rng(11)
    result = compare_samples(throughputs(rng, factor=0.8), throughputs(rng), True, THRESHOLDS, rng)
    assert result["verdict"] == "regression"
    assert 0.75 < result["ratio"] < 0.85
    assert result["ratio_ci_low"] < result["ratio"] < result["ratio_ci_high"] < 1 - THRESHOLDS.min_relative_change
    assert result["p_value"] == pytest.approx(smallest_p_value(5, 5))  # complete separation: 2/252
    assert result["detail"] == f"median {result['ratio'] - 1:+.1%}, p = 0.00794"


def test_noise_level_change_is_not_flagged():
    rng = np.random.default_rng(12)
    # A 3 % slowdown inside 5 % run-to-run noise.
    result = compare_samples(throughputs(rng, factor=0.97), throughputs(rng), True, THRESHOLDS, rng)
    assert result["verdict"] == "unchanged"
    assert result["ratio_ci_low"] < 1 < result["ratio_ci_high"]


def test_a_large_median_change_within_noise_is_not_significant():
    # Observed medians 7 % apart (beyond the 5 % threshold), but the samples overlap: p = 0.46.
    result = compare_samples(
        [93, 104, 86, 110, 90], [100, 112, 91, 104, 97], True, THRESHOLDS, np.random.default_rng(0)
    )
    assert result["ratio"] == pytest.approx(0.93)
    assert result["p_value"] > 0.4
    assert result["verdict"] == "unchanged"


def test_a_significant_change_below_the_threshold_is_not_flagged():
    base = np.array([100.0, 100.1, 99.9, 100.05, 99.95])
    result = compare_samples(base * 0.98, base, True, THRESHOLDS, np.random.default_rng(0))
    assert result["p_value"] < THRESHOLDS.alpha
    assert result["verdict"] == "unchanged"
    assert "within +/-5%" in result["detail"]


def test_false_alarm_rate_and_power_at_five_trials():
    rng = np.random.default_rng(13)
    runs = 300
    false_alarms = sum(
        compare_samples(throughputs(rng), throughputs(rng), True, THRESHOLDS, rng)["verdict"] != "unchanged"
        for _ in range(runs)
    )
    detected = sum(
        compare_samples(throughputs(rng, factor=0.8), throughputs(rng), True, THRESHOLDS, rng)["verdict"]
        == "regression"
        for _ in range(runs)
    )
    assert false_alarms / runs <= THRESHOLDS.alpha
    assert detected / runs >= 0.95


@pytest.mark.parametrize(
    ("factor", "higher_is_better", "verdict"),
    [
        (0.8, True, "regression"),  # throughput down
        (1.25, True, "improvement"),  # throughput up
        (1.25, False, "regression"),  # time to train up
        (0.8, False, "improvement"),  # time to train down
    ],
)
def test_verdict_follows_the_metric_direction(factor, higher_is_better, verdict):
    rng = np.random.default_rng(14)
    result = compare_samples(throughputs(rng, factor=factor), throughputs(rng), higher_is_better, THRESHOLDS, rng)
    assert result["verdict"] == verdict


def test_too_few_trials_give_insufficient_samples_not_unchanged():
    rng = np.random.default_rng(15)
    # 3 vs 3: the exact test cannot go below p = 0.1, whatever the change.
    result = compare_samples(throughputs(rng, 3, factor=0.5), throughputs(rng, 3), True, THRESHOLDS, rng)
    assert smallest_p_value(3, 3) == pytest.approx(0.1)
    assert result["verdict"] == "insufficient samples"
    assert result["ratio"] == pytest.approx(0.5, rel=0.15)  # the effect is still reported
    assert "0.1" in result["detail"]
    two = compare_samples([1.0, 2.0, np.nan], [1.0, 2.0, 3.0], True, THRESHOLDS, rng)
    assert (two["verdict"], two["n_new"]) == ("insufficient samples", 2)


def trial_rows(system, cell, metrics, *, status="ok", direction="higher"):
    """planned_trials rows of one cell: ``metrics`` maps a metric to its per-trial values."""
    n = len(next(iter(metrics.values())))
    scale, precision = cell.split("-")[:2]
    return pd.DataFrame(
        {
            "system": system,
            "benchmark": BENCHMARK,
            "cell": cell,
            "trial": range(n),
            "replicate": 0,
            "scale": scale,
            "processes": int(scale.split("x")[1]),
            "precision": precision,
            "compression": "none",
            "framework": "torch",
            "backend": "native",
            "status": status,
            "target_direction": direction,
            "global_batch_size": 32.0,
            **metrics,
        }
    )


def baseline_rows(trials, baseline_id="week-1@2026-01-01T00:00:00+00:00"):
    return trials.assign(
        baseline_id=baseline_id, campaign="week-1", promoted_utc="2026-01-01T00:00:00+00:00", workflow_commit="abc123"
    )


def test_regression_table_verdicts_per_cell_and_metric():
    rng = np.random.default_rng(16)
    metrics = ["throughput_samples_per_s", "achieved_quality"]

    def cell(system, cell, throughput_factor=1.0, quality=0.12, direction="lower", **options):
        return trial_rows(
            system,
            cell,
            {
                "throughput_samples_per_s": throughputs(rng, factor=throughput_factor),
                "achieved_quality": quality * rng.lognormal(0, 0.01, 5),
            },
            direction=direction,
            **options,
        )

    accepted = pd.concat([cell("a", "1x1-fp32"), cell("a", "1x2-fp32"), cell("b", "1x1-fp32")])
    campaign = pd.concat(
        [
            cell("a", "1x1-fp32", quality=0.15),  # MAE (lower is better) up 25 %
            cell("a", "1x2-fp32", throughput_factor=1.3).assign(global_batch_size=64.0),
            cell("b", "1x1-fp32", status="failed").assign(throughput_samples_per_s=np.nan, achieved_quality=np.nan),
            cell("c", "1x1-fp32"),  # a new system
        ]
    )
    table = regression_table(campaign, baseline_rows(accepted), metrics, THRESHOLDS, seed=1).set_index(
        ["system", "cell", "metric"]
    )
    assert table.loc[("a", "1x1-fp32", "achieved_quality"), "verdict"] == "regression"
    assert table.loc[("a", "1x1-fp32", "achieved_quality"), "direction"] == "lower"
    assert table.loc[("a", "1x1-fp32", "throughput_samples_per_s"), "verdict"] == "unchanged"
    assert table.loc[("a", "1x2-fp32", "throughput_samples_per_s"), "verdict"] == "improvement"
    assert table.loc[("a", "1x2-fp32", "throughput_samples_per_s"), "detail"].endswith(
        "not like for like: global batch 64 here, 32 in the baseline"
    )
    assert "like for like" not in table.loc[("a", "1x1-fp32", "throughput_samples_per_s"), "detail"]
    assert table.loc[("b", "1x1-fp32", "throughput_samples_per_s"), "verdict"] == "not measured"
    assert table.loc[("b", "1x1-fp32", "throughput_samples_per_s"), "detail"].startswith("no ok trial: failed x5")
    assert table.loc[("c", "1x1-fp32", "throughput_samples_per_s"), "verdict"] == "no baseline"
    assert table.loc[("a", "1x2-fp32", "throughput_samples_per_s"), "baseline_commits"] == "abc123"
    # Same seed, same numbers.
    again = regression_table(campaign, baseline_rows(accepted), metrics, THRESHOLDS, seed=1)
    pd.testing.assert_frame_equal(again.set_index(["system", "cell", "metric"]), table)

    failures = gate_failures(table.reset_index())
    assert set(failures["verdict"]) == {"regression", "not measured"}
    message = gate_message(table.reset_index())
    assert message.startswith("2 cell(s) regressed")
    assert f"a {BENCHMARK} 1x1-fp32: achieved_quality regression, ratio 1.2" in message
    assert f"b {BENCHMARK} 1x1-fp32: throughput_samples_per_s not measured (no ok trial" in message
    figure = regression_figure(table.reset_index(), THRESHOLDS.min_relative_change)
    assert len(figure.axes) == len(metrics)


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
    assert filled["baseline_dir"] == "baselines"
    assert Thresholds.from_config(filled) == Thresholds(0.05, 0.05, 0.95, 2000, 3)
    with pytest.raises(ConfigError, match=r"c.yaml: key 'regression.alpha': value 1.5"):
        validate(config | {"regression": {"alpha": 1.5}}, "campaign", "c.yaml")


@pytest.mark.integration
def test_regression_check_gates_on_an_injected_slowdown(tmp_path):
    """The weekly use through the CLI: the check fails on a slowed cell, keeping its table and
    figure; after the slowdown is accepted (promoted), the same check passes."""
    campaign = {
        "campaign": "it-regression",
        "seed": 5,
        "trials": 5,
        "systems": ["local-cpu"],
        "benchmarks": [BENCHMARK],
        "matrix": {"scales": ["1x1", "1x2"], "precisions": ["fp32"]},
        "analysis": {"bootstrap_resamples": 200},
        "regression": {"metrics": ["throughput_samples_per_s"], "bootstrap_resamples": 500},
    }
    configfile = tmp_path / "campaign.yaml"
    configfile.write_text(yaml.safe_dump(campaign))
    accepted, accepted_records, _ = synthetic_campaign(6)
    baseline.promote(tmp_path / "baselines", baseline.campaign_samples(accepted, accepted_records), "week-1")
    _, _, records = synthetic_campaign(7, slow_cell="1x2-fp32", name="it-regression")
    results = tmp_path / run_path("it-regression", "r1")
    for record in records:
        trial = record["trial"]
        directory = results / "trials" / "local-cpu" / BENCHMARK / trial["cell"] / f"trial{trial['trial']}-rep0"
        write_json_atomic(record, directory / "record.json")
    # The records above stand for finished trials: no trial or staging job may run.
    rules = ["--allowed-rules", "aggregate", "trials_table", "regression", "regression_check"]

    result = run_snakemake(
        tmp_path, configfile, "--cores", "1", "regression_check", "trials_table", *rules, timeout=600, run="r1"
    )
    assert result.returncode != 0
    assert "regression check failed: 1 cell(s) regressed" in result.stderr
    assert f"local-cpu {BENCHMARK} 1x2-fp32: throughput_samples_per_s regression" in result.stderr
    table = pd.read_csv(results / "analysis" / "tables" / "regression.csv").set_index("cell")
    assert table.loc["1x2-fp32", "verdict"] == "regression"
    assert table.loc["1x2-fp32", "ratio_ci_high"] < 0.95
    assert table.loc["1x1-fp32", "verdict"] == "unchanged"
    assert (results / "analysis" / "figures" / "regression.png").stat().st_size > 0

    assert (
        main(["baseline", "promote", "--baseline-dir", str(tmp_path / "baselines"), "--campaign-dir", str(results)])
        == 0
    )
    result = run_snakemake(tmp_path, configfile, "--cores", "1", "regression_check", *rules, timeout=600, run="r1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "regression check passed" in (results / "logs" / "analysis" / "regression_check.log").read_text()
