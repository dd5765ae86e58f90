"""Every figure is drawn from the tables, also when a table is empty."""

import numpy as np
import pandas as pd
import pytest
import synthetic_records as synthetic
from PIL import Image

from mlcampaign.analysis.plots import FIGURES, si_scale, write_figures
from mlcampaign.analysis.tables import build_tables


def campaign_tables(failure_reason=None):
    rng = np.random.default_rng(0)
    plan, records = [], []
    for system in ("a", "b"):
        for scale in ("1x1", "1x2"):
            for trial in range(3):
                row = synthetic.plan_row(system, "bench", scale, "fp32", trial)
                plan.append(row)
                records.append(synthetic.record(row, rng, failure_reason=failure_reason))
    benchmarks = {"bench": synthetic.benchmark_config()}
    return build_tables(records, pd.DataFrame(plan), benchmarks, confidence=0.95, bootstrap_resamples=200, seed=1)


@pytest.mark.parametrize("failure_reason", [None, "out_of_memory"], ids=["ok", "all failed"])
def test_every_figure_is_written(tmp_path, failure_reason):
    paths = {name: tmp_path / f"{name}.png" for name in FIGURES}
    write_figures(campaign_tables(failure_reason), paths)
    for path in paths.values():
        with Image.open(path) as image:
            assert image.format == "PNG"
            assert min(image.size) >= 150


@pytest.mark.parametrize(
    ("values", "expected"),
    [([3.2e13, 1e12], (1e12, "T")), ([950.0], (1.0, "")), ([2.5e9, np.nan], (1e9, "G")), ([], (1.0, ""))],
)
def test_si_scale_picks_the_prefix_of_the_largest_value(values, expected):
    assert si_scale(values) == expected
