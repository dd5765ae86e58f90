"""Whole-history change points (mlcampaign.analysis.detection.history_changes): apache-otava on the
libraries' public series (the change points their own tests expect), a change missed when it happened
named later, and one outlying run that is no change."""

import numpy as np
import pandas as pd
import pytest
from cell_histories import history

from mlcampaign.analysis import detection
from mlcampaign.analysis.detection.history_changes import _change_points

from conftest import REPO

CHANGEPOINTS = REPO.parent / "shared" / "data" / "changepoints"  # ../shared beside the checkout


def test_apache_otava_finds_the_change_point_of_its_csv_example():
    """otava is installed without its declared numpy and scipy pins (requirements-nodeps.txt): its
    analysis must still work with the project's numpy and scipy."""
    from otava.analysis import compute_change_points

    metric2 = [10.43, 10.23, 10.29, 10.91, 10.34, 10.69, 9.23, 9.11, 9.13, 9.03]  # its tests/csv_e2e_test.py
    points, _ = compute_change_points(metric2)
    assert [int(point.index) for point in points] == [6]
    assert points[0].stats.mean_2 / points[0].stats.mean_1 - 1 == pytest.approx(-0.129, abs=0.001)


@pytest.mark.parametrize(
    ("name", "column", "expected"),
    [
        ("otava-sample.csv", "metric1", []),
        ("otava-sample.csv", "metric2", [6]),
        ("otava-sample_single_branch.csv", "metric1", []),
        ("otava-sample_single_branch.csv", "metric2", []),
    ],
)
def test_apache_otavas_public_series_give_the_change_points_its_tests_expect(name, column, expected):
    values = pd.read_csv(CHANGEPOINTS / name)[column].to_numpy(float)
    changes = detection.history_changes(detection.run_series([[value] for value in values]), "higher")
    assert [change.run for change in changes] == expected


def test_mongodbs_long_series_has_the_four_change_points_its_test_counts():
    values = np.asarray(pd.read_json(CHANGEPOINTS / "mongodb-long_series.json")[0], float)
    series = detection.run_series([[value] for value in values], "linear")
    settings = detection.DetectionSettings(scale="linear")
    found = _change_points(detection.run_values(series, settings)[~np.isnan(values)], settings)
    assert sorted(found) == [205, 395, 594, 794]


def test_the_history_names_a_missed_change_later_and_when_it_was_first_found():
    trials = history(0.03, 0.08, seed=5)
    (change,) = detection.history_changes(detection.run_series(trials), "higher")
    assert change.run == 10 and change.verdict == "regression" and 11 <= change.first_found <= 19
    assert change.after / change.before - 1 == pytest.approx(change.relative_change)


def test_one_outlying_run_is_not_a_history_change():
    trials = history(0.01, 0.0)
    trials[12] = trials[12] / 1.15
    assert detection.history_changes(detection.run_series(trials), "higher") == []
