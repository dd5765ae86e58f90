"""The campaign tables: capability and completeness, repeatability, ranking, scaling."""

import numpy as np
import pandas as pd
import pytest
import synthetic_records as synthetic

from mlcampaign.analysis.outputs import TABLE_FORMATS, TABLES
from mlcampaign.analysis.tables import build_tables, html_view, write_tables
from mlcampaign.measure.roofline import MatmulPeak
from mlcampaign.records.builder import roofline_block
from mlcampaign.records.files import validate_record

BENCHMARKS = {"bench": synthetic.benchmark_config(exponent=10)}


def plan_of(rows) -> pd.DataFrame:
    return pd.DataFrame(rows)


PEAK = MatmulPeak(
    flops_per_s=1e11,
    size=1024,
    dtype="float32",
    device="cpu",
    threads=2,
    repeats=5,
    warmup=2,
    matmuls_per_repeat=8,
    repeat_cv=0.01,
)


def tables_for(plan_rows, records, resamples=400, benchmarks=BENCHMARKS):
    return build_tables(records, plan_of(plan_rows), benchmarks, confidence=0.95, bootstrap_resamples=resamples, seed=3)


def with_throughput(record: dict, throughput: float) -> dict:
    record["metrics"]["throughput_samples_per_s"] = throughput
    return record


def test_synthetic_records_satisfy_the_record_schema():
    rng = np.random.default_rng(0)
    row = synthetic.plan_row("sys", "bench", "2x2", "bf16", trial=1, replicate=1, compression="fp16")
    validate_record(synthetic.record(row, rng, batch_scaling="weak"))
    validate_record(synthetic.record(row, rng, failure_reason="compile_error"))


def test_the_planned_trials_carry_each_canary_where_its_record_has_one():
    """A trial of a record written before the canaries existed has none (empty), one that measured them has
    each as column canary.<name>; the all-reduce only for more than one process."""
    rows = [synthetic.plan_row("sys", "bench", scale, "fp32", trial) for scale in ("1x1", "1x2") for trial in (0, 1)]
    rng = np.random.default_rng(2)
    records = [synthetic.record(row, rng) | {"run": {"id": "r", "site": "s"}} for row in rows]
    synthetic.add_canaries(records[1:])
    table = tables_for(rows, records, resamples=50)["planned_trials"].set_index(["cell", "trial"])
    triad, collective = table["canary.memory_triad_bytes_per_s"], table["canary.allreduce_bus_bytes_per_s"]
    assert (
        np.isnan(triad[("1x1-fp32", 0)])
        and triad[("1x1-fp32", 1)] == records[1]["canaries"]["memory_triad_bytes_per_s"]["value"]
    )
    assert np.isnan(collective[("1x1-fp32", 1)]) and collective[("1x2-fp32", 0)] > 0


@pytest.fixture
def mixed_campaign():
    """System 'good' runs everything; 'small' runs out of memory at 2x2 (one trial's job died
    without a record); 'half' has one ok and one failed trial at 1x1."""
    rng = np.random.default_rng(1)
    plan, records = [], []
    for system in ("good", "small", "half"):
        for scale in ("1x1", "2x2"):
            for trial in range(2):
                row = synthetic.plan_row(system, "bench", scale, "fp32", trial)
                plan.append(row)
                if system == "small" and scale == "2x2":
                    if trial == 0:
                        records.append(synthetic.record(row, rng, failure_reason="out_of_memory"))
                elif system == "half" and scale == "1x1" and trial == 1:
                    records.append(synthetic.record(row, rng, failure_reason="diverged"))
                else:
                    records.append(synthetic.record(row, rng))
    return plan, records


def test_failed_and_missing_trials_appear_in_the_capability_matrix(mixed_campaign):
    capability = tables_for(*mixed_campaign)["capability"].set_index(["system", "cell"])
    assert len(capability) == 6  # every planned cell, none dropped
    failed = capability.loc[("small", "2x2-fp32")]
    assert failed["status"] == "failed"
    assert failed["failure_reasons"] == "out of memory"
    assert (failed["ok"], failed["failed"], failed["not_run"]) == (0, 1, 1)
    assert failed["outcome"] == "failed: out of memory, not run x1"
    partial = capability.loc[("half", "1x1-fp32")]
    assert partial["status"] == "partial"
    assert partial["outcome"] == "partial: 1/2 ok, diverged"
    assert capability.loc[("good", "2x2-fp32"), "status"] == "ok"


def test_a_cell_without_any_record_is_not_run(mixed_campaign):
    plan, records = mixed_campaign
    kept = [r for r in records if not (r["trial"]["system"] == "good" and r["trial"]["cell"] == "1x1-fp32")]
    capability = tables_for(plan, kept)["capability"].set_index(["system", "cell"])
    assert capability.loc[("good", "1x1-fp32"), "status"] == "not run"
    assert capability.loc[("good", "1x1-fp32"), "outcome"] == "not run"


def test_campaign_summary_counts_planned_executed_and_valid(mixed_campaign):
    plan, records = mixed_campaign
    summary = tables_for(plan, records)["summary"].set_index(["system", "benchmark"])
    total = summary.loc[("all", "all")]
    reached = sum(r["status"] == "ok" and r["metrics"]["reached_target"] for r in records)
    assert (total["planned"], total["executed"], total["ok"], total["failed"], total["not_run"]) == (12, 11, 9, 2, 1)
    assert total["valid"] == reached
    assert summary.loc[("small", "bench"), "not_run"] == 1


def test_records_of_unplanned_trials_are_ignored(mixed_campaign):
    plan, records = mixed_campaign
    stray = synthetic.record(synthetic.plan_row("good", "bench", "4x4", "fp32", 0), np.random.default_rng(2))
    tables = tables_for(plan, [*records, stray])
    assert len(tables["planned_trials"]) == len(plan)
    assert "4x4-fp32" not in set(tables["capability"]["cell"])


def test_repeatability_statistics_of_a_cell(mixed_campaign):
    plan, records = mixed_campaign
    repeatability = tables_for(plan, records)["repeatability"]
    row = repeatability.set_index(["system", "cell", "metric"]).loc[("good", "2x2-fp32", "throughput_samples_per_s")]
    values = [
        r["metrics"]["throughput_samples_per_s"]
        for r in records
        if r["trial"]["system"] == "good" and r["trial"]["cell"] == "2x2-fp32"
    ]
    assert row["n"] == 2
    assert row["mean"] == pytest.approx(np.mean(values))
    assert row["std"] == pytest.approx(np.std(values, ddof=1))
    assert row["ci_boot_low"] <= row["mean"] <= row["ci_boot_high"]
    # Time-to-train counts converged trials only.
    converged = repeatability.set_index(["system", "cell", "metric"]).xs("time_to_train_s", level="metric")
    expected = pd.Series(
        [r["trial"]["system"] for r in records if r["status"] == "ok" and r["metrics"]["reached_target"]]
    ).value_counts()
    assert converged.groupby(level="system")["n"].sum().to_dict() == expected.to_dict()


def test_seed_and_system_noise_are_separated_with_replicates():
    rng = np.random.default_rng(4)
    plan, records = [], []
    for trial in range(3):
        for replicate in range(2):
            row = synthetic.plan_row("sys", "bench", "1x1", "fp32", trial, replicate)
            plan.append(row)
            records.append(with_throughput(synthetic.record(row, rng), [100, 110, 120][trial] + replicate))
    row = tables_for(plan, records)["repeatability"].set_index("metric").loc["throughput_samples_per_s"]
    # Seed means 100.5, 110.5, 120.5: MSB = 2 * 200 / 2 = 200; within: 6 x 0.25 / 3 = 0.5.
    assert row["system_noise_std"] == pytest.approx(np.sqrt(0.5))
    assert row["seed_std"] == pytest.approx(np.sqrt((200 - 0.5) / 2))


def test_convergence_counts_trials_reaching_the_target():
    rng = np.random.default_rng(5)
    plan = [synthetic.plan_row("sys", "bench", "1x1", "fp32", trial) for trial in range(4)]
    records = [synthetic.record(row, rng) for row in plan]
    for record, epochs in zip(records, [3, 3, 5, None], strict=True):
        metrics = record["metrics"]
        metrics["reached_target"] = epochs is not None
        metrics["epochs_to_target"] = epochs
    row = tables_for(plan, records)["convergence"].iloc[0]
    assert (row["ok_trials"], row["reached_target"]) == (4, 3)
    assert row["fraction_reached"] == pytest.approx(0.75)
    assert row["ci_low"] < 0.75 < row["ci_high"]
    assert row["epochs_to_target_counts"] == "3: 2, 5: 1"


def test_ranking_orders_by_valid_flops_with_rank_probabilities(mixed_campaign):
    plan, records = mixed_campaign
    ranking = tables_for(plan, records)["ranking"]
    ranked = ranking.dropna(subset=["rank"])
    assert list(ranked["rank"]) == sorted(ranked["rank"])
    assert ranked["valid_flops_per_s"].is_monotonic_decreasing
    assert (ranked["ci_boot_low"] <= ranked["valid_flops_per_s"]).all()
    assert (ranked["valid_flops_per_s"] <= ranked["ci_boot_high"]).all()
    assert ranked["p_rank"].between(0, 1).all()
    unranked = ranking.loc[ranking["rank"].isna()]
    assert list(zip(unranked["system"], unranked["cell"], unranked["status"], strict=True)) == [
        ("small", "2x2-fp32", "failed")
    ]


def test_rank_probability_reflects_overlap():
    rng = np.random.default_rng(6)
    plan, records = [], []
    # Same FLOPs and quality; 'far' trains 10x faster; 'near1' and 'near2' have identical trials,
    # so they tie (both rank 2) and each holds rank 2 in about half of the resamples.
    times = [90.0, 110.0, 95.0, 105.0, 100.0, 120.0]
    for system, scale in (("far", 0.1), ("near1", 1.0), ("near2", 1.0)):
        for trial, time_to_train in enumerate(times):
            row = synthetic.plan_row(system, "bench", "1x1", "fp32", trial)
            plan.append(row)
            record = synthetic.record(row, rng)
            record["flops"]["total"] = 1e15
            record["metrics"]["time_to_train_s"] = time_to_train * scale
            record["metrics"]["achieved_quality"] = 0.95
            records.append(record)
    ranking = tables_for(plan, records, resamples=4000)["ranking"].set_index("system")
    assert (ranking.loc["far", "rank"], ranking.loc["far", "p_rank"]) == (1, 1.0)
    for system in ("near1", "near2"):
        assert ranking.loc[system, "rank"] == 2
        assert ranking.loc[system, "p_rank"] == pytest.approx(0.5, abs=0.1)


def scaling_campaign(batch_scaling: str, throughputs: dict[str, list[float]]):
    rng = np.random.default_rng(7)
    plan, records = [], []
    for scale, values in throughputs.items():
        for trial, value in enumerate(values):
            row = synthetic.plan_row("sys", "bench", scale, "fp32", trial)
            plan.append(row)
            records.append(with_throughput(synthetic.record(row, rng, batch_scaling=batch_scaling), value))
    return plan, records


def test_strong_scaling_speedup_and_efficiency():
    plan, records = scaling_campaign("strong", {"1x1": [100, 100], "1x2": [180, 180], "2x2": [320, 320]})
    tables = tables_for(plan, records)
    strong = tables["scaling_strong"].set_index("scale")
    assert tables["scaling_weak"].empty
    assert list(strong["processes"]) == [1, 2, 4]
    np.testing.assert_allclose(strong["speedup"], [1.0, 1.8, 3.2])
    np.testing.assert_allclose(strong["efficiency"], [1.0, 0.9, 0.8])
    np.testing.assert_allclose(strong["efficiency_ci_low"], [1.0, 0.9, 0.8])  # no spread, no width
    assert (strong["global_batch_size"] == 32).all()
    assert list(strong["local_batch_size"]) == [32, 16, 8]
    assert (strong["series_scales"] == 3).all()


def test_weak_scaling_is_relative_to_the_smallest_scale_measured():
    plan, records = scaling_campaign("weak", {"1x2": [190, 210], "2x2": [360, 400], "4x2": [600, 680]})
    weak = tables_for(plan, records, resamples=2000)["scaling_weak"].set_index("scale")
    assert (weak["baseline_processes"] == 2).all()
    np.testing.assert_allclose(weak["speedup"], [1.0, 380 / 200, 640 / 200])
    np.testing.assert_allclose(weak["efficiency"], [1.0, 380 / 400, 640 / 800])
    assert (weak["efficiency_ci_low"] <= weak["efficiency"]).all()
    assert (weak["efficiency"] <= weak["efficiency_ci_high"]).all()
    assert weak.loc["4x2", "efficiency_ci_high"] > weak.loc["4x2", "efficiency_ci_low"]
    assert (weak["local_batch_size"] == 32).all()


def test_time_split_and_fraction_of_peak():
    plan, records = scaling_campaign("strong", {"1x2": [150, 150]})
    for record in records:
        metrics = record["metrics"]
        metrics["data_loading_s"], metrics["compute_s"], metrics["communication_s"] = 1.0, 6.0, 3.0
        record["flops"]["fraction_of_peak"] = 0.25
    row = tables_for(plan, records)["scaling_strong"].iloc[0]
    assert (row["io_fraction"], row["compute_fraction"], row["communication_fraction"]) == pytest.approx(
        (0.1, 0.6, 0.3)
    )
    assert row["fraction_of_peak"] == pytest.approx(0.25)


def test_every_table_is_written_as_csv_and_parquet(tmp_path, mixed_campaign):
    tables = tables_for(*mixed_campaign)
    assert set(tables) == set(TABLES)
    paths = {name: {fmt: tmp_path / f"{name}.{fmt}" for fmt in TABLE_FORMATS} for name in TABLES}
    write_tables(tables, paths)
    for name, table in tables.items():
        assert len(pd.read_csv(paths[name]["csv"])) == len(table)
        pd.testing.assert_frame_equal(pd.read_parquet(paths[name]["parquet"]), table.reset_index(drop=True))


def test_html_view_holds_every_row(mixed_campaign):
    capability = tables_for(*mixed_campaign)["capability"]
    page = html_view(capability, "capability", TABLES["capability"])
    assert page.count("<tr") == len(capability) + 1
    assert "failed: out of memory, not run x1" in page


def test_a_trial_whose_job_the_scheduler_killed_is_failed_with_that_reason():
    """No record, but accounting says the job was killed: failed (scheduler), not "not run"."""
    rng = np.random.default_rng(5)
    rows = [synthetic.plan_row("sys", "bench", "1x1", "fp32", trial=trial) for trial in range(3)]
    killed = pd.DataFrame(
        [
            {
                **{key: rows[1][key] for key in ("system", "benchmark", "cell", "trial", "replicate")},
                "failure_reason": "scheduler",
                "failure_message": "Slurm job 7 ended NODE_FAIL before the trial wrote a record",
            }
        ]
    )
    records = [synthetic.record(rows[0], rng)]  # trial 1 was killed, trial 2 never ran
    tables = build_tables(
        records, plan_of(rows), BENCHMARKS, confidence=0.95, bootstrap_resamples=100, seed=3, known_outcomes=killed
    )
    planned = tables["planned_trials"].set_index("trial")
    assert list(planned["status"]) == ["ok", "failed", "not run"]
    assert planned.loc[1, "failure_message"].startswith("Slurm job 7 ended NODE_FAIL")
    assert tables["capability"].loc[0, "outcome"] == "partial: 1/3 ok, scheduler failure, not run x1"


def _with_energy(record: dict, mean_power_w: float | None, contended: bool) -> dict:
    """The energy and contention blocks of a measured trial (None: the energy was not measured)."""
    seconds = record["metrics"]["train_loop_s"]
    joules = None if mean_power_w is None else mean_power_w * seconds
    record["energy"] = {
        "energy_to_train_j": joules,
        "mean_power_w": mean_power_w,
        "peak_power_w": None if mean_power_w is None else 1.2 * mean_power_w,
        "trial_energy_j": joules,
        "samples_per_joule": None if joules is None else record["metrics"]["samples_trained"] / joules,
        "not_measured": "not measured: no power source readable (test)" if mean_power_w is None else None,
        "windows": {},
    }
    record["contention"] = {"contended": contended} | {
        key: None for key in ("steal_fraction", "others_cpu_fraction", "own_cpu_fraction")
    }
    return record


def test_valid_flops_per_watt_ranks_where_energy_was_measured_and_contended_trials_can_be_left_out():
    rng = np.random.default_rng(8)
    plan, records = [], []
    # 'fast' has the most Valid FLOPS but draws 4x the power of 'frugal'; 'unmeasured' has no power source.
    for system, power in (("fast", 400.0), ("frugal", 100.0), ("unmeasured", None)):
        for trial in range(4):
            row = synthetic.plan_row(system, "bench", "1x1", "fp32", trial)
            plan.append(row)
            throughput = 500.0 if system == "fast" else 250.0
            record = synthetic.record(row, rng, base_throughput=throughput)
            records.append(_with_energy(record, power, contended=system == "frugal" and trial == 0))
    tables = tables_for(plan, records)
    trials = tables["planned_trials"]
    measured = trials.dropna(subset=["mean_power_w"])
    assert np.allclose(measured["valid_flops_per_watt"], measured["valid_flops_per_s"] / measured["mean_power_w"])
    assert trials.loc[trials["system"] == "unmeasured", "valid_flops_per_watt"].isna().all()
    assert (trials.loc[trials["system"] == "unmeasured", "energy_not_measured"].str.startswith("not measured")).all()
    ranking = tables["ranking"].set_index("system")
    assert ranking.loc["fast", "rank"] == 1 and ranking.loc["frugal", "rank_per_watt"] == 1
    assert ranking.loc["fast", "rank_per_watt"] == 2 and pd.isna(ranking.loc["unmeasured", "rank_per_watt"])
    assert tables["summary"].set_index("system").loc["frugal", "contended"] == 1

    kept = build_tables(
        records, plan_of(plan), BENCHMARKS, confidence=0.95, bootstrap_resamples=400, seed=3, exclude_contended=True
    )
    assert kept["ranking"].set_index("system").loc["frugal", "n"] == 3  # its contended trial is left out
    assert (kept["planned_trials"]["system"] == "frugal").sum() == 4  # and still listed


def test_scaling_table_reports_the_roofline_fraction():
    plan, records = scaling_campaign("strong", {"1x2": [150, 150]})
    for record in records:
        record["roofline"] = roofline_block(PEAK, 2, 4e10)
    row = tables_for(plan, records)["scaling_strong"].iloc[0]
    assert row["roofline_fraction"] == pytest.approx(0.2)
    plan, records = scaling_campaign("strong", {"1x2": [150, 150]})  # records without a roofline block
    assert np.isnan(tables_for(plan, records)["scaling_strong"].iloc[0]["roofline_fraction"])
