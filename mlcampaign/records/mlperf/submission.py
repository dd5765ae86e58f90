"""A campaign run as an MLPerf HPC submission folder (``mlcampaign export-mlperf``)::

    <out>/<org>/systems/<system>.json
    <out>/<org>/results/<system>/strong/<benchmark>/result_<i>.txt    (the trials' MLPerf logs, byte for byte)

which mlperf-logging's package_checker and result_summarizer (``hpc 3.0.0``) accept. One folder per
(system, benchmark) of the run's cells of an MLPerf HPC benchmark; result_<i> is trial i's ``mllog.txt``.

The logs are the trials' own, never edited: what they claim (benchmark, org, division, platform) is what
the campaign logged (its ``mlperf`` block), and every log must pass the compliance checker under the
division it claims. A run that cannot be submitted is refused (``SubmissionRefused``, every reason named,
nothing written):

- a benchmark without MLPerf HPC rules (ResNet-50 is MLPerf *training*; extreme weather has none) that the
  export names (``benchmarks``); without a selection such cells are left out, each named;
- a log that fails the checker, e.g. one that does not reach MLPerf's quality target: the HPC rules check
  the target in the open division too (open_<benchmark>.yaml), so a campaign with a relaxed target (the
  CPU-sized CosmoFlow's MAE 0.2, where MLPerf's is 0.124) cannot be submitted in any division, and a run
  is never written under a division its logs fail;
- logs that disagree on what they are, a campaign without ``mlperf.org``, a cell with several of a system's
  scales, an output folder that exists;
- a number of runs other than the rules' (mlperf-logging's benchmark_meta: 5 DeepCAM, 10 CosmoFlow).
  Fewer are written only with ``incomplete``, which says so in ``results/<system>/INCOMPLETE.txt`` (a file
  both tools ignore; package_checker then names the missing runs).

The systems JSON has every field package_checker requires, from the run's system config and the trials'
provenance; what the project does not record (sockets per node, memory, interconnect, cooling) is left
empty, host_processors_per_node is 1 (an integer the summarizer needs; hw_notes says it is assumed), and
``system_fields`` replaces any of them. The folder is checked with package_checker's own checks on a
throw-away copy (its RCP step writes there) before it is put in place.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from mlperf_logging.benchmark_meta import get_result_file_counts
from mlperf_logging.package_checker import package_checker

from mlcampaign.plan import registry
from mlcampaign.plan.numbers import loads_json
from mlcampaign.records.mlperf import result_logs
from mlcampaign.records.mlperf.result_logs import USAGE
from mlcampaign.records.mlperf.system_descriptions import SYSTEM_FIELDS

RULESET = "3.0.0"
INCOMPLETE_FILE = "INCOMPLETE.txt"
# The header keys whose values every log of one submission folder shares.
_SHARED_HEADER = ("submission_benchmark", "submission_org", "submission_division", "submission_platform")
_SHARED_SCALE = ("number_of_nodes", "accelerators_per_node")


class SubmissionRefused(ValueError):
    """A run that cannot be written as a submission; ``reasons`` names each problem (file, rule, value)."""

    def __init__(self, reasons: list[str]):
        super().__init__("not exported as an MLPerf HPC submission:\n  " + "\n  ".join(reasons))
        self.reasons = reasons


@dataclasses.dataclass(frozen=True)
class Trial:
    """One trial of the run: its record and its MLPerf log's path."""

    record: dict
    log: Path


@dataclasses.dataclass(frozen=True)
class SubmissionFolder:
    """What was written: the submitter folder, and per (system, benchmark) its result files."""

    folder: Path
    results: dict[tuple[str, str], list[Path]]
    incomplete: bool
    left_out: list[str]  # cells of benchmarks without MLPerf HPC rules, each with why


def run_trials(run_dir: Path) -> tuple[dict, list[Trial]]:
    """A run folder's manifest and its trials' current records with their logs (results/<campaign>/runs/<run>)."""
    manifest_path = run_dir / "run.json"
    try:
        manifest = loads_json(manifest_path.read_text())
    except (OSError, ValueError) as error:
        raise SubmissionRefused([f"{manifest_path}: not a run's manifest ({error})"]) from None
    trials = []
    for record_path in sorted((run_dir / "trials").glob("*/*/*/*/record.json")):
        try:
            record = loads_json(record_path.read_text())
        except (OSError, ValueError) as error:
            raise SubmissionRefused([f"{record_path}: not a readable record ({error})"]) from None
        trials.append(Trial(record, record_path.with_name("mllog.txt")))
    return manifest, trials


def _quality_reason(log: Path, messages: list[str], rules: registry.MLPerfRules, benchmark: Mapping) -> str | None:
    """The refusal of a log that does not reach MLPerf's quality target, naming rule and target."""
    if not any(message.startswith(f"Failed checks for {rules.quality_key} :") for message in messages):
        return None
    target = benchmark["target"]
    relaxed = (
        target["value"] != rules.target
    ) and f" (the campaign's target is {target['metric']} {target['value']:g})"
    return (
        f"{log}: does not reach MLPerf HPC's quality target {rules.target_text} (rule ATLEAST_ONE_CHECK of "
        f"{rules.quality_key} in {USAGE}_{RULESET}/<division>_{rules.name}.yaml){relaxed or ''}; the HPC rules "
        "check the target in the open division too, so no division accepts this run"
    )


def _header(loglines: list) -> dict:
    keys = (*_SHARED_HEADER, "submission_status", *_SHARED_SCALE, "seed")
    return {key: result_logs.first_value(loglines, key) for key in keys}


def system_description(manifest: Mapping, system: str, header: Mapping, records: list[dict], fields: Mapping) -> dict:
    """The systems JSON of one exported system (module docstring); ``fields`` replace the defaults."""
    config = manifest["systems"][system]
    provenance = records[0]["provenance"]
    accelerators = int(header["accelerators_per_node"])
    torch_version = (provenance.get("packages") or {}).get("torch")
    description = dict.fromkeys(SYSTEM_FIELDS, "")
    description |= {
        "submitter": header["submission_org"],
        "division": header["submission_division"],
        "status": header["submission_status"],
        "system_name": system,
        "number_of_nodes": str(header["number_of_nodes"]),
        "host_processors_per_node": "1",
        "host_processor_model_name": provenance.get("cpu_model") or "",
        "host_processor_core_count": str(config.get("cores_per_node", "")),
        "accelerators_per_node": str(accelerators),
        "accelerator_model_name": config.get("accelerator", "") if accelerators else "N/A",
        "framework": f"PyTorch {torch_version}" if torch_version else "",
        "other_software_stack": {
            "mlcampaign_commit": manifest.get("workflow_commit") or "",
            "python": provenance.get("python", ""),
            "kernel": (provenance.get("software") or {}).get("kernel", ""),
        },
        "operating_system": provenance.get("platform", ""),
        "hw_notes": config.get("description", ""),
        "sw_notes": f"mlcampaign campaign {manifest['campaign']}, run {manifest['run_id']}",
    }
    if "host_processors_per_node" not in fields:
        description["hw_notes"] += " host_processors_per_node: not recorded by mlcampaign, 1 assumed"
    return description | dict(fields)


def _refusals(
    manifest: Mapping, trials: list[Trial], incomplete: bool, benchmarks: Sequence[str] | None
) -> tuple[list[str], dict[tuple[str, str], tuple[list[Trial], dict]], list[str]]:
    """Every reason to refuse, per (system, benchmark) its trials in trial order and their shared header,
    and the cells left out (benchmarks without MLPerf HPC rules, where ``benchmarks`` does not name them)."""
    reasons: list[str] = []
    unknown = sorted(set(benchmarks or ()) - set(manifest["benchmarks"]))
    if unknown:
        reasons.append(f"the run has no benchmark {unknown} (it has {sorted(manifest['benchmarks'])})")
    groups: dict[tuple[str, str, str], list[Trial]] = {}
    for trial in trials:
        key = tuple(trial.record["trial"][name] for name in ("system", "benchmark", "cell"))
        if benchmarks is None or key[1] in benchmarks:
            groups.setdefault(key, []).append(trial)
    exported: dict[tuple[str, str], tuple[list[Trial], dict]] = {}
    left_out = []
    for (system, benchmark, cell), members in sorted(groups.items()):
        config = manifest["benchmarks"][benchmark]
        rules = registry.mlperf_rules(config, USAGE)
        where = f"{system}/{benchmark}/{cell}"
        if rules is None:
            reason = f"{where}: benchmark {benchmark!r} (model {config['model']['name']!r}) has no MLPerf HPC rules"
            (left_out if benchmarks is None else reasons).append(reason)
            continue
        if (system, benchmark) in exported:
            reasons.append(
                f"{where}: {system} has another cell of {benchmark}; a submission holds one scale per system"
            )
            continue
        members = sorted(
            members, key=lambda trial: (trial.record["trial"]["trial"], trial.record["trial"]["replicate"])
        )
        cell_reasons, header = _cell_refusals(where, system, members, rules, config, incomplete)
        reasons += cell_reasons
        exported[(system, benchmark)] = (members, header)
    if not exported and not reasons:
        reasons.append(
            "the run has no trial of an MLPerf HPC benchmark with a record" + "".join(f"; {r}" for r in left_out)
        )
    return reasons, exported, left_out


def _cell_refusals(
    where: str, system: str, members: list[Trial], rules: registry.MLPerfRules, config: Mapping, incomplete: bool
) -> tuple[list[str], dict]:
    """Why one (system, benchmark) cell's trials cannot be its submission folder (their logs, what the logs
    claim, how many runs), and the logs' shared header (empty without a log)."""
    reasons: list[str] = []
    headers = []
    for trial in members:
        if not trial.log.is_file():
            reasons.append(f"{trial.log}: no MLPerf log")
            continue
        loglines, errors = result_logs.parse_lines(trial.log.read_text(encoding="latin-1"), RULESET)
        headers.append(_header(loglines))
        messages = result_logs.compliance(loglines, errors, RULESET)
        if messages:
            reasons.append(
                _quality_reason(trial.log, messages, rules, config)
                or f"{trial.log}: fails the compliance checker ({USAGE} {RULESET}, division "
                f"{headers[-1]['submission_division']!r}): "
                + " | ".join(m.splitlines()[0] for m in messages)
            )
    for key in (*_SHARED_HEADER, *_SHARED_SCALE):
        values = sorted({str(header[key]) for header in headers})
        if len(values) > 1:
            reasons.append(f"{where}: the logs disagree on {key}: {values}")
    header = headers[0] if headers else {}
    if headers and not header["submission_org"]:
        reasons.append(f"{where}: the logs name no submission_org: set the campaign's mlperf.org")
    if headers and header["submission_platform"] != system:
        reasons.append(f"{where}: the logs' submission_platform {header['submission_platform']!r} is not {system!r}")
    if header.get("submission_division") == "closed" and len({h["seed"] for h in headers}) != len(headers):
        reasons.append(f"{where}: runs share a seed (the closed division's seed checker refuses them)")
    count = get_result_file_counts(USAGE)[rules.name]
    if len(members) > count:
        reasons.append(
            f"{where}: {len(members)} runs; MLPerf HPC takes exactly {count} {rules.name} runs "
            "(mlperf_logging.benchmark_meta): run the campaign with that many trials"
        )
    elif len(members) < count and not incomplete:
        reasons.append(
            f"{where}: {len(members)} runs; MLPerf HPC takes exactly {count} {rules.name} runs "
            "(mlperf_logging.benchmark_meta): run that many trials, or export it marked incomplete (--incomplete)"
        )
    return reasons, header


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} - {record.getMessage()}")


def package_check(folder: Path) -> tuple[bool, list[str]]:
    """package_checker's verdict on a submitter folder, in-process (its command line exits 0 whatever it
    finds): check_systems and check_training_result_files, with its log lines. Its RCP step writes
    scaling.json into a closed division's folders: give it a copy."""
    capture = _Lines()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    for handler in handlers:
        root.removeHandler(handler)
    root.addHandler(capture)
    root.setLevel(logging.INFO)
    try:
        systems = package_checker.check_systems(str(folder), USAGE, RULESET)
        results = package_checker.check_training_result_files(
            str(folder), USAGE, RULESET, quiet=True, werror=False, rcp_bypass=False,
            rcp_bert_train_samples=False, seed_checker_bypass=False,
        )  # fmt: skip
    finally:
        root.removeHandler(capture)
        root.setLevel(level)
        for handler in handlers:
            root.addHandler(handler)
    return bool(systems and results), capture.lines


def export_submission(
    run_dir: Path,
    out: Path,
    *,
    incomplete: bool = False,
    system_fields: Mapping | None = None,
    benchmarks: Sequence[str] | None = None,
) -> SubmissionFolder:
    """Write the run at ``run_dir`` as a submission folder under ``out`` (module docstring); SubmissionRefused
    with every reason where it cannot be, having written nothing. ``benchmarks``: only the cells of these
    campaign benchmarks (each must have MLPerf HPC rules); by default every cell, those of benchmarks
    without MLPerf HPC rules left out and named (``SubmissionFolder.left_out``)."""
    manifest, trials = run_trials(Path(run_dir))
    reasons, exported, left_out = _refusals(manifest, trials, incomplete, benchmarks)
    if reasons:
        raise SubmissionRefused(reasons)
    orgs = {header["submission_org"] for _, header in exported.values()}
    if len(orgs) > 1:
        raise SubmissionRefused([f"the logs name several orgs: {sorted(orgs)}"])
    (org,) = orgs
    target = Path(out) / org
    if os.sep in org or org in (".", ".."):
        raise SubmissionRefused([f"submission_org {org!r} cannot name a folder"])
    if target.exists():
        raise SubmissionRefused([f"{target} exists: export into another --out (nothing there is replaced)"])
    Path(out).mkdir(parents=True, exist_ok=True)
    descriptions: dict[str, dict] = {}
    for (system, _), (members, header) in exported.items():
        description = system_description(manifest, system, header, [t.record for t in members], system_fields or {})
        if descriptions.setdefault(system, description) != description:
            raise SubmissionRefused([f"{system}: its cells of several benchmarks differ in scale; export them apart"])
    built = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=out))
    short = False
    try:
        folder = built / org
        (folder / "systems").mkdir(parents=True)
        for system, description in descriptions.items():
            (folder / "systems" / f"{system}.json").write_text(json.dumps(description, indent=4) + "\n")
        results = {}
        for (system, benchmark), (members, header) in exported.items():
            name = header["submission_benchmark"]
            results_dir = folder / "results" / system / "strong" / name
            results_dir.mkdir(parents=True)
            for index, trial in enumerate(members):
                shutil.copyfile(trial.log, results_dir / f"result_{index}.txt")
            results[(system, benchmark)] = [target / path.relative_to(folder) for path in sorted(results_dir.iterdir())]
            count = get_result_file_counts(USAGE)[name]
            if len(members) < count:
                short = True
                (folder / "results" / system / INCOMPLETE_FILE).write_text(
                    f"{len(members)} of the {count} {name} runs MLPerf HPC {RULESET} takes "
                    "(mlperf_logging.benchmark_meta): an incomplete submission, exported with --incomplete\n"
                )
        if not incomplete:
            checked = Path(tempfile.mkdtemp(dir=built)) / org
            shutil.copytree(folder, checked)
            passed, lines = package_check(checked)
            if not passed:
                raise SubmissionRefused(
                    ["package_checker (hpc 3.0.0) does not accept it: "]
                    + [line for line in lines if line.startswith(("ERROR", "WARNING"))]
                )
        folder.rename(target)
    finally:
        shutil.rmtree(built, ignore_errors=True)
    return SubmissionFolder(target, results, short, left_out)
