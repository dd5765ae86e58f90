"""Trends over runs and change detection with the run as the unit: nothing in an unchanged history, an
injected slowdown found in its run and cells only with the stack change beside it, a history too short
to tell that says so, contended trials counted and left out, convergence judged apart from the system,
the baseline as a reference run, and the run summary for CI."""

import copy
import dataclasses
import json

import numpy as np
import pytest
import synthetic_records as synthetic
from synthetic_records import synthetic_history

from mlcampaign.analysis.baseline import campaign_samples
from mlcampaign.analysis.frame import flatten
from mlcampaign.history.merge import RUN_COLUMNS, AnalysisSettings
from mlcampaign.history.stack_changes import stack_diff
from mlcampaign.history.summary import run_summary
from mlcampaign.history.trends import compute_trends

SITES = {"site-a": ["steady"], "site-b": ["slowed"]}
CELLS = [("1x1", "fp32"), ("1x2", "bf16")]
SPEED = ["throughput_samples_per_s", "time_per_sample_s", "valid_flops_per_s"]
SLOW_WEEK = 6  # 0-based: the seventh run of each site is the first slow one


def runs(weeks: int, slowdowns=None, seed=0, trials=(3, 3), failure_rate=0.0, cells=CELLS):
    manifests, records = synthetic_history(
        SITES, ["bench"], cells, weeks, trials=trials, slowdowns=slowdowns, seed=seed, failure_rate=failure_rate
    )
    # Exponent 0: no Valid FLOPS penalty, so that Valid FLOPS varies as throughput does (the
    # penalty of a quality just under target adds noise unrelated to speed).
    for manifest in manifests:
        manifest["benchmarks"] = {"bench": synthetic.benchmark_config(exponent=0)}
    return manifests, records


def settings(**changes) -> AnalysisSettings:
    base = AnalysisSettings(confidence=0.95, bootstrap_resamples=500, seed=11, metrics=tuple(SPEED))
    return dataclasses.replace(base, **changes)


def alarms(trends):
    return trends.changes.loc[trends.changes["verdict"].isin(["regression", "improvement"])]


@pytest.mark.parametrize("runs_before", [1, 2])
def test_a_change_found_a_run_after_its_stack_change_names_that_difference_and_its_run(runs_before):
    """The slowdown's start is an estimate: a stack change one run before it is the change's (stack_changes_run_id
    names that run), one two runs before is not."""
    manifests, records = runs(9, slowdowns={"slowed": (SLOW_WEEK, 0.75)})
    upgraded = f"site-b-2026w{SLOW_WEEK + 1 - runs_before:02d}"
    for record in records:
        week = record["run"]["id"]
        if record["trial"]["system"] == "slowed" and upgraded <= week < f"site-b-2026w{SLOW_WEEK + 1:02d}":
            record["provenance"]["packages"]["torch"] = "2.15.0"
    found = alarms(compute_trends(manifests, records, settings()))
    assert set(found["change_start_run_id"]) == {f"site-b-2026w{SLOW_WEEK + 1:02d}"}
    torch_upgrade = [{"key": "provenance.packages.torch", "before": "2.14.1", "after": "2.15.0"}]
    if runs_before == 1:
        assert all(changes == torch_upgrade for changes in found["stack_changes"])
        assert set(found["stack_changes_run_id"]) == {upgraded}
    else:  # (time per sample is not measured in every run here: its diff spans the runs it was not measured in)
        throughput = found.loc[found["metric"] == "throughput_samples_per_s"]
        assert len(throughput) == 2 and all(changes == [] for changes in throughput["stack_changes"])
        assert throughput["stack_changes_run_id"].isna().all()


def test_an_unchanged_history_raises_no_alarm_and_says_what_it_cannot_tell_yet():
    trends = compute_trends(*runs(9), settings())
    assert alarms(trends).empty, alarms(trends)[["run_id", "cell", "metric", "detail"]]
    assert trends.history.empty
    throughput = trends.changes.loc[trends.changes["metric"] == SPEED[0]]
    verdicts = throughput.groupby("run_order")["verdict"].agg(set)
    assert verdicts.iloc[:3].tolist() == [{"cannot tell yet"}] * 3  # fewer than 3 earlier runs: no test yet
    first = trends.changes.loc[trends.changes["run_order"] == 0].iloc[0]
    assert (first["reason"], first["runs_needed"]) == ("insufficient history", 3)
    assert "needs 3 more run(s)" in first["detail"]


def test_a_slowdown_is_found_in_its_run_and_cells_only_with_the_stack_change_beside_it():
    trends = compute_trends(*runs(9, slowdowns={"slowed": (SLOW_WEEK, 0.75)}), settings())
    found = alarms(trends)
    first_slow = f"site-b-2026w{SLOW_WEEK + 1:02d}"
    starts = set(zip(found["system"], found["cell"], found["change_start_run_id"], strict=True))
    assert starts == {("slowed", cell, first_slow) for cell in ("1x1-fp32", "1x2-bf16")}
    throughput = found.loc[found["metric"] == "throughput_samples_per_s"].set_index("cell")
    assert (throughput["verdict"] == "regression").all() and (throughput["run_id"] == first_slow).all()
    assert throughput["relative_change"].between(-0.35, -0.15).all()
    assert ((throughput["ci_low"] < throughput["relative_change"]) & (throughput["ci_high"] < 0)).all()
    assert (throughput["adjusted_p"] <= 0.01).all() and (throughput["false_alarm_rate"] == 0.01).all()
    assert (throughput["previous_run_id"] == f"site-b-2026w{SLOW_WEEK:02d}").all()
    # Direction-aware: slower is worse for every speed metric (time per sample: longer).
    assert set(found["verdict"]) == {"regression"} and set(found["kind"]) == {"system"}
    torch_upgrade = [{"key": "provenance.packages.torch", "before": "2.14.1", "after": "2.15.0"}]
    assert all(changes == torch_upgrade for changes in found["stack_changes"])
    # The whole-history detector names the same start, already alarmed by the per-run test.
    history = trends.history.loc[trends.history["metric"] == "throughput_samples_per_s"]
    assert set(history["run_id"]) == {first_slow} and history["alarmed"].all()
    assert all(changes == torch_upgrade for changes in history["stack_changes"])


def test_points_carry_the_cell_statistics_and_the_runs_noise_and_detectability():
    trends = compute_trends(*runs(8), settings())
    throughput = trends.points.loc[trends.points["metric"] == "throughput_samples_per_s"]
    assert (
        (throughput["n"] == 3).all() and (throughput["ok_trials"] == 3).all() and (throughput["contended"] == 0).all()
    )
    assert ((throughput["ci_low"] < throughput["mean"]) & (throughput["mean"] < throughput["ci_high"])).all()
    directions = trends.points.drop_duplicates("metric").set_index("metric")["direction"].to_dict()
    assert directions == {
        "throughput_samples_per_s": "higher",
        "time_per_sample_s": "lower",
        "valid_flops_per_s": "higher",
    }
    last = trends.changes.loc[(trends.changes["run_order"] == 7) & (trends.changes["metric"] == SPEED[0])]
    # Lognormal trial noise of 5 %, 3 trials: the run value's sd is about 3 %, and a 5 % change is
    # beyond reach of 8 runs: the cell says so, with what it would need.
    assert last["run_cv"].between(0.01, 0.06).all()
    assert (last["verdict"] == "cannot tell yet").all() and (last["reason"] == "underpowered").all()
    assert (last["smallest_detectable"] > 0.05).all()
    assert (last["trials_needed"].isna() | (last["trials_needed"] > 3)).all()
    assert last["detail"].str.contains("cannot detect a 5% change yet").all()


def test_contended_trials_are_counted_and_left_out_unless_kept():
    manifests, records = runs(5)
    for record in records:
        if record["run"]["id"] == "site-b-2026w05" and record["trial"]["trial"] < 2:
            record["contention"] = {"contended": True}
    left_out = compute_trends(manifests, records, settings())
    point = left_out.points.set_index(["run_id", "cell", "metric"]).loc[("site-b-2026w05", "1x1-fp32", SPEED[0])]
    assert (point["ok_trials"], point["contended"], point["n"]) == (3, 2, 1)
    kept = compute_trends(manifests, records, settings(keep_contended=True))
    point = kept.points.set_index(["run_id", "cell", "metric"]).loc[("site-b-2026w05", "1x1-fp32", SPEED[0])]
    assert (point["contended"], point["n"]) == (2, 3)
    summary = run_summary(left_out, "site-b-2026w05")
    assert summary["trials"]["contended"] == 4 and summary["settings"]["keep_contended"] is False


def test_a_run_without_any_ok_trial_of_a_cell_is_not_measured_and_skipped():
    manifests, records = runs(7, slowdowns={"slowed": (5, 0.7)})
    for record in records:
        if record["run"]["id"] == "site-b-2026w05" and record["trial"]["cell"] == "1x1-fp32":
            failed = synthetic.record(dict(record["trial"]), np.random.default_rng(1), failure_reason="out_of_memory")
            record.update({key: failed[key] for key in ("status", "failure", "metrics", "flops")})
    trends = compute_trends(manifests, records, settings())
    cell = trends.changes.loc[(trends.changes["system"] == "slowed") & (trends.changes["cell"] == "1x1-fp32")]
    assert set(cell.loc[cell["run_id"] == "site-b-2026w05", "verdict"]) == {"not measured"}
    summary = run_summary(trends, "site-b-2026w05")
    assert summary["counts"]["not_measured"] == 1
    assert summary["trials"] == {"planned": 6, "ok": 3, "failed": 3, "not_run": 0, "contended": 0}
    # The slow runs after it are judged against the runs before the missing one (with 4 of them, a run
    # may await the next: the first regression listed names the run after the missing one).
    slow = cell.loc[(cell["verdict"] == "regression") & (cell["metric"] == SPEED[0])].iloc[0]
    assert slow["change_start_run_id"] == "site-b-2026w06" and slow["previous_run_id"] == "site-b-2026w04"


def test_convergence_is_judged_one_sided_and_reported_as_a_convergence_change():
    manifests, records = runs(6)
    for record in records:
        if record["run"]["id"] == "site-b-2026w06":
            record["metrics"] |= {"epochs_to_target": 40, "reached_target": True, "achieved_quality": 0.95}
        elif record["run"]["id"].startswith("site-b"):
            record["metrics"] |= {"epochs_to_target": 5, "reached_target": True, "achieved_quality": 0.95}
    trends = compute_trends(manifests, records, settings(metrics=("epochs_to_target",)))
    epochs = trends.changes.set_index(["run_id", "cell"])
    regression = epochs.loc[("site-b-2026w06", "1x1-fp32")]
    assert (regression["kind"], regression["verdict"]) == ("convergence", "regression")
    assert "acceptable up to" in regression["detail"]
    summary = run_summary(trends, "site-b-2026w06")
    assert summary["counts"]["convergence_regressions"] == 2 and summary["counts"]["regressions"] == 0
    assert {change["kind"] for change in summary["changes"]} == {"convergence"}


def test_time_to_train_is_judged_through_its_parts():
    trends = compute_trends(*runs(4), settings(metrics=("time_to_train_s",)))
    assert set(trends.changes["metric"]) == {"time_per_sample_s", "epochs_to_target"}
    assert {"time_to_train_s", "time_per_sample_s", "epochs_to_target"} == set(trends.points["metric"])


def test_against_the_baseline_a_run_is_a_reference_run_and_the_streak_names_its_start():
    manifests, records = runs(10, slowdowns={"slowed": (7, 0.75)})
    trends = compute_trends(manifests, records, settings())
    first_runs = {"site-a-2026w01", "site-b-2026w01"}
    accepted = trends.trials.loc[trends.trials["run_id"].isin(first_runs)].drop(
        columns=[*RUN_COLUMNS, "run_order", "used"]
    )
    baseline = campaign_samples(accepted, flatten([r for r in records if r["run"]["id"] in first_runs]))
    trends = compute_trends(manifests, records, settings(), baseline=baseline)
    throughput = trends.baseline.loc[
        (trends.baseline["metric"] == SPEED[0]) & (trends.baseline["system"] == "slowed")
    ].set_index(["run_id", "cell"])
    assert set(throughput.loc["site-b-2026w10", "verdict"]) == {"regression"}
    assert set(throughput.loc["site-b-2026w10", "since_run_id"]) == {"site-b-2026w08"}
    assert set(throughput.loc["site-b-2026w01", "verdict"]) == {"cannot tell yet"}  # no run-to-run noise yet
    assert not trends.baseline.loc[trends.baseline["system"] == "steady", "verdict"].isin(["regression"]).any()
    summary = run_summary(trends, "site-b-2026w10")
    assert summary["counts"]["baseline_regressions"] >= len(CELLS)
    assert {entry["since_run_id"] for entry in summary["baseline"]} == {"site-b-2026w08"}


def test_the_run_summary_is_plain_json_for_ci():
    manifests, records = runs(8, slowdowns={"slowed": (SLOW_WEEK, 0.75)})
    del records[-1]  # one trial of the last run never wrote a record
    trends = compute_trends(manifests, records, settings())
    summary = run_summary(trends, "site-b-2026w07")
    json.dumps(summary, allow_nan=False)
    assert summary["run_id"] == "site-b-2026w07" and summary["site"] == "site-b"
    assert summary["settings"] == {
        "target_change": 0.05,
        "false_alarm_rate": 0.01,
        "window": 12,
        "confirmation": 3,
        "keep_contended": False,
    }
    assert summary["counts"]["regressions"] == len(alarms(trends).query("run_id == 'site-b-2026w07'"))
    assert summary["counts"]["improvements"] == 0 and summary["baseline"] is None
    change = next(entry for entry in summary["changes"] if entry["metric"] == SPEED[0])
    assert change["change_start_run_id"] == "site-b-2026w07" and change["previous_run_id"] == "site-b-2026w06"
    assert change["stack_changes"][0]["key"] == "provenance.packages.torch"
    assert change["ci_low"] < change["relative_change"] < change["ci_high"] < 0
    assert summary["counts"]["cannot_tell"] == len({(c["system"], c["cell"]) for c in summary["cannot_tell"]})
    assert {entry["metric"] for entry in summary["cells"]} == set(SPEED)
    last = run_summary(trends, "site-b-2026w08")
    assert last["trials"]["not_run"] == 1
    assert run_summary(trends, "site-a-2026w08")["changes"] == []
    with pytest.raises(ValueError, match="run 'site-c-2026w01' is not among the trends' runs"):
        run_summary(trends, "site-c-2026w01")


def test_a_change_missed_when_it_happened_is_reported_by_the_run_that_finds_it():
    # An 8 % slowdown at 5 % trial noise: beyond the per-run test at the time (its smallest detectable
    # change is larger), found by the whole-history detector later. Beyond the noise at otava's level, but
    # its interval there does not exclude min_change (2.5 %): listed as a minor shift, once.
    manifests, records = runs(16, slowdowns={"slowed": (6, 0.92)}, seed=0)
    trends = compute_trends(manifests, records, settings(metrics=("throughput_samples_per_s",)))
    (found,) = trends.history.loc[~trends.history["alarmed"]].itertuples()
    assert (found.system, found.cell, found.run_id, found.verdict, found.kind) == (
        "slowed",
        "1x1-fp32",
        "site-b-2026w07",
        "regression",
        "minor shift",
    )
    assert found.first_found_run_id == "site-b-2026w15" and found.previous_run_id == "site-b-2026w06"
    assert found.ci_low < found.relative_change < found.ci_high < 0 and not found.matters
    assert alarms(trends).query("cell == '1x1-fp32'").empty
    summary = run_summary(trends, "site-b-2026w15")
    assert summary["counts"]["minor_shifts"] == 1 and summary["counts"]["history_regressions"] == 0
    assert summary["history_changes"][0]["run_id"] == "site-b-2026w07"
    assert run_summary(trends, "site-b-2026w16")["counts"]["minor_shifts"] == 0  # reported once


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
        compute_trends(*runs(1), settings(metrics=("speed",)))


def test_settings_come_from_the_campaign_config_and_older_configs_take_the_defaults():
    manifests, _ = runs(1)
    manifests[0]["campaign_config"]["regression"] |= {"target_change": 0.1, "keep_contended": True}
    read = AnalysisSettings.from_manifest(manifests[0])
    assert read.detection.target_change == 0.1 and read.keep_contended
    older = copy.deepcopy(manifests[0])
    older["campaign_config"]["regression"] = {"metrics": ["throughput_samples_per_s"], "alpha": 0.05}
    read = AnalysisSettings.from_manifest(older)
    assert read.detection.target_change == 0.05 and read.metrics == ("throughput_samples_per_s",)
    del manifests[0]["campaign_config"]["regression"]
    with pytest.raises(ValueError, match="campaign_config lacks 'regression'"):
        AnalysisSettings.from_manifest(manifests[0])
