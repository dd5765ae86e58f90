"""MLPerf HPC result rounds into the results store (mlcampaign.history.published_rounds, ``mlcampaign
import-mlperf``): every figure equals mlperf-logging's result_summarizer run on a copy of the same folders
(never typed-in numbers), weak scaling and the CPU-only Fugaku system included; importing again adds
nothing; a log in two rounds is one record; each kind of bad input is named and only it is left out."""

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy
from mlperf_tools import SUBSET, needs_subset, summarizer_figures, writable_copy

from mlcampaign.history.published_rounds import RoundError, import_round, read_round
from mlcampaign.history.store import open_store
from mlcampaign.records.mlperf.system_descriptions import system_summary

pytestmark = needs_subset
REL = 1e-6
MLCAMPAIGN = [sys.executable, "-m", "mlcampaign"]
DELL = "Dell/results/32xXE8545x4A100-SXM4-40GB/strong/deepcam"
EOS = "NVIDIA/results/eos_n64_ngc23.09_pytorch/strong/cosmoflow"
PERLMUTTER_512 = "HPE+LBNL/results/perlmutter_512x4/strong/deepcam"
FUGAKU_JSON = "Fujitsu+RIKEN/systems/fugaku_512xA64FX_tensorflow_closed.json"


def close(ours, theirs: str) -> bool:
    return math.isclose(float(ours), float(theirs), rel_tol=REL)


def store_rows(url: str) -> dict[str, list[tuple]]:
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as connection:
        names = [name for name in sqlalchemy.inspect(connection).get_table_names() if name != "schema_version"]
        rows = {name: sorted(map(tuple, connection.exec_driver_sql(f"SELECT * FROM {name}"))) for name in names}
    engine.dispose()
    return rows


@pytest.fixture(scope="module")
def subset_round():
    return read_round(SUBSET)


@pytest.fixture(scope="module")
def summarizer(tmp_path_factory) -> dict[str, dict]:
    """The summarizer's figures of every submitter folder of the subset, each run on its own copy."""
    figures = {}
    for submitter in sorted(path for path in SUBSET.iterdir() if (path / "results").is_dir()):
        copy = writable_copy(submitter, tmp_path_factory.mktemp("summarizer") / submitter.name)
        figures[submitter.name] = summarizer_figures(copy)
    return figures


def compare_with_summarizer(runs, figures: dict[str, dict]) -> int:
    """Every figure of ours against the summarizer's, both ways (no figure on one side only); the count."""
    compared, ours = 0, set()
    for run in runs:
        for score in run.scores:
            key = (run.system, score["scaling"], score["benchmark"])
            expected = figures[run.submitter].get(key)
            if score["scaling"] == "strong":
                if score["time_to_train_min"] is None:
                    assert expected is None, key
                    continue
                ours.add((run.submitter, *key))
                assert close(score["time_to_train_min"], expected["time_to_train"]), (key, score, expected)
                assert close(score["scaling_factor"], expected["rcp_scaling_factor"] or 1.0), key
                if score["division"] == "closed":
                    assert (score["rcp"] or "") == expected["RCP"], key
                    if expected["GBS"]:
                        assert close(score["gbs"], expected["GBS"]), key
                        assert close(score["epochs_to_converge_olympic"], expected["samples_to_converge"]), key
                compared += 1
            elif score["time_to_train_all_min"] is not None:
                ours.add((run.submitter, *key))
                assert close(score["time_to_train_all_min"], expected["time_to_train_all"]), key
                assert close(score["number_of_models"], expected["number_of_models"]), key
                assert close(score["instance_scale"], expected["instance_scale"]), key
                assert close(
                    score["throughput_models_per_min"], score["number_of_models"] / float(expected["time_to_train_all"])
                )
                compared += 1
    theirs = {(submitter, *key) for submitter, found in figures.items() for key in found if key != "stdout"}
    assert ours == theirs
    return compared


def test_every_figure_equals_the_result_summarizers(subset_round, summarizer):
    assert subset_round.problems == []
    assert compare_with_summarizer(subset_round.runs, summarizer) == 7  # 6 strong folders, 1 weak
    scaled = {(run.system, s["benchmark"]): s for run in subset_round.runs for s in run.scores}
    assert scaled[("eos_n64_ngc23.09_pytorch", "cosmoflow")]["scaling_factor"] > 1  # scaling.json applied


def test_the_cpu_only_fugaku_system_counts_its_nodes(subset_round):
    (fugaku,) = [run for run in subset_round.runs if run.submitter == "Fujitsu+RIKEN"]
    system = system_summary(fugaku.description)
    assert (system["nodes"], system["accelerators_per_node"], system["accelerator"]) == (512, 0, None)
    assert {log.record["instance_scale"] for log in fugaku.logs} == {512}  # nodes x max(accelerators, 1)
    assert len(fugaku.logs) == 10 and fugaku.scores[0]["rcp"] == "Pass"


def test_a_run_keeps_its_logs_hyperparameters_and_flops(subset_round):
    (dell,) = [run for run in subset_round.runs if run.submitter == "Dell"]
    record = dell.logs[0].record
    assert record["hyperparameters"]["opt_name"] == "LAMB" and record["global_batch_size"] == 256
    assert record["quality_key"] == "eval_accuracy" and record["quality"] >= 0.82
    assert record["samples_trained"] == record["epochs_to_converge"] * 121266
    flops = dell.scores[0]["flops"]
    assert flops["model"] == "deepcam" and flops["sample_shape"] == [16, 768, 1152]
    (oc20,) = [s for run in subset_round.runs for s in run.scores if s["benchmark"] == "oc20"]
    assert "flops" not in oc20  # the project has no OpenCatalyst model: no FLOPs


def test_importing_again_adds_nothing_and_reads_back_as_imported(subset_round, tmp_path):
    url = f"sqlite:///{tmp_path}/history.db"
    with open_store(url) as store:
        first, conflicts = import_round(subset_round, store)
        assert conflicts == [] and all(result.run_created for result in first)
        assert sum(result.logs_added for result in first) == 55
        before = store_rows(url)
        again, _ = import_round(read_round(SUBSET), store)
        assert not any(result.run_created or result.logs_added for result in again)
        stored = store.published_results()
    assert store_rows(url) == before
    assert len(before["published_logs"]) == 55 and len(before["published_runs"]) == 6
    by_key = {(run["submitter"], run["system"]): run for run in stored}
    for run in subset_round.runs:
        back = by_key[(run.submitter, run.system)]
        assert back["description"] == run.description and back["scores"] == run.scores
        assert sorted(log["record"]["sha256"] for log in back["logs"]) == sorted(
            log.record["sha256"] for log in run.logs
        )


def test_a_log_in_two_rounds_is_one_record(subset_round, tmp_path):
    """Dell's logs, byte for byte, as a v2.0 round too (they pass the hpc 2.0.0 rules)."""
    older = writable_copy(SUBSET / "Dell", tmp_path / "hpc_results_v2.0" / "Dell").parent
    url = f"sqlite:///{tmp_path}/history.db"
    with open_store(url) as store:
        import_round(subset_round, store)
        (result,), conflicts = import_round(read_round(older), store)
        stored = store.published_results()
    assert conflicts == [] and (result.round, result.run_created, result.logs_added, result.logs_present) == (
        "v2.0",
        True,
        0,
        5,
    )
    rows = store_rows(url)
    assert len(rows["published_logs"]) == 55 and len(rows["published_runs"]) == 7
    dell = [run for run in stored if run["submitter"] == "Dell"]
    assert [run["round"] for run in dell] == ["v2.0", "v3.0"]
    assert [log["record"] for log in dell[0]["logs"]] == [log["record"] for log in dell[1]["logs"]]


def test_a_folder_that_is_not_a_round_is_refused(tmp_path):
    with pytest.raises(RoundError, match="no round name in its path"):
        read_round(tmp_path)
    (tmp_path / "v3.0").mkdir()
    with pytest.raises(RoundError, match="not a round folder"):
        read_round(tmp_path / "v3.0")
    with pytest.raises(RoundError, match=r"rules for rounds v1\.0, v2\.0, v3\.0 only"):
        read_round(tmp_path / "v3.0", "v4.0")


# Bad input: one fault per place, in a copy of the subset.


def cut_after(path: Path, key: str, count: int) -> list[str]:
    lines = path.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if f'"key": "{key}"' in line]
    return lines[: hits[count - 1] + 1]


def truncate(bad: Path, root: Path) -> None:
    log = bad / DELL / "result_3.txt"
    log.write_bytes(log.read_bytes()[:-60])


def link_out(bad: Path, root: Path) -> None:
    outside = root / "outside.txt"
    outside.write_text("not a log of this round")
    (bad / DELL / "result_9.txt").symlink_to(outside)


def drop_run_stop(bad: Path, root: Path) -> None:
    log = bad / PERLMUTTER_512 / "result_2.txt"
    log.write_text("".join(line for line in log.read_text().splitlines(True) if '"key": "run_stop"' not in line))


def abort(bad: Path, root: Path) -> None:
    """Cut after the 10th evaluation (the target not reached yet) and stop the run aborted."""
    log = bad / EOS / "result_5.txt"
    lines = cut_after(log, "eval_stop", 10)
    last = json.loads(lines[-1].split(":::MLLOG ", 1)[1])
    stop = {"namespace": "", "time_ms": last["time_ms"] + 5, "event_type": "INTERVAL_END", "key": "run_stop"}
    stop |= {"value": None, "metadata": {"file": "main.py", "lineno": 1, "status": "aborted", "epoch_num": 10}}
    log.write_text("".join(lines) + ":::MLLOG " + json.dumps(stop) + "\n")


def break_scaling(bad: Path, root: Path) -> None:
    (bad / EOS / "scaling.json").write_text('{"scaling_factor": ')


def break_json(bad: Path, root: Path) -> None:
    description = bad / FUGAKU_JSON
    description.write_text(description.read_text() + "}")


def leave_layout(bad: Path, root: Path) -> None:
    results = bad / "HPE+LBNL/results"
    shutil.copytree(results / "perlmutter_128x4/strong/cosmoflow", results / "perlmutter_128x4/cosmoflow")
    (results / "notes.txt").write_text("hello")


def drop_json(bad: Path, root: Path) -> None:
    shutil.copytree(bad / PERLMUTTER_512, bad / "HPE+LBNL/results/ghost/strong/deepcam")


def unknown_benchmark(bad: Path, root: Path) -> None:
    """A log of a benchmark mlperf-logging has no rules for (the project's extreme weather)."""
    rules = bad / "Rules/results/local/strong/extreme-weather"
    rules.mkdir(parents=True)
    (bad / "Rules/systems").mkdir()
    shutil.copyfile(SUBSET / "Dell/systems/32xXE8545x4A100-SXM4-40GB.json", bad / "Rules/systems/local.json")
    source = (SUBSET / DELL / "result_0.txt").read_text()
    (rules / "result_0.txt").write_text(source.replace('"value": "deepcam"', '"value": "extreme-weather"', 1))


# case -> (submitter, fault, the problems it makes: path, left out, what; the subset's file it leaves out)
FAULTS = {
    "truncated log": ("Dell", truncate, {(f"{DELL}/result_3.txt", "log", "truncated log")}, f"{DELL}/result_3.txt"),
    "link out of the folder": (
        "Dell", link_out, {(f"{DELL}/result_9.txt", "path", "a link that leads out of the round folder")}, None
    ),
    "no run_stop": (
        "HPE+LBNL", drop_run_stop, {(f"{PERLMUTTER_512}/result_2.txt", "log", "no run_stop")},
        f"{PERLMUTTER_512}/result_2.txt",
    ),
    "aborted run": (
        "NVIDIA", abort, {(f"{EOS}/result_5.txt", "log", "run_stop status 'aborted': an aborted run")},
        f"{EOS}/result_5.txt",
    ),
    "malformed systems JSON": ("Fujitsu+RIKEN", break_json, {(FUGAKU_JSON, "system", "not JSON")}, None),
    "malformed scaling.json": (
        "NVIDIA", break_scaling, {(f"{EOS}/scaling.json", "path", "not a scaling factor")}, None
    ),
    "not in the layout": (
        "HPE+LBNL",
        leave_layout,
        {
            ("HPE+LBNL/results/perlmutter_128x4/cosmoflow", "path", "holds strong/ and weak/"),
            ("HPE+LBNL/results/notes.txt", "path", "one folder per system"),
        },
        None,
    ),
    "missing systems JSON": (
        "HPE+LBNL", drop_json, {("HPE+LBNL/systems/ghost.json", "system", "no systems description")}, None
    ),
    "benchmark without rules": (
        "Rules",
        unknown_benchmark,
        {("Rules/results/local/strong/extreme-weather/result_0.txt", "log", "fails the compliance checker")},
        None,
    ),
}  # fmt: skip
EXPECTED_PROBLEMS = set().union(*(problems for _, _, problems, _ in FAULTS.values()))


def make_bad_round(root: Path, cases=tuple(FAULTS)) -> Path:
    """The subset with the faults of ``cases`` (FINDINGS.md's make_bad_round.sh); returns the round folder."""
    bad = writable_copy(SUBSET, root / "bad_v3.0")
    for case in cases:
        FAULTS[case][1](bad, root)
    return bad


@pytest.mark.parametrize("case", FAULTS)
def test_a_bad_input_is_named_and_only_it_is_left_out(case, subset_round, tmp_path):
    """The submitter's folder with one fault: the problem named; every other log of the subset's submitter
    stored; of the faulty one, nothing."""
    submitter, fault, problems, left_out_file = FAULTS[case]
    bad = tmp_path / "v3.0"
    if (SUBSET / submitter).is_dir():
        writable_copy(SUBSET / submitter, bad / submitter)
    fault(bad, tmp_path)
    read = read_round(bad)
    assert {(problem.path, problem.left_out) for problem in read.problems} == {
        (path, what) for path, what, _ in problems
    }
    for path, _, what in problems:
        (problem,) = [found for found in read.problems if found.path == path]
        assert what in problem.what
    with open_store(f"sqlite:///{tmp_path}/history.db") as store:
        import_round(read, store)
        stored = store.published_results()
    expected_runs = {(run.submitter, run.system) for run in subset_round.runs if run.submitter == submitter}
    if case == "malformed systems JSON":
        expected_runs = set()
    elif case == "benchmark without rules":
        expected_runs = {("Rules", "local")}
    assert {(run["submitter"], run["system"]) for run in stored} == expected_runs
    expected = {
        log.record["sha256"]
        for run in subset_round.runs
        if (run.submitter, run.system) in expected_runs
        for log in run.logs
    }
    if left_out_file is not None:
        expected.discard(hashlib.sha256((SUBSET / left_out_file).read_bytes()).hexdigest())
    assert {log["record"]["sha256"] for run in stored for log in run["logs"]} == expected
    assert {log["scaling"] for run in stored for log in run["logs"]} <= {"strong", "weak"}


@pytest.fixture(scope="module")
def bad_round(tmp_path_factory) -> Path:
    return make_bad_round(tmp_path_factory.mktemp("bad"))


def test_bad_logs_count_in_the_scores_as_the_summarizer_counts_them(tmp_path):
    """A truncated log, a link out and one without run_stop are runs the summarizer drops; an aborted one that
    passes the checker it scores. Its figures on copies of those submitters (with a malformed systems JSON or
    scaling.json it crashes)."""
    bad_round = make_bad_round(tmp_path, ("truncated log", "link out of the folder", "no run_stop", "aborted run"))
    read = read_round(bad_round)
    figures = {}
    for submitter in ("Dell", "HPE+LBNL", "NVIDIA"):
        copy = tmp_path / submitter / submitter
        shutil.copytree(bad_round / submitter, copy, symlinks=True)
        figures[submitter] = summarizer_figures(copy)
    runs = [run for run in read.runs if run.submitter in figures]
    assert compare_with_summarizer(runs, figures) == 5  # Dell has no score: two runs dropped
    dell = next(s for run in runs if run.submitter == "Dell" for s in run.scores)
    assert (dell["counted_runs"], dell["dropped_runs"]) == (4, 2)  # the truncated log and the link out
    assert dell["time_to_train_min"] is None  # two dropped: the summarizer's "too many non-converging runs"


def test_the_command_line_imports_the_good_part_and_exits_2_naming_each_problem(bad_round, tmp_path):
    url = f"sqlite:///{tmp_path}/history.db"
    runs = []
    for attempt in range(2):
        result = subprocess.run(
            [*MLCAMPAIGN, "--store", url, "import-mlperf", str(bad_round)],
            capture_output=True,
            text=True,
            env=os.environ,
        )
        assert result.returncode == 2, result.stderr
        for path, _, what in EXPECTED_PROBLEMS:
            assert f"{bad_round}/{path}: " in result.stderr and what in result.stderr
        runs.append([json.loads(line) for line in result.stdout.splitlines()])
        if attempt == 0:
            before = store_rows(url)
    assert store_rows(url) == before  # the second import added nothing
    assert {(r["submitter"], r["system"]) for r in runs[0]} == {(r["submitter"], r["system"]) for r in runs[1]}
    assert all(r["run_created"] for r in runs[0]) and not any(r["run_created"] for r in runs[1])
