"""The merged analysis: the campaign tables over a selection of runs of several sites."""

import copy

import numpy as np
import pandas as pd
import pytest
import synthetic_records as synthetic
from synthetic_records import synthetic_history

from mlcampaign.analysis.tables import build_tables
from mlcampaign.history.merge import (
    AnalysisSettings,
    HistoryError,
    latest_runs,
    merged_plan,
    merged_tables,
    records_by_run,
    runs_by_id,
    system_sources,
    trials_by_run,
)

SITES = {"archer2": ["archer2-cpu"], "cirrus": ["cirrus-gpu"], "eidf": ["eidf-gpu"]}
BENCHMARKS = ["resnet50", "cosmoflow"]
CELLS = [("1x1", "fp32"), ("1x2", "bf16")]
TRIALS = 3


@pytest.fixture(scope="module")
def history():
    """Two weekly runs at each of three sites, three trials per cell."""
    return synthetic_history(SITES, BENCHMARKS, CELLS, 2, trials=(TRIALS, TRIALS), seed=5)


def settings_of(manifests) -> AnalysisSettings:
    return AnalysisSettings.from_manifest(manifests[-1])


def test_the_latest_run_of_every_site_gives_one_ranking_of_three_sites(history):
    manifests, records = history
    latest = latest_runs(manifests, "synthetic")
    assert [run["run_id"] for run in latest] == ["archer2-2026w02", "cirrus-2026w02", "eidf-2026w02"]
    tables = merged_tables(latest, records, settings_of(manifests))
    ranking = tables["ranking"]
    for benchmark in BENCHMARKS:
        ranked = ranking.loc[(ranking["benchmark"] == benchmark) & ranking["rank"].notna()]
        assert sorted(ranked["system"].unique()) == ["archer2-cpu", "cirrus-gpu", "eidf-gpu"]
        assert sorted(ranked["rank"]) == list(range(1, len(CELLS) * 3 + 1))
        assert ranked["p_rank"].between(0, 1).all() and (ranked["ci_boot_low"] <= ranked["ci_boot_high"]).all()
    assert (tables["capability"]["status"] == "ok").all()
    assert len(tables["capability"]) == 3 * len(BENCHMARKS) * len(CELLS)


def test_merging_is_the_analysis_of_the_union_of_the_runs(history):
    """The merged tables are build_tables of the union plan and the selected runs' records."""
    manifests, records = history
    latest = latest_runs(manifests, "synthetic")
    settings = settings_of(manifests)
    merged = merged_tables(latest, records, settings)
    latest_ids = {run["run_id"] for run in latest}
    chosen = [record for record in records if record["run"]["id"] in latest_ids]
    plan = pd.DataFrame([row for row in latest[0]["plan"]]).drop(columns="at_site")
    direct = build_tables(
        chosen,
        plan,
        latest[0]["benchmarks"],
        confidence=settings.confidence,
        bootstrap_resamples=settings.bootstrap_resamples,
        seed=settings.seed,
    )
    for name in ("ranking", "capability", "summary", "repeatability"):
        pd.testing.assert_frame_equal(merged[name], direct[name], check_dtype=False)


def test_a_site_that_has_not_reported_is_not_run(history):
    manifests, records = history
    reported = [run for run in manifests if run["site"] != "eidf"]
    tables = merged_tables(latest_runs(reported, "synthetic"), records, settings_of(manifests))
    capability = tables["capability"].set_index("system")
    assert (capability.loc["eidf-gpu", "status"] == "not run").all()
    assert len(capability.loc["eidf-gpu"]) == len(BENCHMARKS) * len(CELLS)  # every planned cell is there
    assert (capability.drop(index="eidf-gpu")["status"] == "ok").all()
    ranking = tables["ranking"]
    assert ranking.loc[ranking["system"] == "eidf-gpu", "rank"].isna().all()
    summary = tables["summary"].set_index(["system", "benchmark"])
    assert summary.loc[("eidf-gpu", "resnet50"), "not_run"] == len(CELLS) * TRIALS
    sources = system_sources(latest_runs(reported, "synthetic")).set_index("system")
    assert pd.isna(sources.loc["eidf-gpu", "run_id"])
    assert sources.loc["cirrus-gpu", "run_id"] == "cirrus-2026w02"


def test_a_trial_s_current_outcome_is_its_last_attempt_whatever_the_clocks(history):
    """A trial re-run within a run: its last record in attempt order (the store's) counts, whatever the
    finish times that the nodes' clocks wrote (a failed first attempt on a node whose clock was ahead)."""
    manifests, records = history
    run = [record for record in records if record["run"]["id"] == "archer2-2026w02"]
    first = run[0]
    failure = synthetic.record(dict(first["trial"]), np.random.default_rng(0), failure_reason="timeout")
    failure["run"] = first["run"]
    for finished in ("2099-01-01T00:00:00+00:00", "2000-01-01T00:00:00Z"):
        failure["provenance"]["finished_utc"] = finished
        for ordered, expected in (([failure, *run], "ok"), ([*run, failure], "failed")):
            current = records_by_run(manifests, ordered)["archer2-2026w02"]
            assert len(current) == len(run)
            assert [r["status"] for r in current if r["trial"] == failure["trial"]] == [expected]


def test_records_come_flat_with_their_run_or_by_run(history):
    manifests, records = history
    by_run = {run["run_id"]: [] for run in manifests}
    for record in records:
        by_run[record["run"]["id"]].append({key: value for key, value in record.items() if key != "run"})
    assert {run: len(items) for run, items in records_by_run(manifests, by_run).items()} == {
        run: len(items) for run, items in records_by_run(manifests, records).items()
    }
    anonymous = {key: value for key, value in records[0].items() if key != "run"}
    with pytest.raises(HistoryError, match=r"has no run\.id; pass a mapping"):
        records_by_run(manifests, [anonymous])
    with pytest.raises(HistoryError, match=r"under run 'cirrus-2026w01' has run\.id 'archer2-2026w01'"):
        records_by_run(manifests, {"cirrus-2026w01": [records[0]]})


def test_two_runs_of_one_site_cannot_be_merged(history):
    manifests, records = history
    with pytest.raises(HistoryError, match=r"runs \['archer2-2026w01', 'archer2-2026w02'\] all ran trial"):
        merged_tables(runs_by_id(manifests, ["archer2-2026w01", "archer2-2026w02"]), records, settings_of(manifests))
    with pytest.raises(HistoryError, match=r"unknown run id\(s\) \['archer2-2027w01'\]"):
        runs_by_id(manifests, ["archer2-2027w01"])
    chosen = runs_by_id(manifests, ["eidf-2026w01", "cirrus-2026w02"])
    assert [run["run_id"] for run in chosen] == ["eidf-2026w01", "cirrus-2026w02"]  # start order
    plan = merged_plan(chosen)
    assert set(plan.loc[plan["system"] == "archer2-cpu", "run_id"].isna()) == {True}


def test_runs_that_disagree_on_valid_flops_cannot_be_ranked_together(history):
    manifests, records = history
    changed = copy.deepcopy(manifests)
    changed[-1]["benchmarks"]["cosmoflow"]["valid_flops"]["exponent"] = 5
    with pytest.raises(HistoryError, match=r"benchmarks.cosmoflow.valid_flops.exponent: 10 in run .*, 5 in run"):
        merged_tables(latest_runs(changed, "synthetic"), records, settings_of(manifests))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda run: run.pop("site"), r"lacks keys \['site'\]"),
        (lambda run: run.update(run_id="-bad"), "run_id '-bad' does not match"),
        (lambda run: run["plan"][3].pop("at_site"), r"plan row 3 lacks keys \['at_site'\]"),
        (lambda run: run.update(started_utc="last Monday"), "started_utc: 'last Monday' is not an ISO 8601 time"),
        (lambda run: run.update(campaign="other"), r"campaigns \['other', 'synthetic'\]"),
    ],
)
def test_bad_manifests_are_named(history, change, message):
    manifests, records = history
    broken = copy.deepcopy(manifests)
    change(broken[0])
    with pytest.raises(HistoryError, match=message):
        merged_tables(broken[:1] + broken[3:], records, settings_of(manifests))


def test_duplicate_run_ids_are_an_error(history):
    manifests, _ = history
    with pytest.raises(HistoryError, match="run_id 'archer2-2026w01' appears in two manifests"):
        latest_runs([manifests[0], manifests[0]], "synthetic")


def test_trials_by_run_keeps_each_run_s_own_trials(history):
    manifests, records = history
    trials = trials_by_run(manifests, records)
    per_run = trials.groupby("run_id").size()
    assert (per_run == len(BENCHMARKS) * len(CELLS) * TRIALS).all() and len(per_run) == 6
    assert sorted(trials["trial"].unique()) == list(range(TRIALS))  # trial numbers as planned
    assert (trials["status"] == "ok").all()
    first = trials.loc[trials["run_id"] == "archer2-2026w01"]
    assert set(first["system"]) == {"archer2-cpu"} and set(first["run_order"]) == {0}
    assert set(trials.loc[trials["run_id"] == "eidf-2026w02", "run_order"]) == {5}
