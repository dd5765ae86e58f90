"""Numbers a person reads: quantities in human units (8.18 GFLOP/s, 1.21 TFLOP/s, 12.3 GB/s, 1,234 samples/s,
3 min 12 s, 4.43 ms), one module for the dashboard (mlcampaign.history.dashboard) and the HTML report's
table views (mlcampaign.analysis.tables.html_view). The tables and JSON keep full precision."""

from __future__ import annotations

import math

import pandas as pd

from mlcampaign.plan.canaries import CANARIES, COLUMN_PREFIX
from mlcampaign.plan.metrics import METRICS

# Units that take an SI prefix (8.18 GFLOP/s, 12.3 kJ); counts per second and per joule are written out
# (1,234 samples/s) up to a million, where a prefix is easier to read than the digits.
_PREFIXED = ("FLOP/s", "FLOP", "FLOP/J", "J", "W", "B/s")
_COUNTS = ("samples/s", "samples", "samples/J", "accelerator-minutes", "node-minutes")
_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_SMALL = ((1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))
# Statistics columns of long tables (one row per cell and metric): in the unit of the row's metric.
_STATISTICS = ("mean", "median", "std", "min", "max", "olympic_mean", "ci_t_low", "ci_t_high", "ci_boot_low")
_STATISTICS += ("ci_boot_high", "seed_std", "system_noise_std", "value", "baseline_value")
_SUFFIXES = ("_ci_low", "_ci_high", "_min", "_median", "_max", "_mean")


def _significant(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits, without an exponent and without trailing zeros."""
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}".rstrip("0").rstrip(".") if decimals else f"{value:,.0f}"


def _prefixed(value: float, unit: str, digits: int) -> str:
    for factor, prefix in _PREFIXES:
        if abs(value) >= factor * 0.9995:
            return f"{_significant(value / factor, digits)} {prefix}{unit}"
    if 0 < abs(value) < 1 and unit in ("J", "W"):
        for factor, prefix in _SMALL:
            if abs(value) >= factor * 0.9995:
                return f"{_significant(value / factor, digits)} {prefix}{unit}"
    return f"{_significant(value, digits)} {unit}"


def duration(seconds: float) -> str:
    """A time span as a person says it: 850 ms, 12.3 s, 3 min 12 s, 2 h 05 min, 3 d 4 h."""
    if seconds < 0:
        return f"-{duration(-seconds)}"
    if seconds == 0:
        return "0 s"
    if seconds < 1:
        for factor, prefix in _SMALL:
            if seconds >= factor * 0.9995 or factor == _SMALL[-1][0]:
                return f"{_significant(seconds / factor, 3)} {prefix}s"
    if seconds < 59.95:
        return f"{_significant(seconds, 3)} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def quantity(value, unit: str, digits: int = 3) -> str:
    """``value`` in ``unit`` for a reader ("" for a missing value): seconds as durations, FLOP/s and
    energy with SI prefixes, counts with thousands separators, anything else to 4 significant digits."""
    if value is None or isinstance(value, bool) or pd.isna(value):
        return "" if value is None or not isinstance(value, bool) else str(value)
    value = float(value)
    if unit == "s":
        return duration(value)
    if unit in _PREFIXED:
        return _prefixed(value, unit, digits)
    if unit in _COUNTS:
        return (
            _prefixed(value, f" {unit}", digits).replace("  ", " ")
            if abs(value) >= 1e6
            else f"{_significant(value, 4)} {unit}"
        )
    text = _significant(value, 4) if 1e-3 <= abs(value) < 1e6 or value == 0 else f"{value:.4g}"
    return f"{text} {unit}" if unit and unit != "target metric" else text


def metric_quantity(value, metric: str) -> str:
    """A value of ``metric`` (mlcampaign.plan.metrics.METRICS) in its unit."""
    return quantity(value, METRICS[metric].unit if metric in METRICS else "")


def column_unit(column: str, interval_metric: str | None = None) -> str | None:
    """The unit of a table column named after a metric or a canary (``canary.<name>``), or after a metric and a
    statistic (``throughput_samples_per_s_ci_low``); ``interval_metric``: the metric of the table's unqualified
    interval columns (the ranking's ``ci_boot_low``). None: not a metric's column."""
    if column in METRICS:
        return METRICS[column].unit
    if column.removeprefix(COLUMN_PREFIX) in CANARIES:
        return CANARIES[column.removeprefix(COLUMN_PREFIX)].unit
    for suffix in _SUFFIXES:
        if column.endswith(suffix) and column.removesuffix(suffix) in METRICS:
            return METRICS[column.removesuffix(suffix)].unit
    if interval_metric is not None and column in ("ci_boot_low", "ci_boot_high", "ci_low", "ci_high"):
        return METRICS[interval_metric].unit
    return None


def readable(table: pd.DataFrame, interval_metric: str | None = None) -> pd.DataFrame:
    """``table`` with its metric columns as text in human units (the report's table views): columns
    named after a metric, and in long tables (a ``metric`` column) the statistics of each row's metric."""
    shown = table.copy()
    long = "metric" in table.columns
    for column in table.columns:
        if long and column in _STATISTICS:
            shown[column] = [
                metric_quantity(value, metric) for value, metric in zip(table[column], table["metric"], strict=True)
            ]
            continue
        unit = column_unit(column, interval_metric)
        if (
            unit is not None
            and pd.api.types.is_numeric_dtype(table[column])
            and not pd.api.types.is_bool_dtype(table[column])
        ):
            shown[column] = [quantity(value, unit) for value in table[column]]
    return shown
