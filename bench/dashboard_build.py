"""Build the campaign-history dashboard from a year of synthetic weekly runs, and time it.

    .venv/bin/python bench/dashboard_build.py              # 52 weeks x 200 cells, then headless chromium
    .venv/bin/python bench/dashboard_build.py --no-browser # build time only

Data (generated before the clock starts, no results store): 4 systems at 2 sites (2 systems each)
x 5 benchmarks x 10 cells = 200 cells, 3-5 seeded trials per cell (fixed per cell, as a campaign
plans them), one run per site per week for 52 weeks: every cell has 52 points. 2 % of the trials
fail. One system is 25 % slower from week 30 on, with a torch upgrade in its records, so that the
site has changes to show. Records are tests/synthetic_records.py's (random draws shaped like
real records, describing no machine).

Goals: the build (trends, change detection, merged tables of the latest runs, every page) in
<= 30 s; the largest page interactive in <= 2 s in headless chromium, measured as the time from
navigation start to the page's ready marker (``window.dashboardReadyMs``: performance.now() once
every plot is drawn), median of 3 loads, the first load of each page included.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # tests/synthetic_records.py

from synthetic_records import synthetic_history

SCALES = ["1x1", "1x2", "1x4", "2x4", "4x4"]
PRECISIONS = ["fp32", "bf16"]


def load_times_ms(site: Path, pages: list[Path], loads: int) -> dict[str, list[float]]:
    """Navigation start to the ready marker of each page, ``loads`` times each, in headless chromium."""
    from tests.browser import headless_chromium, wait_until_ready

    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as profile, headless_chromium(Path(profile)) as browser:
        for _ in range(loads):
            for page in pages:
                browser.get(page.resolve().as_uri())
                times.setdefault(page.name, []).append(wait_until_ready(browser))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weeks", type=int, default=52)
    parser.add_argument("--loads", type=int, default=3, help="loads of each page in the browser")
    parser.add_argument("--no-browser", action="store_true", help="build time only")
    parser.add_argument("--keep", type=Path, help="also copy the site here")
    args = parser.parse_args()
    from mlcampaign.history.dashboard import build_site

    sites = {"site-a": ["alpha-cpu", "alpha-gpu"], "site-b": ["beta-cpu", "beta-gpu"]}
    benchmarks = [f"bench{index}" for index in range(5)]
    cells = [(scale, precision) for scale in SCALES for precision in PRECISIONS]
    generated = time.perf_counter()
    manifests, records = synthetic_history(
        sites, benchmarks, cells, args.weeks, slowdowns={"beta-gpu": (30, 0.75)}, failure_rate=0.02, seed=1
    )
    generated = time.perf_counter() - generated
    cell_count = len({(r["system"], r["benchmark"], r["cell"]) for r in manifests[0]["plan"]})
    print(
        f"{len(manifests)} runs ({args.weeks} weeks x {len(sites)} sites), {cell_count} cells, "
        f"{len(records)} records (generated in {generated:.1f} s, not timed)"
    )
    with tempfile.TemporaryDirectory() as directory:
        site = Path(directory) / "site"
        start, start_cpu = time.perf_counter(), time.process_time()
        pages = build_site(site, manifests, records)
        build_s, build_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
        # CPU time too: on a shared machine the wall time also counts other people's work.
        print(f"build: {build_s:.2f} s wall, {build_cpu_s:.2f} s CPU; goal <= 30 s: ratio {build_s / 30:.2f}")
        sizes = sorted(((path.stat().st_size, path) for path in pages), reverse=True)
        total = sum(path.stat().st_size for path in site.rglob("*") if path.is_file())
        plotly_js = (site / "assets" / "plotly.min.js").stat().st_size
        print(f"{len(pages)} pages, site {total / 1e6:.1f} MB (plotly.js {plotly_js / 1e6:.1f} MB of it)")
        print("largest pages: " + ", ".join(f"{path.name} {size / 1e3:.0f} kB" for size, path in sizes[:3]))
        if args.keep:
            shutil.copytree(site, args.keep, dirs_exist_ok=True)
        if args.no_browser:
            return
        times = load_times_ms(site, pages, args.loads)
        medians = {name: statistics.median(values) for name, values in times.items()}
        slowest = max(medians, key=medians.get)
        print(f"time to interactive (navigation start to ready marker), median of {args.loads} loads:")
        for name, median in sorted(medians.items(), key=lambda item: -item[1])[:5]:
            print(f"  {name}: {median:.0f} ms (loads: {', '.join(f'{value:.0f}' for value in times[name])} ms)")
        for label, name in (("largest", sizes[0][1].name), ("slowest", slowest)):
            print(f"{label} page {name}: {medians[name]:.0f} ms; goal <= 2000 ms: ratio {medians[name] / 2000:.2f}")


if __name__ == "__main__":
    main()
