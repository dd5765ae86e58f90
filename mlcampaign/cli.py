"""The project's one command line: ``mlcampaign <command>`` (also ``python -m mlcampaign``; ``--help`` on each).

    check FILE...                      a campaign file, strictly: YAML (line of the error), schema, plan
    ingest RUN_DIR                     a run's manifest and records into the results store
    runs list | show RUN | diff A B    the runs in the store; one run; what changed between two
    compare A B                        every cell and metric of run B judged on its site's runs from A to B
    summary RUN                        what a run came to, as JSON; the exit status says it (below)
    export RUN --out FILE              a run as one bundle file (from the store, or a run folder)
    import BUNDLE [--supersede]        a bundle into the store (or a results folder)
    dashboard --out DIR                the static dashboard of a campaign's runs
    tables CAMPAIGN --out DIR          the campaign's tables over the latest run of every site (or --runs)
    baseline promote | show            the accepted baselines (mlcampaign.analysis.baseline)
    valid-flops --time T ...           HPC AI500 Valid FLOPS of one training run (a published entry's numbers)
    import-mlperf FOLDER               an MLPerf HPC results round into the store, as published runs
    published list | show RUN          the published MLPerf HPC results in the store; one published run
    export-mlperf RUN_DIR --out DIR    a run as an MLPerf HPC submission folder (package_checker accepts it)
    reproduce FOLDER --system S ...    a campaign file that re-runs a published submission's settings here

The results store is ``--store URL``, else the environment's ``MLCAMPAIGN_STORE``, else the embedded
store ``sqlite:///results/history.db`` (mlcampaign.plan.urls: URL forms, the default; credentials come
from the environment, never from a URL).

Exit status: 0 done (``summary``: no regression, no failed trial, every judged cell can tell); 1
``summary``: a regression (a system change at this run, a convergence regression, a change the
whole-history detector found now, or against the baseline) or a cell that was measured before and not
now (the cells of an alert group that matters); 3 ``summary``: no regression, but failed or not-run
trials; 4 ``summary``: none of those, but cells whose history cannot tell yet whether they changed by the
campaign's target change (``cannot_tell``), or cells that could not be judged at all (``unjudged``: ok
trials, no value to judge: never 0); 2 a usage error, input that was refused, or a file that cannot be
read or written (the message says what and where). Any other error is 2 too (with its traceback: a bug to report),
never 1. Messages never show a URL's password.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_FAILED_TRIALS, EXIT_CANNOT_TELL = 0, 1, 2, 3, 4


class CommandError(Exception):
    """A command that cannot be done as asked; the message says why."""


def _store(arguments):
    from mlcampaign.history.store import open_store

    return open_store(arguments.store, create=arguments.command in ("ingest", "import", "import-mlperf"))


def _check(arguments) -> int:
    from mlcampaign.plan.config import load_campaign
    from mlcampaign.plan.config_files import load_yaml

    config = {}
    for path in arguments.files:
        config |= load_yaml(Path(path))
    campaign = load_campaign(config, Path(arguments.config_dir), ", ".join(arguments.files))
    trials = campaign.trial_matrix()
    print(f"{', '.join(arguments.files)}: campaign {campaign.name}: {len(trials)} trials planned, valid")
    return EXIT_OK


def _say_warnings(arguments, result) -> None:
    for warning in result.warnings:
        print(f"mlcampaign {arguments.command}: warning: {warning}", file=sys.stderr)


def _ingest(arguments) -> int:
    from mlcampaign.history.bundle import ingest_run_directory

    with _store(arguments) as store:
        # A site's own run folder continues its run; an imported one never supersedes (ingest_run_directory).
        result = ingest_run_directory(Path(arguments.run_dir), store)
    print(json.dumps(result.__dict__ | {"store": store.url}))
    _say_warnings(arguments, result)
    return EXIT_OK


def _runs(arguments) -> int:
    with _store(arguments) as store:
        if arguments.action == "list":
            for run in store.list_runs(campaign=arguments.campaign, site=arguments.site):
                print(
                    f"{run.run_id}\t{run.campaign}\t{run.site}\t{run.started_utc}\t{run.records} records\t"
                    f"{run.workflow_commit or '-'}"
                )
        elif arguments.action == "show":
            from mlcampaign.history.summary import run_summary_of

            if len(arguments.runs) != 1:
                raise CommandError(f"runs show takes one run id, not {len(arguments.runs)}")
            print(json.dumps(run_summary_of(store, arguments.runs[0], None), indent=1))
        else:
            from mlcampaign.history.stack_changes import cell_fingerprints, stack_diff, system_fingerprints

            if len(arguments.runs) != 2:
                raise CommandError("runs diff takes two run ids")
            manifests = [store.manifest(run_id) for run_id in arguments.runs]
            records = store.records(arguments.runs)
            systems = system_fingerprints(cell_fingerprints(manifests, records))
            before, after = (systems.get(run_id, {}) for run_id in arguments.runs)
            for system in sorted(set(before) | set(after)):
                changes = stack_diff(before.get(system, {}), after.get(system, {}))
                for change in changes:
                    print(f"{system}\t{change['key']}\t{change['before']}\t{change['after']}")
                if not changes:
                    print(f"{system}\t(no difference)")
    return EXIT_OK


def _summary_command(arguments) -> int:
    from mlcampaign.history.summary import run_summary_of

    with _store(arguments) as store:
        summary = run_summary_of(store, arguments.run, arguments.baseline_dir)
    print(json.dumps(summary, indent=1))
    return summary_status(summary)


def summary_status(summary: dict) -> int:
    """The exit status of ``mlcampaign summary`` for a run summary (module docstring)."""
    counts = summary["counts"]
    # The listings that matter: every regression of these counts is a cell of an alert group that matters.
    regressed = ("regressions", "convergence_regressions", "history_regressions", "not_measured")
    if any(counts[key] for key in regressed) or counts.get("baseline_regressions"):
        return EXIT_REGRESSION
    trials = summary["trials"]
    if trials["failed"] or trials["not_run"]:
        return EXIT_FAILED_TRIALS
    return EXIT_CANNOT_TELL if counts["cannot_tell"] or counts.get("unjudged") else EXIT_OK


def _compare(arguments) -> int:
    import pandas as pd

    from mlcampaign.history.summary import history_until, trends_of

    earlier, later = arguments.runs
    with _store(arguments) as store:
        trends = trends_of(store, history_until(store, later, since=earlier))
    changes = trends.changes.loc[trends.changes["run_id"] == later].copy()
    if changes.empty:
        print(f"run {later} has no judged cell")
        return EXIT_OK
    changes["change"] = changes["relative_change"].map(lambda value: "" if pd.isna(value) else f"{value:+.1%}")
    changes["detectable"] = changes["smallest_detectable"].map(lambda value: "" if pd.isna(value) else f"{value:.1%}")
    columns = ["system", "benchmark", "cell", "metric", "verdict", "change", "p_value", "detectable", "detail"]
    print(f"run {later} judged on the runs of its site from {earlier} ({trends.runs[0]['run_id']} on):")
    print(changes[columns].to_string(index=False))
    return EXIT_OK


def _export(arguments) -> int:
    from mlcampaign.history.bundle import export_run_directory, export_store_run

    if Path(arguments.run).is_dir():
        path = export_run_directory(Path(arguments.run), Path(arguments.out))
    else:
        with _store(arguments) as store:
            path = export_store_run(store, arguments.run, Path(arguments.out))
    print(path)
    return EXIT_OK


def _import(arguments) -> int:
    from mlcampaign.history.bundle import import_into_results, import_into_store

    if arguments.results:
        if arguments.supersede:
            raise CommandError("--supersede applies to an import into the store; --results never replaces a file")
        for path in import_into_results(Path(arguments.bundle), Path(arguments.results)):
            print(path)
        return EXIT_OK
    with _store(arguments) as store:
        result = import_into_store(Path(arguments.bundle), store, supersede=arguments.supersede)
    print(json.dumps(result.__dict__ | {"store": store.url}))
    _say_warnings(arguments, result)
    return EXIT_OK


def _dashboard(arguments) -> int:
    from mlcampaign.history.dashboard import build_from_store

    print(build_from_store(arguments.store, arguments.campaign, Path(arguments.out), arguments.baseline_dir)[0])
    return EXIT_OK


def _tables(arguments) -> int:
    """The analysis tables of a selection of runs from the store: the latest run of the campaign at
    every site (or the runs named), merged as one campaign (mlcampaign.history.merge.merged_tables)."""
    from mlcampaign.analysis.outputs import TABLE_FORMATS
    from mlcampaign.analysis.tables import write_tables
    from mlcampaign.history.merge import AnalysisSettings, latest_runs, merged_tables, runs_by_id

    with _store(arguments) as store:
        manifests = [store.manifest(run.run_id) for run in store.list_runs(campaign=arguments.campaign)]
        if not manifests:
            raise CommandError(f"results store {store.url} holds no run of campaign {arguments.campaign!r}")
        if arguments.runs:
            selected = runs_by_id(manifests, arguments.runs)
        else:
            selected = latest_runs(manifests, arguments.campaign)
        records = store.records([manifest["run_id"] for manifest in selected])
        published = store.published_results()  # imported MLPerf HPC rounds, ranked beside the runs
    tables = merged_tables(selected, records, AnalysisSettings.from_manifest(selected[-1]), published)
    out = Path(arguments.out)
    out.mkdir(parents=True, exist_ok=True)
    write_tables(tables, {name: {fmt: out / f"{name}.{fmt}" for fmt in TABLE_FORMATS} for name in tables})
    print(f"{out}: {len(tables)} tables of runs {', '.join(manifest['run_id'] for manifest in selected)}")
    return EXIT_OK


def _baseline(arguments) -> int:
    from mlcampaign.analysis import baseline

    if arguments.action == "promote":
        campaign, samples, without_ok = baseline.read_campaign(arguments.campaign_dir)
        chosen = baseline.select_cells(samples, arguments.cells)
        promoted = baseline.promote(arguments.baseline_dir, chosen, campaign, note=arguments.note)
        print(f"promoted {len(promoted)} cell(s), {len(chosen)} trial(s), into {arguments.baseline_dir}:")
        print(promoted.to_string(index=False))
        if without_ok:
            print(f"not promoted, no ok trial: {', '.join(without_ok)}")
    else:
        print(baseline.summary(baseline.load_store(arguments.baseline_dir), arguments.history).to_string(index=False))
    return EXIT_OK


def _valid_flops(arguments) -> int:
    import math

    from mlcampaign.analysis.valid_flops import valid_flops
    from mlcampaign.plan.numbers import check_number

    if (arguments.flops_per_sample is None) != (arguments.samples is None):
        raise CommandError("--flops-per-sample and --samples go together (or give the run's --flops)")
    flops = arguments.flops if arguments.flops is not None else arguments.flops_per_sample * arguments.samples
    try:
        check_number(flops, "FLOP", "--flops" if arguments.flops is not None else "--flops-per-sample x --samples")
        result = valid_flops(
            flops,
            arguments.time,
            arguments.achieved,
            arguments.target,
            arguments.direction,
            arguments.exponent,
            arguments.cap,
        )
    except ValueError as error:
        raise CommandError(str(error)) from None
    if not math.isfinite(result.penalty):
        raise CommandError(
            f"--achieved {arguments.achieved:g} and --target {arguments.target:g} give no penalty (0 / 0): the "
            "quality must be a measured value and the target one that can be reached"
        )
    print(f"FLOPs:       {flops:.6g}")
    print(f"FLOPS:       {result.flops_per_s:.6g} FLOP/s")
    print(f"penalty:     {result.penalty:.6g}")
    print(f"Valid FLOPS: {result.valid_flops_per_s:.6g} FLOP/s")
    return EXIT_OK


def _import_mlperf(arguments) -> int:
    """A results round into the store (mlcampaign.history.published_rounds): one line per published run stored or
    present on stdout, then the report (``{"report": ...}``: what was stored, left out, noticed and skipped);
    each notice and each fault on stderr; exit status 2 where a fault left anything out."""
    from mlcampaign.history.published_rounds import RoundError, import_round, read_round

    try:
        read = read_round(Path(arguments.folder), arguments.round, arguments.source)
    except RoundError as error:
        raise CommandError(str(error)) from None
    with _store(arguments) as store:
        report = import_round(read, store, supersede=arguments.supersede)
    for result in report.results:
        print(json.dumps(result.__dict__ | {"store": store.url}))
    print(json.dumps({"report": report.counts() | {"store": store.url}}))
    for notice in report.notices:
        print(f"mlcampaign import-mlperf: {notice.kind}: {read.root}/{notice}", file=sys.stderr)
    for problem in report.problems:
        print(f"mlcampaign import-mlperf: {read.root}/{problem}", file=sys.stderr)
    return EXIT_USAGE if report.problems else EXIT_OK


def _published(arguments) -> int:
    """The published MLPerf HPC runs of the store (mlcampaign.analysis.published_runs): ``list`` one row per
    distinct result (filtered by shell patterns), ``show`` one run; human units, or ``--json``."""
    from mlcampaign.analysis.published_runs import published_text

    with _store(arguments) as store:
        runs = store.published_results()
    patterns = {name: getattr(arguments, name) for name in ("round", "submitter", "system", "benchmark", "scaling")}
    try:
        print(published_text(runs, arguments.action, arguments.run, patterns, as_json=arguments.json))
    except LookupError as error:
        raise CommandError(f"{error.args[0]} (results store {store.url})") from None
    return EXIT_OK


def _export_mlperf(arguments) -> int:
    """A run folder as an MLPerf HPC submission folder (mlcampaign.records.mlperf.submission)."""
    from mlcampaign.plan.numbers import loads_json
    from mlcampaign.records.mlperf.submission import SubmissionRefused, export_submission
    from mlcampaign.records.mlperf.system_descriptions import SYSTEM_FIELDS

    fields = {}
    if arguments.system_json:
        try:
            fields = loads_json(Path(arguments.system_json).read_text())
        except (OSError, ValueError) as error:
            raise CommandError(f"--system-json {arguments.system_json}: not a JSON file ({error})") from None
        unknown = sorted(set(fields) - set(SYSTEM_FIELDS)) if isinstance(fields, dict) else None
        if unknown is None or unknown:
            raise CommandError(
                f"--system-json {arguments.system_json}: not an object of systems-description fields"
                + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            )
    try:
        written = export_submission(
            Path(arguments.run),
            Path(arguments.out),
            incomplete=arguments.incomplete,
            system_fields=fields,
            benchmarks=arguments.benchmark,
        )
    except SubmissionRefused as error:
        raise CommandError(str(error)) from None
    for reason in written.left_out:
        print(f"mlcampaign export-mlperf: not exported: {reason}", file=sys.stderr)
    marked = " (incomplete: INCOMPLETE.txt)" if written.incomplete else ""
    for (system, benchmark), paths in written.results.items():
        print(f"{written.folder}: {system} {benchmark}: {len(paths)} result logs{marked}")
    return EXIT_OK


def _reproduce(arguments) -> int:
    """A campaign file that re-runs one submission's settings here (mlcampaign.plan.reproduce); the logs are
    read as mlperf-logging reads them (mlcampaign.records.mlperf.result_logs), a bad one named on stderr."""
    from mlcampaign.plan.config_files import load_yaml
    from mlcampaign.plan.reproduce import ReproduceError, reproduce_campaign
    from mlcampaign.records.mlperf import result_logs

    folder, out, config_dir = Path(arguments.folder), Path(arguments.out), Path(arguments.config_dir)
    if out.exists():
        raise CommandError(f"--out {out} exists: choose another file (nothing is overwritten)")
    try:
        submission, left_out = result_logs.read_submission(folder, arguments.round)
    except result_logs.ResultLogError as error:
        raise CommandError(str(error)) from None
    for problem in left_out:
        print(f"mlcampaign reproduce: {problem} (left out)", file=sys.stderr)
    system_path = config_dir / "systems" / f"{arguments.system}.yaml"
    if not system_path.is_file():
        raise CommandError(f"--system {arguments.system}: no file {system_path}")
    system = load_yaml(system_path)
    benchmark_path = config_dir / "benchmarks" / f"{folder.name}.yaml"
    if not benchmark_path.is_file():
        raise CommandError(f"{folder}: the project has no benchmark {folder.name!r} ({benchmark_path})")
    cpu_sized = None
    if system.get("device") == "cpu" and not arguments.full_size:
        cpu_sized = load_yaml(config_dir / "config.yaml").get("benchmark_overrides", {}).get(folder.name)
    try:
        text = reproduce_campaign(
            submission, system, load_yaml(benchmark_path), scale=arguments.scale, cpu_sized=cpu_sized, org=arguments.org
        )
    except ReproduceError as error:
        raise CommandError(str(error)) from None
    out.write_text(text)
    print(f"{out}: campaign reproducing {folder} on {arguments.system}; check it with: mlcampaign check {out}")
    return EXIT_OK


def _mlperf_commands(commands) -> None:
    """The commands between this project and MLPerf HPC results (import, reproduce, export)."""
    imported = commands.add_parser(
        "import-mlperf", help="an MLPerf HPC results round into the store, as published runs"
    )
    imported.add_argument("folder", help="a round (a clone of mlcommons/hpc_results_v3.0, or a folder in its layout)")
    imported.add_argument("--round", help="the round's name, e.g. v3.0 (default: the v<major>.<minor> in the path)")
    imported.add_argument(
        "--source", help="where the round is published, e.g. https://github.com/mlcommons/hpc_results_v3.0/tree/main"
    )
    imported.add_argument(
        "--supersede",
        action="store_true",
        help="replace a published run stored with other content (another score, e.g. a scaling.json added); the "
        "stored one is kept as superseded. Without, such a run is refused naming what differs",
    )
    imported.set_defaults(function=_import_mlperf)
    published = commands.add_parser("published", help="list the published MLPerf HPC results in the store, or one run")
    published.add_argument("action", choices=["list", "show"])
    published.add_argument("run", nargs="?", help="show: <round>/<submitter>/<system>")
    for name, example in (("round", "v3.0"), ("submitter", "'HPE*'"), ("system", "'eos*'"), ("benchmark", "cosmoflow")):
        published.add_argument(f"--{name}", help=f"list: only these (a shell pattern, any case; e.g. {example})")
    published.add_argument("--scaling", choices=["strong", "weak"], help="list: only strong or weak scaling")
    published.add_argument("--json", action="store_true", help="as JSON, full precision")
    published.set_defaults(function=_published)
    reproduce = commands.add_parser("reproduce", help="a campaign file re-running an MLPerf HPC submission here")
    reproduce.add_argument("folder", help="a submission's <submitter>/results/<system>/strong/<benchmark>/ folder")
    reproduce.add_argument("--system", required=True, help="the system to run it on (config/systems/<system>.yaml)")
    reproduce.add_argument("--scale", help="<nodes>x<processes per node> (default: one node, one process per device)")
    reproduce.add_argument("--out", required=True, help="the campaign file to write (never overwritten)")
    reproduce.add_argument("--org", help="this site's organisation, for the MLPerf log header (mlperf.org)")
    reproduce.add_argument("--round", help="the round's name (default: the v<major>.<minor> in the path, else v3.0)")
    reproduce.add_argument("--full-size", action="store_true", help="on a CPU system too: not the CPU-sized override")
    reproduce.add_argument("--config-dir", default="config", help="the folder of systems/, benchmarks/, config.yaml")
    reproduce.set_defaults(function=_reproduce)
    export = commands.add_parser("export-mlperf", help="a run folder as an MLPerf HPC submission folder (hpc 3.0.0)")
    export.add_argument("run", help="the run's folder: results/<campaign>/runs/<run id> (or results/<campaign>/latest)")
    export.add_argument("--out", required=True, help="the folder to write <org>/results/ and <org>/systems/ into")
    export.add_argument(
        "--incomplete", action="store_true", help="write fewer runs than the rules take, marked INCOMPLETE.txt"
    )
    export.add_argument("--system-json", help="a JSON object of systems-description fields to write instead")
    export.add_argument(
        "--benchmark", action="append", help="only this campaign benchmark's cells (repeatable; default: every one)"
    )
    export.set_defaults(function=_export_mlperf)


def _store_commands(commands) -> None:
    """The commands on the runs of the results store: ingest, list, compare, summarise, bundle, tabulate, show."""
    ingest = commands.add_parser("ingest", help="add a run folder's manifest and records to the store")
    ingest.add_argument("run_dir", help="results/<campaign>/runs/<run id>")
    ingest.set_defaults(function=_ingest)
    runs = commands.add_parser("runs", help="list the runs, show one, or diff the software stack of two")
    runs.add_argument("action", choices=["list", "show", "diff"])
    runs.add_argument("runs", nargs="*", help="run ids: one for show, two for diff")
    runs.add_argument("--campaign", help="list: only this campaign's runs")
    runs.add_argument("--site", help="list: only this site's runs")
    runs.set_defaults(function=_runs)
    compare = commands.add_parser(
        "compare", help="each cell and metric of run B judged on its site's runs from run A to it"
    )
    compare.add_argument("runs", nargs=2, metavar="RUN", help="run A (earlier, the history's first run), run B")
    compare.set_defaults(function=_compare)
    summary = commands.add_parser("summary", help="what a run came to, as JSON (exit status: see above)")
    summary.add_argument("run", help="run id")
    summary.add_argument("--baseline-dir", help="also compare with the accepted baselines of this store folder")
    summary.set_defaults(function=_summary_command)
    export = commands.add_parser("export", help="write a run as one bundle file")
    export.add_argument("run", help="a run id in the store, or a run folder (results/<campaign>/runs/<run id>)")
    export.add_argument("--out", required=True, help="the bundle file to write (.tar.gz)")
    export.set_defaults(function=_export)
    bundle_import = commands.add_parser("import", help="read a bundle into the store (or a results folder)")
    bundle_import.add_argument("bundle")
    bundle_import.add_argument("--results", help="write the run's files into this results folder instead")
    bundle_import.add_argument(
        "--supersede",
        action="store_true",
        help="let the bundle replace the stored run's manifest and give its trials new records (both are kept); "
        "without, such a bundle is refused",
    )
    bundle_import.set_defaults(function=_import)
    dashboard = commands.add_parser("dashboard", help="build the static dashboard of a campaign's runs")
    dashboard.add_argument(
        "--out",
        required=True,
        help="the site's folder: new, empty, or a dashboard built before (replaced once the new one is complete)",
    )
    dashboard.add_argument("--campaign", help="the campaign (needed when the store holds several)")
    dashboard.add_argument("--baseline-dir", help="mark changes against the accepted baselines of this folder")
    dashboard.set_defaults(function=_dashboard)
    tables = commands.add_parser("tables", help="write a campaign's tables over the latest run of every site")
    tables.add_argument("campaign")
    tables.add_argument("--out", required=True, help="folder for <table>.csv and <table>.parquet")
    tables.add_argument("--runs", nargs="+", metavar="RUN", help="these runs instead (one per site)")
    tables.set_defaults(function=_tables)


def _number(unit: str | None):
    """An option's type: a number, finite and within the bounds of ``unit`` (mlcampaign.plan.numbers); argparse
    names the option and the value of one that is not, with exit status 2."""
    from mlcampaign.plan.numbers import number_problem

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"value {text!r} is not a number") from None
        problem = number_problem(value, unit)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"value {text!r} {problem}")
        return value

    return number


def _baseline_and_valid_flops_commands(commands) -> None:
    """The accepted baselines, and Valid FLOPS of a published entry's numbers."""
    baseline = commands.add_parser("baseline", help="promote a finished run's cells as the accepted baseline, or show")
    baseline.add_argument("action", choices=["promote", "show"])
    baseline.add_argument(
        "--baseline-dir",
        type=Path,
        default=Path("baselines"),
        help="the baseline store's folder (default: %(default)s)",
    )
    baseline.add_argument(
        "--campaign-dir",
        type=Path,
        help="promote: the run's folder, results/<campaign>/runs/<run> (or results/<campaign>/latest)",
    )
    baseline.add_argument(
        "--cells",
        nargs="+",
        metavar="PATTERN",
        help="promote: system/benchmark/cell shell patterns, e.g. 'archer2-cpu/*/*'",
    )
    baseline.add_argument("--note", default="", help="promote: why, e.g. 'accepted after the ROCm 6.2 upgrade'")
    baseline.add_argument("--history", action="store_true", help="show: superseded baselines too")
    baseline.set_defaults(function=_baseline)
    valid = commands.add_parser("valid-flops", help="HPC AI500 Valid FLOPS of one training run from its numbers")
    work = valid.add_mutually_exclusive_group(required=True)
    work.add_argument("--flops", type=_number("FLOP"), help="counted FLOPs of the whole run")
    work.add_argument("--flops-per-sample", type=_number("FLOP"), help="FLOPs per training sample (with --samples)")
    valid.add_argument("--samples", type=_number("samples"), help="samples processed (epochs x dataset size)")
    valid.add_argument("--time", type=_number("s"), required=True, help="time-to-train in seconds")
    valid.add_argument("--achieved", type=_number(None), required=True, help="quality reached")
    valid.add_argument("--target", type=_number(None), required=True, help="quality target")
    valid.add_argument("--direction", choices=["higher", "lower"], required=True, help="which way quality is better")
    valid.add_argument("--exponent", type=_number(None), required=True, help="penalty exponent n")
    valid.add_argument("--cap", type=_number(None), default=1.0, help="upper bound of the penalty (default 1)")
    valid.set_defaults(function=_valid_flops)


def parser() -> argparse.ArgumentParser:
    from mlcampaign.plan.urls import DEFAULT_STORE_URL

    main = argparse.ArgumentParser(
        prog="mlcampaign", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # No default here: argparse shows defaults, and $MLCAMPAIGN_STORE may hold a password (refused, never shown).
    main.add_argument(
        "--store", help=f"results store URL (default: $MLCAMPAIGN_STORE if set, else {DEFAULT_STORE_URL})"
    )
    commands = main.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate campaign files, naming file, line and key of each problem")
    check.add_argument("files", nargs="+", help="campaign YAML files (later ones override earlier ones)")
    check.add_argument(
        "--config-dir", default="config", help="the folder of systems/ and benchmarks/ (default: %(default)s)"
    )
    check.set_defaults(function=_check)
    _store_commands(commands)
    _baseline_and_valid_flops_commands(commands)
    _mlperf_commands(commands)
    return main


def main(argv: Sequence[str] | None = None) -> int:
    from mlcampaign.analysis.baseline import BaselineError
    from mlcampaign.history.bundle import BundleError
    from mlcampaign.history.merge import HistoryError
    from mlcampaign.history.store import StoreError
    from mlcampaign.plan.config_files import ConfigError
    from mlcampaign.plan.urls import DEFAULT_STORE_URL, mask_passwords

    arguments = parser().parse_args(argv)
    arguments.store = arguments.store or os.environ.get("MLCAMPAIGN_STORE") or DEFAULT_STORE_URL
    if arguments.command == "baseline" and arguments.action == "promote" and arguments.campaign_dir is None:
        parser().error("baseline promote needs --campaign-dir")
    try:
        return arguments.function(arguments)
    except (CommandError, ConfigError, StoreError, BundleError, HistoryError, BaselineError, OSError) as error:
        print(mask_passwords(f"mlcampaign {arguments.command}: {error}"), file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:  # a bug: its traceback, and exit 2, never 1 (summary's callers read 1 as a regression)
        print(mask_passwords(traceback.format_exc()), file=sys.stderr)
        print(
            mask_passwords(
                f"mlcampaign {arguments.command}: internal error ({type(error).__name__}: {error}); "
                "please report it with the traceback above"
            ),
            file=sys.stderr,
        )
        return EXIT_USAGE
