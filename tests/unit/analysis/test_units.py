"""Numbers a person reads: the one formatting module of the dashboard and the HTML report."""

import math

import pandas as pd
import pytest

from mlcampaign.analysis.tables import html_view
from mlcampaign.analysis.units import column_unit, duration, metric_quantity, quantity, readable


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (8.177e9, "FLOP/s", "8.18 GFLOP/s"),
        (1.2149e12, "FLOP/s", "1.21 TFLOP/s"),
        (950.0, "FLOP/s", "950 FLOP/s"),
        (192, "s", "3 min 12 s"),
        (12.34, "s", "12.3 s"),
        (0.00443, "s", "4.43 ms"),
        (7512, "s", "2 h 05 min"),
        (86400 * 3 + 3600 * 4, "s", "3 d 4 h"),
        (1234.5, "samples/s", "1,234 samples/s"),
        (250.3, "samples/s", "250.3 samples/s"),
        (3.2e6, "samples/s", "3.2 M samples/s"),
        (12345, "J", "12.3 kJ"),
        (350.2, "W", "350 W"),
        (1.234e10, "B/s", "12.3 GB/s"),
        (5, "epochs", "5 epochs"),
        (0.913, "target metric", "0.913"),
        (math.nan, "FLOP/s", ""),
        (None, "s", ""),
    ],
)
def test_quantities_read_as_a_person_says_them(value, unit, text):
    assert quantity(value, unit) == text


def test_durations_and_metrics():
    assert duration(0) == "0 s" and duration(59.99) == "1 min 0 s" and duration(-90) == "-1 min 30 s"
    assert metric_quantity(8.177e9, "valid_flops_per_s") == "8.18 GFLOP/s"
    assert metric_quantity(0.00443, "time_per_sample_s") == "4.43 ms"
    assert column_unit("throughput_samples_per_s_ci_low") == "samples/s"
    assert column_unit("ci_boot_low", "valid_flops_per_s") == "FLOP/s" and column_unit("rank") is None
    assert column_unit("canary.memory_triad_bytes_per_s") == "B/s" and column_unit("canary.other") is None


def test_the_reports_table_views_print_human_units():
    ranking = pd.DataFrame(
        {"rank": [1], "valid_flops_per_s": [8.177e9], "ci_boot_low": [7.9e9], "ci_boot_high": [8.4e9], "p_rank": [0.93]}
    )
    page = html_view(ranking, "ranking", "the ranking")
    assert "8.18 GFLOP/s" in page and "7.9 GFLOP/s" in page and "8.177e+09" not in page and "0.93" in page
    long = pd.DataFrame({"metric": ["time_to_train_s", "throughput_samples_per_s"], "mean": [192.0, 1234.5]})
    assert readable(long)["mean"].tolist() == ["3 min 12 s", "1,234 samples/s"]
