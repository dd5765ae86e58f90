"""Statistics of mlcampaign.analysis.stats against scipy/numpy on known data."""

import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from mlcampaign.analysis import stats

SAMPLE = np.array([12.1, 9.8, 11.4, 10.2, 13.7, 10.9, 11.8])


def grouped_sample():
    return pd.DataFrame(
        {
            "cell": ["a"] * len(SAMPLE) + ["b"] * 3,
            "y": [*SAMPLE, 1.0, 2.0, np.nan],
        }
    )


def test_describe_matches_numpy_and_scipy():
    row = stats.describe(grouped_sample(), ["cell"], ["y"], confidence=0.95).loc[("a", "y")]
    assert row["n"] == len(SAMPLE)
    assert row["mean"] == pytest.approx(np.mean(SAMPLE))
    assert row["median"] == pytest.approx(np.median(SAMPLE))
    assert row["std"] == pytest.approx(np.std(SAMPLE, ddof=1))
    assert row["min"] == SAMPLE.min() and row["max"] == SAMPLE.max()
    assert row["cv"] == pytest.approx(np.std(SAMPLE, ddof=1) / np.mean(SAMPLE))
    interval = scipy.stats.ttest_1samp(SAMPLE, 0).confidence_interval(0.95)
    assert row["ci_t_low"] == pytest.approx(interval.low)
    assert row["ci_t_high"] == pytest.approx(interval.high)
    # MLPerf olympic mean: one fastest and one slowest dropped (scipy trims 1/n from each end).
    assert row["olympic_mean"] == pytest.approx(scipy.stats.trim_mean(SAMPLE, 1 / len(SAMPLE)))
    assert row["olympic_mean"] == pytest.approx(np.sort(SAMPLE)[1:-1].mean())


def test_describe_skips_missing_values_and_leaves_undefined_statistics_empty():
    row = stats.describe(grouped_sample(), ["cell"], ["y"], confidence=0.95).loc[("b", "y")]
    assert row["n"] == 2
    assert row["mean"] == pytest.approx(1.5)
    assert np.isnan(row["olympic_mean"])  # needs three values


def test_t_interval_is_undefined_for_one_value():
    low, high = stats.t_interval([5.0], [np.nan], [1], 0.95)
    assert np.isnan(low[0]) and np.isnan(high[0])


def test_coefficient_of_variation_of_zero_mean_is_undefined():
    assert np.isnan(stats.coefficient_of_variation(1.0, 0.0))


@pytest.mark.parametrize(("successes", "n"), [(0, 5), (3, 10), (10, 10)])
def test_wilson_interval_matches_scipy(successes, n):
    low, high = stats.wilson_interval(successes, n, 0.95)
    reference = scipy.stats.binomtest(successes, n).proportion_ci(0.95, method="wilson")
    assert low == pytest.approx(reference.low, abs=1e-12)
    assert high == pytest.approx(reference.high, abs=1e-12)


def test_percentile_interval_matches_nanpercentile():
    samples = np.random.default_rng(3).normal(size=(4, 6, 50))
    samples[0, 0, :7] = np.nan
    samples[1, 2, :] = np.nan
    for axis in (-1, 0):
        low, high = stats.percentile_interval(samples, 0.9, axis=axis)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns about the all-NaN slice
            expected_low = np.nanpercentile(samples, 5, axis=axis)
            expected_high = np.nanpercentile(samples, 95, axis=axis)
        np.testing.assert_allclose(low, expected_low, equal_nan=True)
        np.testing.assert_allclose(high, expected_high, equal_nan=True)


def test_bootstrap_interval_agrees_with_scipy_bootstrap():
    values = np.random.default_rng(7).normal(10.0, 2.0, size=40)
    table = pd.DataFrame({"cell": "a", "y": values})
    ours = stats.CellBootstrap(table, ["cell"], ["y"], n_resamples=20000, seed=1).interval("y", 0.95).iloc[0]
    reference = scipy.stats.bootstrap(
        (values,), np.mean, n_resamples=20000, method="percentile", confidence_level=0.95, rng=2
    ).confidence_interval
    standard_error = values.std(ddof=1) / np.sqrt(len(values))
    assert ours["ci_boot_low"] == pytest.approx(reference.low, abs=0.05 * standard_error)
    assert ours["ci_boot_high"] == pytest.approx(reference.high, abs=0.05 * standard_error)


def test_bootstrap_skips_missing_values_of_a_metric():
    table = pd.DataFrame({"cell": "a", "y": [2.0, np.nan, 4.0], "z": [1.0, 1.0, 1.0]})
    bootstrap = stats.CellBootstrap(table, ["cell"], ["y", "z"], n_resamples=4000, seed=5)
    y = bootstrap.samples("y")[0]
    finite = y[~np.isnan(y)]
    assert ((finite >= 2.0) & (finite <= 4.0)).all()
    # A resample has no value of y only if it drew the missing trial three times: (1/3)^3.
    assert np.isnan(y).mean() == pytest.approx(1 / 27, abs=0.015)
    assert (bootstrap.samples("z")[0] == 1.0).all()


def test_bootstrap_of_a_group_does_not_depend_on_the_other_groups():
    one = pd.DataFrame({"system": "x", "cell": "a", "y": SAMPLE})
    two = pd.concat([one, pd.DataFrame({"system": "w", "cell": "b", "y": SAMPLE * 3})])
    alone = stats.CellBootstrap(one, ["system", "cell"], ["y"], 500, seed=9).interval("y", 0.95)
    together = stats.CellBootstrap(two, ["system", "cell"], ["y"], 500, seed=9).interval("y", 0.95)
    pd.testing.assert_frame_equal(alone, together.loc[alone.index])


def test_bootstrap_of_no_trials_is_empty():
    empty = pd.DataFrame({"cell": pd.Series([], dtype=str), "y": pd.Series([], dtype=float)})
    bootstrap = stats.CellBootstrap(empty, ["cell"], ["y"], 100, seed=1)
    assert bootstrap.interval("y", 0.95).empty


def nested(data: dict[int, list[float]]) -> pd.DataFrame:
    rows = [(seed, value) for seed, values in data.items() for value in values]
    return pd.DataFrame(rows, columns=["trial", "y"]).assign(cell="a")


def test_variance_components_balanced_by_hand():
    # Seed means 2 and 6 (grand mean 4): MSB = 2 * (4 + 4) = 16; within: MSW = 4 / 2 = 2;
    # seed variance = (MSB - MSW) / 2 = 7, system noise variance = 2.
    components = stats.variance_components(nested({0: [1, 3], 1: [5, 7]}), ["cell"], "trial", ["y"])
    assert components.loc[("a", "y"), "seed_std"] == pytest.approx(np.sqrt(7))
    assert components.loc[("a", "y"), "system_noise_std"] == pytest.approx(np.sqrt(2))


def test_variance_components_unbalanced_by_hand():
    # Means 1.5, 3.5, 5 (grand 3): SSB = 2*2.25 + 2*0.25 + 4 = 9, MSB = 4.5; SSW = 1, MSW = 1/2;
    # n0 = (5 - 9/5) / 2 = 1.6; seed variance = (4.5 - 0.5) / 1.6 = 2.5.
    components = stats.variance_components(nested({0: [1, 2], 1: [3, 4], 2: [5]}), ["cell"], "trial", ["y"])
    assert components.loc[("a", "y"), "seed_std"] == pytest.approx(np.sqrt(2.5))
    assert components.loc[("a", "y"), "system_noise_std"] == pytest.approx(np.sqrt(0.5))


def test_variance_components_recover_simulated_components():
    rng = np.random.default_rng(11)
    seed_effects = rng.normal(0, 2.0, size=400)
    data = {seed: list(effect + rng.normal(0, 0.5, size=3)) for seed, effect in enumerate(seed_effects)}
    components = stats.variance_components(nested(data), ["cell"], "trial", ["y"]).loc[("a", "y")]
    assert components["seed_std"] == pytest.approx(2.0, rel=0.1)
    assert components["system_noise_std"] == pytest.approx(0.5, rel=0.05)


def test_variance_components_need_replicates():
    components = stats.variance_components(nested({0: [1.0], 1: [2.0], 2: [4.0]}), ["cell"], "trial", ["y"])
    assert components[["seed_std", "system_noise_std"]].isna().all(axis=None)
