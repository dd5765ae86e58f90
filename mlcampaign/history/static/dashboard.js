"use strict";
// The dashboard's pages: filters, plotly figures and the run diff, all built from the JSON the page
// carries (no request leaves the page, so it works from file:// as from a web server).

const DATA = JSON.parse(document.getElementById("page-data").textContent);
const PLOT_CONFIG = { displaylogo: false, responsive: true };
const VERDICT_STYLE = {
  regression: { color: "#c0392b", symbol: "triangle-down" },
  improvement: { color: "#1e8449", symbol: "triangle-up" },
  "not measured": { color: "#7f8c8d", symbol: "x" },
};

function escapeHtml(text) {
  return String(text).replace(/[&<>"]/g, (character) => `&#${character.charCodeAt(0)};`);
}

function percent(change) {
  return change === null ? "" : `${change >= 0 ? "+" : ""}${(change * 100).toFixed(1)} %`;
}

// Hide every [data-filterable] element whose data attribute disagrees with a set filter control
// ([data-filter] names the attribute; data-match="contains" matches a substring).
function applyFilters() {
  const controls = [...document.querySelectorAll("[data-filter]")].filter((control) => control.value !== "");
  for (const item of document.querySelectorAll("[data-filterable]")) {
    const hidden = controls.some((control) => {
      const value = item.dataset[control.dataset.filter];
      if (value === undefined) return false;
      return control.dataset.match === "contains" ? !value.includes(control.value) : value !== control.value;
    });
    if (item.hidden === hidden) continue;
    item.hidden = hidden;
    // A plot drawn while hidden has no size: give it one now.
    if (!hidden) for (const plot of item.querySelectorAll(".js-plotly-plot")) Plotly.Plots.resize(plot);
  }
}

function changeText(change) {
  const interval = change.ci_low === null ? "" : ` [${percent(change.ci_low)}, ${percent(change.ci_high)}]`;
  const p = change.p_value === null ? "" : `, p = ${change.p_value.toPrecision(2)}`;
  const stack = (change.stack_changes || []).slice(0, 12).map(
    (entry) => `${escapeHtml(entry.key)}: ${escapeHtml(entry.before)} → ${escapeHtml(entry.after)}`,
  );
  const since = change.previous_run_id === null ? "" : ` (since ${escapeHtml(change.previous_run_id)})`;
  return [
    `<b>${escapeHtml(change.verdict)}</b> (${escapeHtml(change.kind)}) started in ${escapeHtml(change.change_start_run_id || change.run_id)}, found at ${escapeHtml(change.run_id)}`,
    `${percent(change.relative_change)}${interval}${p}`,
    escapeHtml(change.detail),
    stack.length ? `stack${since}: ${stack.join("<br>")}` : "no difference in the recorded stack",
  ].join("<br>");
}

function historyText(found) {
  return [
    `<b>${escapeHtml(found.verdict)}</b> started in ${escapeHtml(found.run_id)} (whole history; found at ${escapeHtml(found.first_found_run_id)})`,
    `${percent(found.relative_change)}, p = ${found.p_value.toPrecision(2)}`,
  ].join("<br>");
}

function trendFigure(cell, metric) {
  const series = cell.series[metric];
  const x = series.run_id;
  // The quality metric is in the unit of the benchmark's target metric (e.g. top-1 accuracy).
  const label = DATA.metric_labels[metric] + (metric === "achieved_quality" ? ` (${cell.target_metric})` : "");
  const traces = [
    { x, y: series.ci_high, mode: "lines", line: { width: 0 }, hoverinfo: "skip", showlegend: false },
    {
      x, y: series.ci_low, mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: "rgba(31, 119, 180, 0.2)",
      name: "t interval of the mean", hoverinfo: "skip",
    },
    {
      x, y: series.mean, mode: "lines+markers", name: "mean", line: { color: "#1f77b4" },
      customdata: series.n.map((n, index) => [n, series.text[index], series.contended[index], series.verdict[index] || ""]),
      hovertemplate: "%{x}<br>mean %{customdata[1]}<br>n = %{customdata[0]} (%{customdata[2]} contended)<br>%{customdata[3]}<extra></extra>",
    },
    {
      x, y: series.value, mode: "markers", name: "run value", marker: { symbol: "diamond-open", color: "#555" },
      hovertemplate: "%{x}<br>run value %{y:.4g}<extra></extra>",
    },
  ];
  const measured = series.mean.filter((value) => value !== null);
  const floor = measured.length ? Math.min(...measured) : 0;
  const shapes = [];
  // A change is marked at the run in which it started (the per-run test may confirm it a few runs later).
  const startOf = (change) => change.change_start_run_id || change.run_id;
  for (const [verdict, style] of Object.entries(VERDICT_STYLE)) {
    const changes = series.changes.filter((change) => change.verdict === verdict);
    if (!changes.length) continue;
    const y = changes.map((change) => series.mean[x.indexOf(startOf(change))] ?? floor);
    traces.push({
      x: changes.map(startOf), y, mode: "markers", name: verdict,
      marker: { symbol: style.symbol, size: 13, color: style.color }, text: changes.map(changeText),
      hovertemplate: "%{text}<extra></extra>",
    });
    for (const change of changes) {
      shapes.push({
        type: "line", xref: "x", yref: "paper", x0: startOf(change), x1: startOf(change), y0: 0, y1: 1,
        line: { color: style.color, dash: "dot", width: 1 },
      });
    }
  }
  if (series.history.length) {
    traces.push({
      x: series.history.map((found) => found.run_id),
      y: series.history.map((found) => series.mean[x.indexOf(found.run_id)] ?? floor),
      mode: "markers", name: "history change point", marker: { symbol: "star-diamond", size: 12, color: "#8e44ad" },
      text: series.history.map(historyText), hovertemplate: "%{text}<extra></extra>",
    });
    for (const found of series.history) {
      shapes.push({
        type: "line", xref: "x", yref: "paper", x0: found.run_id, x1: found.run_id, y0: 0, y1: 1,
        line: { color: "#8e44ad", dash: "dash", width: 1 },
      });
    }
  }
  if (series.baseline_value !== null) {
    shapes.push({
      type: "line", xref: "paper", x0: 0, x1: 1, y0: series.baseline_value, y1: series.baseline_value,
      line: { color: "#117a65", dash: "dash", width: 1 },
    });
    traces.push({ x: [null], y: [null], mode: "lines", name: "baseline value", line: { color: "#117a65", dash: "dash" } });
  }
  const layout = {
    height: 340, margin: { l: 80, r: 20, t: 30, b: 110 }, shapes,
    xaxis: { title: { text: "run (start order)" }, type: "category", categoryorder: "array", categoryarray: x },
    yaxis: { title: { text: label }, exponentformat: "SI" },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
  };
  return { data: traces, layout };
}

function drawTrends() {
  const select = document.getElementById("metric");
  const plots = [...document.querySelectorAll(".trend-plot")];
  const draw = (plot) => (div) => {
    const figure = trendFigure(DATA.cells[Number(div.dataset.cellIndex)], select.value);
    return plot(div, figure.data, figure.layout, PLOT_CONFIG);
  };
  // Under each plot, what the cell's history can detect for the metric shown.
  const showDetectability = () => {
    for (const item of document.querySelectorAll(".detectability li")) item.hidden = item.dataset.metric !== select.value;
  };
  select.addEventListener("change", () => {
    showDetectability();
    plots.forEach(draw(Plotly.react));
  });
  showDetectability();
  return plots.map(draw(Plotly.newPlot));
}

function drawOverview() {
  return [...document.querySelectorAll(".ranking-plot")].map((div) => {
    const ranked = DATA.rankings[Number(div.dataset.rankingIndex)].rows.filter((row) => row.rank !== null);
    const mean = ranked.map((row) => row.valid_flops_per_s);
    // Published MLPerf HPC entries (origin "published") are ranked beside the cells, in their own colour.
    const published = ranked.map((row) => row.origin === "published");
    const trace = {
      type: "bar", orientation: "h", x: mean,
      y: ranked.map((row, index) => `${row.rank}. ${published[index] ? "[published] " : ""}${row.system} ${row.cell}`),
      marker: { color: published.map((flag) => (flag ? "#8e44ad" : "#1f77b4")) },
      error_x: {
        type: "data", symmetric: false,
        array: ranked.map((row, index) => row.ci_boot_high - mean[index]),
        arrayminus: ranked.map((row, index) => mean[index] - row.ci_boot_low),
      },
      customdata: ranked.map((row) => [row.p_rank, row.valid_flops_text, row.contended_badge]),
      hovertemplate: "%{y}<br>%{customdata[1]}<br>P(rank) = %{customdata[0]:.2f}<br>%{customdata[2]}<extra></extra>",
    };
    const layout = {
      height: 80 + 22 * ranked.length, margin: { l: 220, r: 20, t: 10, b: 50 },
      xaxis: { title: { text: "Valid FLOPS, mean with bootstrap interval (FLOP/s)" }, exponentformat: "SI" },
      yaxis: { autorange: "reversed", type: "category" },
    };
    return Plotly.newPlot(div, [trace], layout, PLOT_CONFIG);
  });
}

// One plot per canary of the system: each cell's run values, and the machine's level over them (in the canary's unit).
function drawMachine() {
  return [...document.querySelectorAll(".machine-plot")].map((div) => {
    const section = DATA.machine[Number(div.dataset.canaryIndex)];
    const trace = (series, style) => ({
      x: series.run_id, y: series.level, name: series.name, customdata: series.text, ...style,
      hovertemplate: `${escapeHtml(series.name)} %{x}<br>%{customdata}<extra></extra>`,
    });
    const traces = section.cells.map((series) => trace(series, { mode: "lines+markers", opacity: 0.6 }));
    traces.push(trace(section.machine, { mode: "lines+markers", line: { color: "#222", width: 3 } }));
    const layout = {
      height: 360, margin: { l: 90, r: 20, t: 10, b: 110 },
      xaxis: { title: { text: "run (start order)" }, type: "category" },
      yaxis: { title: { text: section.unit }, exponentformat: "SI" },
      legend: { orientation: "h", x: 0, y: -0.35 }, showlegend: section.cells.length <= 12,
    };
    return Plotly.newPlot(div, traces, layout, PLOT_CONFIG);
  });
}

function drawSystem() {
  const machine = drawMachine();
  const div = document.getElementById("relative-throughput");
  if (div === null) return machine;
  const traces = DATA.relative_throughput.map((series) => ({
    x: series.run_id, y: series.relative, mode: "lines+markers", name: series.benchmark,
    hovertemplate: `${escapeHtml(series.benchmark)} %{x}<br>%{y:.3f}<extra></extra>`,
  }));
  const layout = {
    height: 380, margin: { l: 80, r: 20, t: 30, b: 110 },
    xaxis: { title: { text: "run (start order)" }, type: "category" },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    yaxis: { title: { text: "median throughput / the cell's first run (ratio)" } },
  };
  return [...machine, Plotly.newPlot(div, traces, layout, PLOT_CONFIG)];
}

function shown(values) {
  return values === undefined ? "(absent)" : values.map((value) => JSON.stringify(value)).join(", ");
}

function renderDiff(first, second) {
  const left = DATA.fingerprints[first] || {};
  const right = DATA.fingerprints[second] || {};
  const rows = [];
  for (const system of [...new Set([...Object.keys(left), ...Object.keys(right)])].sort()) {
    if (!left[system] || !right[system]) {
      rows.push([system, "(whether the run ran it)", left[system] ? "ran" : "not run", right[system] ? "ran" : "not run"]);
      continue;
    }
    for (const key of [...new Set([...Object.keys(left[system]), ...Object.keys(right[system])])].sort()) {
      const before = shown(left[system][key]);
      const after = shown(right[system][key]);
      if (before !== after) rows.push([system, key, before, after]);
    }
  }
  document.getElementById("diff-rows").replaceChildren(...rows.map((cells) => {
    const row = document.createElement("tr");
    row.dataset.filterable = "";
    row.dataset.system = cells[0];
    for (const text of cells) row.insertCell().textContent = text;
    return row;
  }));
  document.getElementById("diff-count").textContent = `${rows.length} difference(s)`;
  applyFilters();
}

function setUpRuns() {
  const [first, second] = [document.getElementById("run-a"), document.getElementById("run-b")];
  [first.value, second.value] = DATA.first_pair;
  for (const select of [first, second]) select.addEventListener("change", () => renderDiff(first.value, second.value));
  renderDiff(first.value, second.value);
  return [];
}

const PAGES = { overview: drawOverview, system: drawSystem, trends: drawTrends, runs: setUpRuns };
for (const control of document.querySelectorAll("[data-filter]")) control.addEventListener("input", applyFilters);
Promise.all(PAGES[document.body.dataset.page]()).then(() => {
  applyFilters();
  // The moment every plot is drawn, for tests and the bench (ms since navigation start).
  window.dashboardReadyMs = performance.now();
  document.body.dataset.ready = "true";
});
