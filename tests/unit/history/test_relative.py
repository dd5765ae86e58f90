"""Relative judging (mlcampaign.history.relative): a cell is judged relative to the canary that lowers its
run-to-run noise measurably on its reference runs (F test), not relative where the canary does not share its
noise; contended trials whose contention was steady are judged relative instead of being left out."""

import numpy as np
import pytest
from synthetic_records import add_canaries, synthetic_history
from test_summary_command import _stored, contention, summary

from mlcampaign.analysis import detection
from mlcampaign.cli import EXIT_CANNOT_TELL, EXIT_OK
from mlcampaign.history.relative import MIN_REFERENCE_RUNS, RELATIVE_LEVEL, choose

SETTINGS = detection.DetectionSettings()


def _runs(week_cv: float, shared: bool, runs: int = 16, seed: int = 0):
    """A cell's trial values and its canary's over ``runs`` runs of 3 trials: week-level noise of ``week_cv``
    in the cell, seen by the canary where ``shared``; trials at CV 1 %, the canary at 1 %."""
    rng = np.random.default_rng(seed)
    week = rng.normal(0, week_cv, runs)
    other = rng.normal(0, week_cv, runs)
    values = [100 * np.exp(week[run] + rng.normal(0, 0.01, 3)) for run in range(runs)]
    canary = [1e11 * np.exp((week if shared else other)[run] + rng.normal(0, 0.01, 3)) for run in range(runs)]
    return values, canary


def test_a_canary_that_sees_the_cells_week_level_noise_is_chosen_and_lowers_it():
    values, canary = _runs(0.04, shared=True)
    choice = choose(values, {"matmul_flops_per_s": (canary, 1.0)}, SETTINGS)
    assert choice.canary == "matmul_flops_per_s" and choice.p_value <= RELATIVE_LEVEL
    assert choice.raw_cv == pytest.approx(0.04, rel=0.5) and choice.relative_cv < choice.raw_cv / 2
    assert choice.reference_runs == 16 - SETTINGS.confirmation - 1
    assert choice.detail.startswith("judged relative to matmul_flops_per_s: run-to-run CV")


def test_a_canary_that_does_not_share_the_cells_noise_is_not_chosen():
    values, canary = _runs(0.04, shared=False)
    assert choose(values, {"matmul_flops_per_s": (canary, 1.0)}, SETTINGS).canary is None
    # Nor on too few reference runs, nor where a run lacks the canary.
    values, canary = _runs(0.04, shared=True, runs=7)
    assert choose(values, {"matmul_flops_per_s": (canary, 1.0)}, SETTINGS).canary is None
    values, canary = _runs(0.04, shared=True)
    canary[3] = np.full(3, np.nan)
    assert choose(values, {"matmul_flops_per_s": (canary, 1.0)}, SETTINGS).canary is None


def test_the_choice_is_made_on_the_reference_only():
    """A change in the newest confirmation + 1 runs does not enter the choice."""
    values, canary = _runs(0.04, shared=True)
    moved = [run * (0.5 if position >= 13 else 1.0) for position, run in enumerate(values)]
    assert choose(moved, {"m": (canary, 1.0)}, SETTINGS) == choose(values, {"m": (canary, 1.0)}, SETTINGS)


def test_contended_trials_are_judged_relative_to_canaries_measured_under_the_same_contention(tmp_path, capsys):
    """Weekly noise of 10 % shared by the cells and their canaries: both cells are judged relative to a canary.
    In the last run every trial of "slowed" was contended, steadily (its matmul roof before and after the training
    agree): judged relative, not left out, so the run is judged (nothing unjudged: exit 0 unless a cell cannot
    tell yet)."""
    weeks = 12
    manifests, records = synthetic_history(
        {"site": ["steady", "slowed"]}, ["bench"], [("1x1", "fp32")], weeks, trials=(3, 3)
    )
    for manifest in manifests:
        manifest["campaign_config"]["regression"]["metrics"] = ["throughput_samples_per_s"]
    records = add_canaries(records, cv=0.01, seed=1)
    week = dict(
        zip([m["run_id"] for m in manifests], np.exp(np.random.default_rng(2).normal(0, 0.05, weeks)), strict=True)
    )
    last = manifests[-1]["run_id"]
    for record in records:
        factor = week[record["run"]["id"]]
        record["metrics"]["throughput_samples_per_s"] *= factor
        for canary in record["canaries"].values():
            canary["value"] *= factor
        contended = record["run"]["id"] == last and record["trial"]["system"] == "slowed"
        peak = record["canaries"]["matmul_flops_per_s"]["value"]
        record["contention"] = contention(contended, peak, peak * 1.01)
    status, printed = summary(_stored(tmp_path, manifests, records), last, capsys)
    cells = {cell["system"]: cell for cell in printed["cells"]}
    assert {cell["relative_to"] for cell in cells.values()} - {None}, cells
    assert cells["slowed"]["relative_to"] is not None and cells["slowed"]["verdict"] not in ("no value",), cells
    assert "judged relative to" in cells["slowed"]["relative_detail"]
    assert printed["counts"]["unjudged"] == 0
    assert status == (EXIT_CANNOT_TELL if printed["counts"]["cannot_tell"] else EXIT_OK)
    (group,) = [group for group in printed["alert_groups"] if group["cause"] == "contention"]
    assert not [g for g in printed["alert_groups"] if g["matters"]], printed["alert_groups"]
    assert (group["cause"], group["cells"][0]["judged"], group["cells"][0]["trials"]) == ("contention", "relative", 3)


@pytest.mark.parametrize(
    ("drop_from_newest", "canary_moves"),
    [
        # The relative series lists, within its confirmation window, the drop the raw runs listed two runs back.
        (2, False),
        # The canaries dropped with the cell a run back and recover at the newest run: the relative series lists a
        # drop at the newest run, a run after the raw runs listed the cell's (the weekly-flow test's w7/w8).
        (1, True),
    ],
)
def test_a_change_listed_raw_is_not_listed_again_by_the_first_run_judged_relative(
    tmp_path, capsys, drop_from_newest, canary_moves
):
    """Weekly noise of 5 % shared by a cell and its canaries; the cell halves from a recent run on. The runs before
    the newest are judged raw (too few reference runs for the choice), and list the drop; the newest is the first
    judged relative, and its relative series lists the same drop: the summaries list it once (listed again at the
    newest run before 2026-12-05)."""
    weeks = MIN_REFERENCE_RUNS + SETTINGS.confirmation + 1
    drop_week = weeks - 1 - drop_from_newest
    manifests, records = synthetic_history(
        {"site": ["halved"]}, ["bench"], [("1x1", "fp32")], weeks, trials=(3, 3), slowdowns={"halved": (drop_week, 0.5)}
    )
    for manifest in manifests:
        manifest["campaign_config"]["regression"]["metrics"] = ["throughput_samples_per_s"]
    records = add_canaries(records, cv=0.01, seed=1)
    runs = [m["run_id"] for m in manifests]
    week = dict(zip(runs, np.exp(np.random.default_rng(2).normal(0, 0.05, weeks)), strict=True))
    for record in records:
        factor = week[record["run"]["id"]]
        record["metrics"]["throughput_samples_per_s"] *= factor
        canary_factor = 0.5 if canary_moves and record["run"]["id"] == runs[drop_week] else 1.0
        for canary in record["canaries"].values():
            canary["value"] *= factor * canary_factor
    url = _stored(tmp_path, manifests, records)
    listed = {}
    for run in runs[drop_week - 1 :]:
        _, printed = summary(url, run, capsys)
        (cell,) = printed["cells"]
        listed[run] = (cell["verdict"], cell["relative_to"])
    assert listed[runs[-1]][1] is not None, listed  # the newest run is judged relative
    assert all(relative is None for run, (_, relative) in listed.items() if run != runs[-1]), listed
    assert [verdict for verdict, _ in listed.values()].count("regression") == 1, listed
