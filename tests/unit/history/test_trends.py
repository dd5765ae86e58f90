"""Trends over runs and change detection: nothing in an unchanged run, an injected slowdown found
in its run and cells only, with the stack change beside it; the run summary for CI."""

import copy
import dataclasses
import json

import numpy as np
import pytest
import synthetic_records as synthetic
from synthetic_records import HISTORY_CAMPAIGN_CONFIG, synthetic_history

from mlcampaign.analysis.baseline import campaign_samples
from mlcampaign.analysis.frame import flatten
from mlcampaign.analysis.regression import Thresholds, compare_samples
from mlcampaign.history.merge import RUN_COLUMNS, AnalysisSettings
from mlcampaign.history.trends import compute_trends, run_summary, stack_diff

SITES = {"site-a": ["steady"], "site-b": ["slowed"]}
CELLS = [("1x1", "fp32"), ("1x2", "bf16")]
# alpha 0.01 with 5 vs 5 trials: only two completely separated samples are significant (exact p =
# 2/252 = 0.0079), which happens by chance with probability 0.0079 per comparison; with a 10 %
# minimum change, the synthetic records' 5 % throughput noise essentially never passes both by
# chance, while a 25 % slowdown always separates the samples.
STRICT = Thresholds(min_relative_change=0.1, alpha=0.01, confidence=0.95, bootstrap_resamples=500, min_trials=3)
FLAGGED = ("regression", "improvement", "not measured")


def settings(thresholds: Thresholds = STRICT) -> AnalysisSettings:
    return AnalysisSettings(confidence=0.95, bootstrap_resamples=500, seed=11, thresholds=thresholds)


def runs(weeks: int, slowdowns=None, seed=0, trials=(5, 5), failure_rate=0.0, cells=CELLS):
    manifests, records = synthetic_history(
        SITES, ["bench"], cells, weeks, trials=trials, slowdowns=slowdowns, seed=seed, failure_rate=failure_rate
    )
    # Exponent 0: no Valid FLOPS penalty, so that Valid FLOPS varies as throughput does (the
    # penalty of a quality just under target adds noise unrelated to speed).
    for manifest in manifests:
        manifest["benchmarks"] = {"bench": synthetic.benchmark_config(exponent=0)}
    return manifests, records


def flagged(trends):
    return trends.changes.loc[trends.changes["verdict"].isin(FLAGGED)]


def test_an_unchanged_second_run_detects_nothing():
    trends = compute_trends(*runs(2), settings())
    changes = trends.changes
    assert len(changes) == 2 * len(CELLS) * 5  # every cell and metric of the second runs was compared
    assert flagged(trends).empty, flagged(trends)[["run_id", "cell", "metric", "verdict", "detail"]]
    assert set(changes["previous_run_id"]) == {"site-a-2026w01", "site-b-2026w01"}


def test_a_slowdown_is_found_in_its_run_and_cells_only():
    trends = compute_trends(*runs(3, slowdowns={"slowed": (2, 0.75)}), settings())
    found = flagged(trends)
    assert set(zip(found["run_id"], found["system"], found["cell"], strict=True)) == {
        ("site-b-2026w03", "slowed", cell) for cell in ("1x1-fp32", "1x2-bf16")
    }
    throughput = found.loc[found["metric"] == "throughput_samples_per_s"].set_index("cell")
    assert len(throughput) == len(CELLS) and (throughput["verdict"] == "regression").all()
    assert (throughput["previous_run_id"] == "site-b-2026w02").all()  # the change started in week 3
    assert throughput["ratio"].between(0.65, 0.85).all()
    assert (throughput["ratio_ci_low"] <= throughput["ratio"]).all() and (
        throughput["ratio"] <= throughput["ratio_ci_high"]
    ).all()
    assert (throughput["p_value"] < STRICT.alpha).all()
    # Direction-aware: slower is worse for every speed metric flagged (time to train: longer).
    assert set(found["verdict"]) == {"regression"}
    torch_upgrade = [{"key": "provenance.packages.torch", "before": "2.14.1", "after": "2.15.0"}]
    assert all(changes == torch_upgrade for changes in found["stack_changes"])


def test_points_carry_the_cell_statistics_with_an_interval():
    trends = compute_trends(*runs(2), settings())
    points = trends.points
    throughput = points.loc[points["metric"] == "throughput_samples_per_s"]
    assert (throughput["n"] == 5).all() and (throughput["ok_trials"] == 5).all()
    assert ((throughput["ci_low"] < throughput["mean"]) & (throughput["mean"] < throughput["ci_high"])).all()
    directions = points.drop_duplicates("metric").set_index("metric")["direction"].to_dict()
    assert directions == {
        "throughput_samples_per_s": "higher",
        "time_to_train_s": "lower",
        "achieved_quality": "higher",  # the records' target direction (top-1)
        "epochs_to_target": "lower",
        "valid_flops_per_s": "higher",
    }
    first = trends.trials.loc[
        (trends.trials["run_id"] == "site-a-2026w01") & (trends.trials["cell"] == "1x1-fp32"),
        "throughput_samples_per_s",
    ]
    point = throughput.loc[(throughput["run_id"] == "site-a-2026w01") & (throughput["cell"] == "1x1-fp32")].iloc[0]
    assert point["median"] == pytest.approx(first.median()) and point["mean"] == pytest.approx(first.mean())


def test_every_verdict_is_the_one_compare_samples_gives():
    """The pairs decided without calling compare_samples get its verdict (default thresholds, 3-5
    trials and failures, so that every kind of verdict occurs)."""
    thresholds = Thresholds.from_config(HISTORY_CAMPAIGN_CONFIG["regression"])
    cells = [(scale, precision) for scale in ("1x1", "1x2", "1x4") for precision in ("fp32", "bf16")]
    manifests, records = runs(6, {"slowed": (3, 0.7)}, seed=2, trials=(3, 5), failure_rate=0.1, cells=cells)
    trends = compute_trends(manifests, records, settings(thresholds))
    ok = trends.trials.loc[trends.trials["status"] == "ok"].groupby(["run_id", "system", "cell"])
    compared = trends.changes.loc[trends.changes["verdict"] != "not measured"]
    assert {"insufficient samples", "unchanged", "regression"} <= set(compared["verdict"])
    rng = np.random.default_rng(0)
    for row in compared.itertuples():
        new = ok.get_group((row.run_id, row.system, row.cell))[row.metric]
        old = ok.get_group((row.previous_run_id, row.system, row.cell))[row.metric]
        expected = compare_samples(new, old, row.direction == "higher", thresholds, rng)
        assert row.verdict == expected["verdict"], (row, expected)
        if not np.isnan(row.p_value):
            assert row.p_value == pytest.approx(expected["p_value"])


def test_a_run_without_any_ok_trial_of_a_cell_is_not_measured_and_skipped():
    manifests, records = runs(3)
    for record in records:
        if record["run"]["id"] == "site-b-2026w02" and record["trial"]["cell"] == "1x1-fp32":
            failed = synthetic.record(dict(record["trial"]), np.random.default_rng(1), failure_reason="out_of_memory")
            record.update({key: failed[key] for key in ("status", "failure", "metrics", "flops")})
    trends = compute_trends(manifests, records, settings())
    cell = trends.changes.loc[(trends.changes["system"] == "slowed") & (trends.changes["cell"] == "1x1-fp32")]
    assert set(cell.loc[cell["run_id"] == "site-b-2026w02", "verdict"]) == {"not measured"}
    assert set(cell.loc[cell["run_id"] == "site-b-2026w03", "previous_run_id"]) == {"site-b-2026w01"}
    summary = run_summary(trends, "site-b-2026w02")
    assert summary["counts"]["not_measured"] == 1
    assert summary["trials"] == {"planned": 10, "ok": 5, "failed": 5, "not_run": 0}


def test_against_the_baseline_the_streak_names_the_run_it_started_in():
    manifests, records = runs(4, slowdowns={"slowed": (2, 0.75)})
    trends = compute_trends(manifests, records, settings())
    first_runs = {"site-a-2026w01", "site-b-2026w01"}
    accepted = trends.trials.loc[trends.trials["run_id"].isin(first_runs)].drop(columns=[*RUN_COLUMNS, "run_order"])
    baseline = campaign_samples(accepted, flatten([r for r in records if r["run"]["id"] in first_runs]))
    trends = compute_trends(manifests, records, settings(), baseline=baseline)
    throughput = trends.baseline.loc[
        (trends.baseline["metric"] == "throughput_samples_per_s") & (trends.baseline["system"] == "slowed")
    ]
    by_run = throughput.groupby("run_id")
    assert set(by_run.get_group("site-b-2026w04")["verdict"]) == {"regression"}
    assert set(by_run.get_group("site-b-2026w04")["since_run_id"]) == {"site-b-2026w03"}
    assert set(by_run.get_group("site-b-2026w01")["verdict"]) == {"unchanged"}
    steady = trends.baseline.loc[trends.baseline["system"] == "steady"]
    assert not steady["verdict"].isin(FLAGGED).any()
    summary = run_summary(trends, "site-b-2026w04")
    assert summary["counts"]["baseline_regressions"] >= len(CELLS)
    assert {entry["since_run_id"] for entry in summary["baseline"]} == {"site-b-2026w03"}


def test_the_run_summary_is_plain_json_for_ci():
    manifests, records = runs(3, slowdowns={"slowed": (2, 0.75)})
    del records[-1]  # one trial of the last run never wrote a record
    trends = compute_trends(manifests, records, settings())
    summary = run_summary(trends, "site-b-2026w03")
    json.dumps(summary, allow_nan=False)
    assert summary["run_id"] == "site-b-2026w03" and summary["site"] == "site-b"
    assert summary["trials"] == {"planned": 10, "ok": 9, "failed": 0, "not_run": 1}
    assert summary["counts"]["regressions"] == len(flagged(trends)) and summary["counts"]["improvements"] == 0
    assert summary["baseline"] is None and summary["counts"]["baseline_regressions"] is None
    change = next(entry for entry in summary["changes"] if entry["metric"] == "throughput_samples_per_s")
    assert change["previous_run_id"] == "site-b-2026w02" and change["verdict"] == "regression"
    assert change["stack_changes"][0]["key"] == "provenance.packages.torch"
    assert run_summary(trends, "site-a-2026w03")["changes"] == []
    with pytest.raises(ValueError, match="run 'site-c-2026w01' is not among the trends' runs"):
        run_summary(trends, "site-c-2026w01")


def test_per_trial_noise_is_not_a_stack_change():
    manifests, records = runs(2)
    for position, record in enumerate(records):
        record["provenance"]["hostname"] = f"node{position}"
        record["provenance"]["environment"] = {"SLURM_JOB_ID": str(position), "RANDOM_PORT": str(position)}
    changed = copy.deepcopy(manifests)
    changed[-1]["systems"]["slowed"]["launcher"] = "srun"
    trends = compute_trends(changed, records, settings())
    before = trends.fingerprints["site-b-2026w01"]["slowed"]
    after = trends.fingerprints["site-b-2026w02"]["slowed"]
    assert not any(key.startswith("provenance.environment") or key == "provenance.hostname" for key in after)
    assert stack_diff(before, after) == [{"key": "system_config.launcher", "before": ["local"], "after": ["srun"]}]


def test_unknown_metrics_are_named():
    with pytest.raises(ValueError, match=r"metrics \['speed'\] unknown"):
        compute_trends(*runs(1), settings(), metrics=["speed"])


def test_settings_come_from_the_campaign_config():
    manifests, _ = runs(1)
    read = AnalysisSettings.from_manifest(manifests[0])
    assert dataclasses.asdict(read)["thresholds"]["alpha"] == HISTORY_CAMPAIGN_CONFIG["regression"]["alpha"]
    del manifests[0]["campaign_config"]["regression"]
    with pytest.raises(ValueError, match="campaign_config lacks 'regression'"):
        AnalysisSettings.from_manifest(manifests[0])
