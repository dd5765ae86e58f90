"""Figures of a campaign, drawn from the tables of mlcampaign.analysis.tables.

Each ``*_figure`` function takes tables and returns a matplotlib Figure; ``write_figures`` writes
them all. Every panel has axis labels with units, a title and, where several series share it, a
legend. A figure whose table is empty says so in the figure instead of being left blank.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on compute or CI nodes

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator, PercentFormatter

from mlcampaign.analysis.capability import CELL_STATUSES
from mlcampaign.analysis.outputs import FIGURE_TABLES
from mlcampaign.analysis.scaling import MODES

STATUS_COLOURS = {
    "ok": "#4daf4a",
    "partial": "#ffbf00",
    "failed": "#e41a1c",
    "not run": "#bdbdbd",
    "expected": "#9ecae1",
    "other site": "#dadaeb",
    "not supported": "#f0f0f0",
}
SI_PREFIXES = [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
DPI = 120


def si_scale(values) -> tuple[float, str]:
    """(divisor, prefix) that brings the largest finite |value| into [1, 1000)."""
    finite = np.abs(np.asarray(values, dtype=float))
    finite = finite[np.isfinite(finite)]
    largest = finite.max() if finite.size else 1.0
    return next(((factor, prefix) for factor, prefix in SI_PREFIXES if largest >= factor), (1.0, ""))


def _entry_label(row) -> str:
    return f"{row.system}\n{row.cell}"


def _empty(message: str) -> Figure:
    """A small figure that says why there is nothing to draw."""
    figure = plt.figure(figsize=(8, 1.5), layout="constrained")
    axes = figure.add_subplot()
    axes.axis("off")
    axes.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=11)
    return figure


def capability_figure(capability: pd.DataFrame) -> Figure:
    """Heatmap: systems x (benchmark, cell), coloured by status, with the outcome written in."""
    columns = capability[["benchmark", "cell"]].drop_duplicates().sort_values(["benchmark", "cell"])
    systems = sorted(capability["system"].unique())
    width = max(6.0, 1.5 * len(columns) + 2)
    figure = plt.figure(figsize=(width, 1.2 * len(systems) + 2.4), layout="constrained")
    axes = figure.add_subplot()
    column_index = {key: i for i, key in enumerate(columns.itertuples(index=False, name=None))}
    status_codes = np.full((len(systems), len(columns)), np.nan)
    for row in capability.itertuples():
        i, j = systems.index(row.system), column_index[(row.benchmark, row.cell)]
        status_codes[i, j] = CELL_STATUSES.index(row.status)
        text = row.outcome.replace(": ", ":\n").replace(", ", "\n")
        axes.text(j, i, text, ha="center", va="center", fontsize=8)
    colours = ListedColormap([STATUS_COLOURS[status] for status in CELL_STATUSES])
    axes.imshow(status_codes, cmap=colours, vmin=-0.5, vmax=len(CELL_STATUSES) - 0.5, aspect="auto")
    axes.set_xticks(range(len(columns)), [f"{b}\n{c}" for b, c in columns.itertuples(index=False)], fontsize=8)
    axes.set_yticks(range(len(systems)), systems)
    axes.set_xlabel("benchmark / cell (scale-precision)")
    axes.set_ylabel("system")
    axes.set_title("Capability matrix: outcome of every planned cell")
    axes.legend(
        handles=[Patch(color=STATUS_COLOURS[status], label=status) for status in CELL_STATUSES],
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        title="cell status",
    )
    return figure


REPEATABILITY_PANELS = {
    "time_to_train_s": "time to train (s)",
    "throughput_samples_per_s": "throughput (samples/s)",
    "epochs_to_target": "epochs to target",
}


def repeatability_figure(planned_trials: pd.DataFrame) -> Figure:
    """Per benchmark (rows) and metric (columns): a box per cell and every ok trial as a point,
    coloured by seed (trial index); same-seed replicates share a colour."""
    ok = planned_trials.loc[planned_trials["status"] == "ok"]
    if ok.empty:
        return _empty("No ok trials: nothing to show (see the capability matrix).")
    benchmarks = sorted(ok["benchmark"].unique())
    entries = ok.drop_duplicates(["benchmark", "system", "cell"])["benchmark"].value_counts()
    figure = plt.figure(
        figsize=(max(10.0, 1.1 * entries.max() * len(REPEATABILITY_PANELS)), 3.6 * len(benchmarks)),
        layout="constrained",
    )
    grid = figure.subplots(len(benchmarks), len(REPEATABILITY_PANELS), squeeze=False)
    seeds = sorted(ok["trial"].unique())
    palette = plt.get_cmap("tab10")
    jitter = np.random.default_rng(0)  # horizontal jitter only, for legibility
    for row_axes, benchmark in zip(grid, benchmarks, strict=True):
        trials = ok.loc[ok["benchmark"] == benchmark]
        entries = trials[["system", "cell"]].drop_duplicates().sort_values(["system", "cell"])
        labels = [_entry_label(entry) for entry in entries.itertuples()]
        for axes, (metric, label) in zip(row_axes, REPEATABILITY_PANELS.items(), strict=True):
            groups = [
                trials.loc[(trials["system"] == e.system) & (trials["cell"] == e.cell), metric].dropna()
                for e in entries.itertuples()
            ]
            axes.boxplot([g.to_numpy() for g in groups], positions=range(len(groups)), widths=0.5, showfliers=False)
            for position, values in enumerate(groups):
                x = position + jitter.uniform(-0.12, 0.12, len(values))
                colours = [palette(seeds.index(seed) % 10) for seed in trials.loc[values.index, "trial"]]
                axes.scatter(x, values, s=18, c=colours, zorder=3)
            axes.set_xticks(range(len(labels)), labels, fontsize=8)
            axes.set_ylabel(label)
            axes.yaxis.set_major_locator(MaxNLocator(integer=metric == "epochs_to_target"))
            axes.set_title(f"{benchmark}: {label}", fontsize=10)
            axes.grid(axis="y", alpha=0.3)
    handles = [
        plt.Line2D([], [], marker="o", linestyle="", color=palette(i % 10), label=f"trial {seed}")
        for i, seed in enumerate(seeds)
    ]
    figure.legend(handles=handles, loc="outside right upper", title="trial (seed)", fontsize=8)
    figure.suptitle("Repeatability: box = quartiles of the ok trials, points = trials (time to train: converged only)")
    return figure


def ranking_figure(ranking: pd.DataFrame) -> Figure:
    """Per benchmark: horizontal bars of mean Valid FLOPS with bootstrap intervals, best on top,
    annotated with the probability that the rank holds."""
    if ranking["rank"].isna().all():
        return _empty("No cell has an ok trial with a Valid FLOPS value: nothing to rank.")
    benchmarks = sorted(ranking["benchmark"].unique())
    heights = [(ranking["benchmark"] == benchmark).sum() for benchmark in benchmarks]
    figure = plt.figure(figsize=(9, 1.0 + 0.6 * sum(heights) + 1.0 * len(heights)), layout="constrained")
    grid = figure.subplots(len(benchmarks), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for axes, benchmark in zip(grid, benchmarks, strict=True):
        rows = ranking.loc[ranking["benchmark"] == benchmark]
        measured = rows.dropna(subset=["rank"])
        unranked = rows.loc[rows["rank"].isna()]
        title = f"{benchmark}: Valid FLOPS ranking"
        if len(unranked):
            title += "\nnot ranked: " + ", ".join(f"{r.system} {r.cell} ({r.status})" for r in unranked.itertuples())
        axes.set_title(title, fontsize=10)
        if measured.empty:
            axes.axis("off")
            continue
        factor, prefix = si_scale(measured[["valid_flops_per_s", "ci_boot_high"]].to_numpy())
        y = np.arange(len(measured))
        mean = measured["valid_flops_per_s"].to_numpy() / factor
        errors = [
            mean - measured["ci_boot_low"].to_numpy() / factor,
            measured["ci_boot_high"].to_numpy() / factor - mean,
        ]
        axes.barh(y, mean, xerr=errors, color="#377eb8", capsize=4, label="mean Valid FLOPS, bootstrap interval")
        for position, row in zip(y, measured.itertuples(), strict=True):
            label = f"  P(rank {row.rank}) = {row.p_rank:.2f}"
            axes.text(row.ci_boot_high / factor, position, label, va="center", fontsize=8)
        axes.set_yticks(
            y, [f"#{row.rank} {row.system} {row.cell} (n={row.n})" for row in measured.itertuples()], fontsize=8
        )
        axes.invert_yaxis()
        axes.set_xlabel(f"Valid FLOPS ({prefix}FLOP/s)")
        axes.set_xlim(0, np.nanmax(measured["ci_boot_high"].to_numpy() / factor) * 1.35)
        axes.grid(axis="x", alpha=0.3)
        axes.legend(loc="lower right", fontsize=8)
    return figure


def _series_label(row, mode: str) -> str:
    batch = MODES[mode]
    parts = [row["system"], row["precision"]]
    parts += [
        row[dimension]
        for dimension, default in (("compression", "none"), ("framework", "torch"), ("backend", "native"))
        if row[dimension] != default
    ]
    return " ".join(str(part) for part in parts) + f", {batch.replace('_', ' ')} {int(row[batch])}"


def scaling_figure(scaling: pd.DataFrame, mode: str) -> Figure:
    """Per benchmark (columns): speedup (top) and parallel efficiency (bottom) against processes,
    one line per series with bootstrap error bars, and the ideal line."""
    if scaling.empty:
        return _empty(f"No cell of this campaign uses {mode} scaling (benchmark training.batch_scaling).")
    benchmarks = sorted(scaling["benchmark"].unique())
    figure = plt.figure(figsize=(max(6.5, 5.5 * len(benchmarks)), 8), layout="constrained")
    grid = figure.subplots(2, len(benchmarks), squeeze=False)
    series_keys = ["system", "precision", "compression", "framework", "backend", MODES[mode]]
    for column, benchmark in enumerate(benchmarks):
        rows = scaling.loc[scaling["benchmark"] == benchmark]
        speedup_axes, efficiency_axes = grid[0, column], grid[1, column]
        processes = np.sort(rows["processes"].unique())
        for _, series in rows.groupby(series_keys, sort=True):
            series = series.sort_values("processes")
            label = _series_label(series.iloc[0], mode)
            for axes, metric in ((speedup_axes, "speedup"), (efficiency_axes, "efficiency")):
                value = series[metric].to_numpy()
                errors = [value - series[f"{metric}_ci_low"].to_numpy(), series[f"{metric}_ci_high"].to_numpy() - value]
                axes.errorbar(series["processes"], value, yerr=errors, marker="o", capsize=4, label=label)
            speedup_axes.plot(
                series["processes"], series["ideal_speedup"], linestyle="--", color="grey", label="_ideal"
            )
        speedup_axes.plot([], [], linestyle="--", color="grey", label="ideal (linear)")
        efficiency_axes.axhline(1.0, linestyle="--", color="grey", label="ideal")
        for axes in (speedup_axes, efficiency_axes):
            axes.set_xscale("log", base=2)
            axes.set_xticks(processes, [str(p) for p in processes])
            axes.set_xlabel("processes (nodes x tasks per node)")
            axes.grid(alpha=0.3)
            axes.legend(fontsize=8)
        speedup_axes.set_ylabel("speedup over the smallest scale (throughput ratio)")
        efficiency_axes.set_ylabel("parallel efficiency (speedup / process ratio)")
        speedup_axes.set_ylim(bottom=0)
        efficiency_axes.set_ylim(bottom=0)
        speedup_axes.set_title(f"{benchmark}: {mode} scaling", fontsize=10)
        if len(processes) == 1:
            speedup_axes.text(
                0.5,
                0.25,
                "one scale measured: it is its own baseline\n(add scales to the campaign's matrix.scales)",
                transform=speedup_axes.transAxes,
                ha="center",
                fontsize=9,
            )
    return figure


TIME_PARTS = {"io_fraction": "data loading", "compute_fraction": "compute", "communication_fraction": "communication"}


def performance_figure(*scaling_tables: pd.DataFrame) -> Figure:
    """Per measured cell of the scaling tables: the split of the training-step time (stacked bars)
    and the achieved fraction of the configured peak FLOP/s (bars with bootstrap intervals)."""
    measured = [table for table in scaling_tables if not table.empty]
    if not measured:
        return _empty("No ok trial with a throughput measurement.")
    cells = pd.concat(measured, ignore_index=True)
    figure = plt.figure(figsize=(13, 2.2 + 0.45 * len(cells)), layout="constrained")
    cells = cells.sort_values(["benchmark", "system", "processes", "cell"])
    split_axes, peak_axes = figure.subplots(1, 2, sharey=True)
    y = np.arange(len(cells))
    left = np.zeros(len(cells))
    for (column, label), colour in zip(TIME_PARTS.items(), ("#ff7f00", "#377eb8", "#984ea3"), strict=True):
        share = cells[column].fillna(0).to_numpy()
        split_axes.barh(y, share, left=left, color=colour, label=label)
        left += share
    split_axes.set_xlim(0, 1)
    split_axes.set_xlabel("share of the measured training-step time")
    split_axes.set_title("Time split (means over ok trials)", fontsize=10)
    split_axes.set_yticks(y, [f"{r.benchmark}  {r.system}  {r.cell}" for r in cells.itertuples()], fontsize=8)
    split_axes.invert_yaxis()
    fraction = cells["fraction_of_peak"].to_numpy() * 100
    errors = [
        fraction - cells["fraction_of_peak_ci_low"].to_numpy() * 100,
        cells["fraction_of_peak_ci_high"].to_numpy() * 100 - fraction,
    ]
    peak_axes.barh(y, fraction, xerr=errors, color="#4daf4a", capsize=4, label="of peak: mean, bootstrap interval")
    peak_axes.set_xlabel("achieved FLOP/s (%) of the configured peak")
    peak_axes.set_title("Fraction of peak", fontsize=10)
    figure.legend(loc="outside lower center", ncol=4, fontsize=8)
    for axes in (split_axes, peak_axes):
        axes.grid(axis="x", alpha=0.3)
    return figure


VERDICT_COLOURS = {
    "regression": "#e41a1c",
    "improvement": "#4daf4a",
    "unchanged": "#377eb8",
    "cannot tell yet": "#999999",
}


def regression_figure(regression: pd.DataFrame, target_change: float) -> Figure:
    """Per metric (columns): each cell's change against the baseline (run / baseline - 1) with its
    interval at the false-alarm rate, coloured by verdict, against the band of +/- ``target_change``
    (the change a cell should be able to detect); cells without a change show their verdict as text
    (the regression table of mlcampaign.analysis.regression)."""
    if regression.empty:
        return _empty("The campaign has no cell to compare with the baseline.")
    metrics = list(dict.fromkeys(regression["metric"]))
    cells = regression[["system", "benchmark", "cell"]].drop_duplicates()
    figure = plt.figure(figsize=(max(8.0, 4.5 * len(metrics) + 2.5), 2.2 + 0.4 * len(cells)), layout="constrained")
    grid = figure.subplots(1, len(metrics), sharey=True, squeeze=False)[0]
    y = {key: i for i, key in enumerate(cells.itertuples(index=False, name=None))}
    for axes, metric in zip(grid, metrics, strict=True):
        rows = regression.loc[regression["metric"] == metric]
        axes.axvspan(-target_change, target_change, color="#dddddd")
        axes.axvline(0.0, color="grey", linewidth=1)
        for row in rows.itertuples():
            position = y[(row.system, row.benchmark, row.cell)]
            if pd.isna(row.relative_change):
                axes.text(0.0, position, row.verdict, ha="center", va="center", fontsize=8, style="italic")
                continue
            colour = VERDICT_COLOURS.get(row.verdict, "#999999")
            errors = [[row.relative_change - row.ci_low], [row.ci_high - row.relative_change]]
            axes.errorbar(row.relative_change, position, xerr=errors, fmt="o", color=colour, capsize=4)
            if row.verdict != "unchanged":
                axes.annotate(
                    row.verdict,
                    (row.ci_high, position),
                    xytext=(4, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=8,
                    color=colour,
                    weight="bold" if row.verdict == "regression" else "normal",
                )
        direction = ", ".join(sorted({f"{d} is better" for d in rows["direction"].dropna()}))
        axes.set_title(f"{metric}\n({direction})", fontsize=10)
        axes.set_xlabel("run / baseline - 1")
        axes.xaxis.set_major_formatter(PercentFormatter(1.0))
        axes.grid(axis="x", alpha=0.3)
    grid[0].set_yticks(list(y.values()), [f"{s} {b}\n{c}" for s, b, c in y], fontsize=8)
    grid[0].invert_yaxis()
    handles = [Patch(color="#dddddd", label=f"within +/-{target_change:.0%} (the target change)")] + [
        plt.Line2D([], [], marker="o", linestyle="", color=colour, label=verdict)
        for verdict, colour in VERDICT_COLOURS.items()
    ]
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8)
    figure.suptitle("Regression check against the baseline: change of the run value with its interval")
    return figure


@dataclasses.dataclass(frozen=True)
class FigureSpec:
    tables: tuple[str, ...]  # names of the tables ``draw`` takes, in order
    draw: Callable[..., Figure]


PUBLISHED_VERDICT_COLOURS = {
    "within published tolerance": "#4daf4a",
    "within CI": "#4daf4a",
    "faster": "#377eb8",
    "slower": "#e41a1c",
}


def published_comparison_figure(table: pd.DataFrame) -> Figure:
    """Measured / published per compared row (log scale, interval whiskers), coloured by verdict;
    the rows without both numbers are listed below with their verdict (the comparison table of
    mlcampaign.analysis.published)."""
    compared = table.loc[table["ratio"].notna()].reset_index(drop=True)
    other = table.loc[table["ratio"].isna()]
    heights = [1.0 + 0.45 * max(len(compared), 1), 0.3 + 0.14 * len(other)]
    figure = plt.figure(figsize=(11, sum(heights)), layout="constrained")
    axes, notes = figure.subplots(2, 1, height_ratios=heights)
    if len(compared):
        published = compared["published"].to_numpy(float)
        ratio = compared["ratio"].to_numpy(float)
        low = compared["measured_ci_low"].to_numpy(float) / published
        high = compared["measured_ci_high"].to_numpy(float) / published
        errors = np.nan_to_num(np.vstack([ratio - low, high - ratio]), nan=0.0)
        positions = np.arange(len(compared))
        axes.errorbar(ratio, positions, xerr=errors, fmt="none", ecolor="#555555", capsize=3)
        axes.scatter(ratio, positions, c=[PUBLISHED_VERDICT_COLOURS[v] for v in compared["verdict"]], zorder=3)
        labels = [
            f"{r.system} {r.benchmark} {r.cell}: {r.verdict}\nvs {r.published_system}, {r.published_metric}"
            for r in compared.itertuples()
        ]
        axes.set_yticks(positions, labels, fontsize=7)
        axes.set_xscale("log")
        axes.axvline(1.0, color="black", linewidth=0.8)
        axes.set_xlabel("measured / published (1 = equal; whiskers: interval of the measured mean)")
    else:
        axes.set_axis_off()
        axes.text(0.5, 0.5, "No measured cell has a published number to compare with.", ha="center", va="center")
    axes.set_title("Measured cells beside published numbers")
    notes.set_axis_off()
    lines = [
        " ".join(str(part) for part in (r.system, r.benchmark, r.cell, r.published_metric) if pd.notna(part) and part)
        + f": {r.verdict}"
        for r in other.itertuples()
    ]
    notes.text(0, 1, "Not compared:\n" + "\n".join(lines or ["none"]), fontsize=6, va="top", transform=notes.transAxes)
    return figure


# Each figure of mlcampaign.analysis.outputs.FIGURE_TABLES with its drawing function.
FIGURES = {
    name: FigureSpec(FIGURE_TABLES[name], draw)
    for name, draw in {
        "capability": capability_figure,
        "repeatability": repeatability_figure,
        "ranking": ranking_figure,
        "scaling_strong": functools.partial(scaling_figure, mode="strong"),
        "scaling_weak": functools.partial(scaling_figure, mode="weak"),
        "performance": performance_figure,
    }.items()
}


def save_figure(figure: Figure, path: str | Path) -> None:
    """Write ``figure`` as PNG at the figures' resolution and free it."""
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


def write_figures(tables: Mapping[str, pd.DataFrame], paths: Mapping[str, str | Path]) -> None:
    """Draw and save (PNG) each figure of FIGURES that ``paths`` names, from ``tables`` by name."""
    for name, path in paths.items():
        spec = FIGURES[name]
        save_figure(spec.draw(*(tables[table] for table in spec.tables)), path)
