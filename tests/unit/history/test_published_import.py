"""What real rounds and real users bring to ``mlcampaign import-mlperf``, each a test of its own through the
command line (in this process): the message (file, field or line, value), the exit status, and the store row
for row before and after.

- Normal content of a published repository (README.md, .DS_Store, package_checker_params, the submitters'
  code, pruned_results/): skipped and counted, exit 0; content the layout does not know: named, exit 0.
- Faults (a truncated log, a link out of the round, no run_stop, an aborted run, a systems JSON that is
  malformed, missing, or has a field of the wrong type or a count that is not positive, a scaling.json that
  cannot be read, a benchmark without rules): exit 2, the run left out whole, nothing of it stored; the
  import after the fix adds it.
- Suspicious logs (not UTF-8, two run_start, a time to train of zero or less, a twin read otherwise):
  imported as the summarizer scores them (its figures on a copy), named with file and line, counted; exit 0.
- A re-import whose score differs (a scaling.json added or removed): refused naming the old and the new
  figure, the store unchanged; with ``--supersede``, replaced, the old one kept as superseded.
"""

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from mlperf_tools import SUBSET, needs_subset, summarizer_figures, writable_copy
from test_published_rounds import cli, compare_with_summarizer, report_of, store_rows

from mlcampaign.history.published_rounds import import_round, read_round
from mlcampaign.history.store import open_store
from mlcampaign.records.mlperf import result_logs

pytestmark = needs_subset
DELL = "Dell/results/32xXE8545x4A100-SXM4-40GB/strong/deepcam"
DELL_JSON = "Dell/systems/32xXE8545x4A100-SXM4-40GB.json"
DELL_RUN = "Dell/32xXE8545x4A100-SXM4-40GB"
EOS = "NVIDIA/results/eos_n64_ngc23.09_pytorch/strong/cosmoflow"
EOS_RUN = "NVIDIA/eos_n64_ngc23.09_pytorch"
PERLMUTTER_512 = "HPE+LBNL/results/perlmutter_512x4/strong/deepcam"
FUGAKU_JSON = "Fujitsu+RIKEN/systems/fugaku_512xA64FX_tensorflow_closed.json"
TRACEBACK = "Traceback (most recent call last)"
# Where every round of these tests is said to be published: runs compare row for row whatever their folder.
SOURCE = "https://github.com/mlcommons/hpc_results_v3.0/tree/main"


def round_of(tmp_path: Path, *submitters: str) -> Path:
    """A round folder (v3.0) holding a writable copy of the subset's ``submitters``."""
    for submitter in submitters:
        writable_copy(SUBSET / submitter, tmp_path / "v3.0" / submitter)
    return tmp_path / "v3.0"


def imported(capsys, url: str, folder: Path, *options: str) -> tuple[int, str, str]:
    status, out, err = cli(capsys, "--store", url, "import-mlperf", str(folder), "--source", SOURCE, *options)
    assert TRACEBACK not in err, err
    return status, out, err


def clean_rows(tmp_path: Path, name: str, *submitters: str, without: Callable[[Path], None] | None = None) -> dict:
    """The store rows of an import of the subset's ``submitters``, ``without`` applied to the copy first."""
    folder = round_of(tmp_path / name, *submitters)
    if without is not None:
        without(folder)
    url = f"sqlite:///{tmp_path / name}/history.db"
    with open_store(url) as store:
        if any(folder.glob("*/results/*")):  # else: the rows of an empty store
            assert import_round(read_round(folder, source=SOURCE), store).problems == []
    return store_rows(url)


def drop_run(run: str) -> Callable[[Path], None]:
    """Remove a run's results folder and systems JSON from a round."""
    submitter, system = run.split("/")

    def drop(folder: Path) -> None:
        shutil.rmtree(folder / submitter / "results" / system)
        (folder / submitter / "systems" / f"{system}.json").unlink()

    return drop


# Normal and unknown content.


def test_the_normal_content_of_a_published_repository_is_skipped_and_counted(capsys, tmp_path):
    folder = round_of(tmp_path, "Dell")
    (folder / "README.md").write_text("# MLPerf HPC v3.0 results\n")
    (folder / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (folder / "Dell" / "README.md").write_text("Dell's submission\n")
    (folder / "Dell" / ".DS_Store").write_bytes(b"\0")
    (folder / "Dell" / "benchmarks" / "deepcam" / "implementations").mkdir(parents=True)
    (folder / "Dell" / "benchmarks" / "deepcam" / "implementations" / "run.sub").write_text("srun ...\n")
    (folder / DELL / "package_checker_params").write_text("ALLOW_ANY\n")
    (folder / DELL / ".DS_Store").write_bytes(b"\0")
    (folder / DELL / "pruned_results").mkdir()
    shutil.copyfile(folder / DELL / "result_0.txt", folder / DELL / "pruned_results" / "result_9.txt")
    (folder / "Dell/results/32xXE8545x4A100-SXM4-40GB/package_checker_params").write_text("")
    (folder / "Dell/systems/template.json").write_text("{}")
    url = f"sqlite:///{tmp_path}/history.db"
    status, out, err = imported(capsys, url, folder)
    assert (status, err) == (0, "")
    assert report_of(out)["skipped"] == {
        "README and LICENSE files": 2,
        "hidden files and folders (.DS_Store, .git, ...)": 3,
        "benchmarks/ folders (the submitters' code)": 1,
        "package_checker_params files": 2,
        "pruned_results/ folders (runs the summarizer does not read)": 1,
        "systems descriptions without results (e.g. a template.json)": 1,
    }
    assert store_rows(url) == clean_rows(tmp_path, "clean", "Dell")


def test_content_the_layout_does_not_know_is_named_and_not_read(capsys, tmp_path):
    folder = round_of(tmp_path, "HPE+LBNL")
    results = folder / "HPE+LBNL/results"
    shutil.copytree(results / "perlmutter_128x4/strong/cosmoflow", results / "perlmutter_128x4/cosmoflow")
    (results / "notes.txt").write_text("hello")
    (folder / PERLMUTTER_512 / "result_0.txt.bak").write_text("an editor's copy")
    (folder / "HPE+LBNL/systems/perlmutter_128x4.json~").write_text("{}")
    url = f"sqlite:///{tmp_path}/history.db"
    status, out, err = imported(capsys, url, folder)
    assert status == 0
    assert report_of(out)["notices"] == {"unknown content": 4}
    for path, what in (
        ("HPE+LBNL/results/perlmutter_128x4/cosmoflow", "results/<system>/ holds strong/ and weak/"),
        ("HPE+LBNL/results/notes.txt", "results/ holds one folder per system"),
        (f"{PERLMUTTER_512}/result_0.txt.bak", "a benchmark folder holds result_<n>.txt files"),
        ("HPE+LBNL/systems/perlmutter_128x4.json~", "systems/ holds one <system>.json per system"),
    ):
        assert f"unknown content: {folder}/{path}: not in the round layout ({what}" in err
    assert store_rows(url) == clean_rows(tmp_path, "clean", "HPE+LBNL")


# Faults: one test each, the run left out whole; the import after the fix adds it.


def truncate(folder: Path) -> None:
    log = folder / DELL / "result_3.txt"
    log.write_bytes(log.read_bytes()[:-60])


def link_out(folder: Path) -> None:
    outside = folder.parent / "outside.txt"
    outside.write_text("not a log of this round")
    (folder / DELL / "result_9.txt").symlink_to(outside)


def drop_run_stop(folder: Path) -> None:
    log = folder / PERLMUTTER_512 / "result_2.txt"
    log.write_text("".join(line for line in log.read_text().splitlines(True) if '"key": "run_stop"' not in line))


def abort(folder: Path) -> None:
    """Cut after the 10th evaluation (the target not reached yet) and stop the run aborted."""
    log = folder / EOS / "result_5.txt"
    lines = log.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if '"key": "eval_stop"' in line]
    lines = lines[: hits[9] + 1]
    last = json.loads(lines[-1].split(":::MLLOG ", 1)[1])
    stop = {"namespace": "", "time_ms": last["time_ms"] + 5, "event_type": "INTERVAL_END", "key": "run_stop"}
    stop |= {"value": None, "metadata": {"file": "main.py", "lineno": 1, "status": "aborted", "epoch_num": 10}}
    log.write_text("".join(lines) + ":::MLLOG " + json.dumps(stop) + "\n")


def break_scaling(folder: Path) -> None:
    (folder / EOS / "scaling.json").write_text('{"scaling_factor": ')


def break_json(folder: Path) -> None:
    description = folder / FUGAKU_JSON
    description.write_text(description.read_text() + "}")


def drop_json(folder: Path) -> None:
    (folder / "HPE+LBNL/systems/perlmutter_512x4.json").unlink()


def system_field(field: str, value) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        description = folder / DELL_JSON
        description.write_text(json.dumps(json.loads(description.read_text()) | {field: value}))

    return change


def unknown_benchmark(folder: Path) -> None:
    """A DeepCAM log renamed as a benchmark mlperf-logging has no rules for, in Dell's folder of that name."""
    rules = folder / "Dell/results/32xXE8545x4A100-SXM4-40GB/strong/extreme-weather"
    rules.mkdir()
    source = (folder / DELL / "result_0.txt").read_text()
    (rules / "result_0.txt").write_text(source.replace('"value": "deepcam"', '"value": "extreme-weather"', 1))


# case -> (submitter, fault, the faulty run, the faulty path, what the message says of it)
FAULTS = {
    "truncated log": ("Dell", truncate, DELL_RUN, f"{DELL}/result_3.txt", "truncated log: its last :::MLLOG line"),
    "link out of the round": (
        "Dell", link_out, DELL_RUN, f"{DELL}/result_9.txt", "a link that leads out of the round folder (to "
    ),
    "no run_stop": (
        "HPE+LBNL", drop_run_stop, "HPE+LBNL/perlmutter_512x4", f"{PERLMUTTER_512}/result_2.txt", "no run_stop"
    ),
    "aborted run": ("NVIDIA", abort, EOS_RUN, f"{EOS}/result_5.txt", "run_stop status 'aborted': an aborted run"),
    "malformed scaling.json": ("NVIDIA", break_scaling, EOS_RUN, f"{EOS}/scaling.json", "not a scaling factor"),
    "malformed systems JSON": (
        "Fujitsu+RIKEN", break_json, "Fujitsu+RIKEN/fugaku_512xA64FX_tensorflow_closed", FUGAKU_JSON, "not JSON"
    ),
    "missing systems JSON": (
        "HPE+LBNL", drop_json, "HPE+LBNL/perlmutter_512x4", "HPE+LBNL/systems/perlmutter_512x4.json",
        "no systems description",
    ),
    "negative accelerators": (
        "Dell", system_field("accelerators_per_node", "-4"), DELL_RUN, DELL_JSON,
        "field 'accelerators_per_node': value '-4' is not a positive count",
    ),
    "no accelerators of a named model": (
        "Dell", system_field("accelerators_per_node", "0"), DELL_RUN, DELL_JSON,
        "field 'accelerators_per_node': value '0' is not a positive count: a node of accelerator model "
        "'NVIDIA A100-SXM4-40GB (400W)' has at least one",
    ),
    "a count that is not a number": (
        "Dell", system_field("number_of_nodes", "thirty-two"), DELL_RUN, DELL_JSON,
        "field 'number_of_nodes': value 'thirty-two' is not a whole number",
    ),
    "a field of the wrong type": (
        "Dell", system_field("framework", ["PyTorch", "22.08"]), DELL_RUN, DELL_JSON,
        "field 'framework': value ['PyTorch', '22.08'] is not a string or a number (a list)",
    ),
    "a number that is not finite": (
        "Dell", system_field("framework", float("nan")), DELL_RUN, DELL_JSON,
        "not JSON (key 'framework': value nan is not a finite number (JSON has no NaN or Infinity))",
    ),
    "benchmark without rules": (
        "Dell", unknown_benchmark, DELL_RUN,
        "Dell/results/32xXE8545x4A100-SXM4-40GB/strong/extreme-weather/result_0.txt", "fails the compliance checker",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", FAULTS)
def test_a_fault_leaves_its_run_out_whole_and_the_import_after_the_fix_adds_it(case, capsys, tmp_path):
    submitter, fault, run, path, what = FAULTS[case]
    folder = round_of(tmp_path / "bad", submitter)
    fault(folder)
    url = f"sqlite:///{tmp_path}/history.db"
    status, out, err = imported(capsys, url, folder)
    assert status == 2
    assert f"mlcampaign import-mlperf: {folder}/{path}: {what}" in err, err
    assert f"(published run {run} left out whole: nothing of it stored)" in err
    assert report_of(out)["runs_left_out"] == 1
    # Row for row what an import of the round without that run stores: nothing of it, all of the others.
    assert store_rows(url) == clean_rows(tmp_path, "without", submitter, without=drop_run(run))
    fixed = writable_copy(SUBSET / submitter, tmp_path / "fixed" / "v3.0" / submitter).parent
    status, out, err = imported(capsys, url, fixed)
    assert (status, err) == (0, "")
    assert store_rows(url) == clean_rows(tmp_path, "clean", submitter)


def test_a_run_left_out_is_scored_as_the_summarizer_scores_its_folders(tmp_path):
    """A truncated log, a link out and one without run_stop are runs the summarizer drops; an aborted one that
    passes the checker it scores. The runs left out for them (``Round.left_out``) carry the summarizer's figures
    of their folders (on copies of those submitters; with a malformed systems JSON or scaling.json it crashes)."""
    folder = round_of(tmp_path / "bad", "Dell", "HPE+LBNL", "NVIDIA")
    for fault in (truncate, link_out, drop_run_stop, abort):
        fault(folder)
    read = read_round(folder)
    figures = {}
    for submitter in ("Dell", "HPE+LBNL", "NVIDIA"):
        copy = tmp_path / submitter / submitter
        shutil.copytree(folder / submitter, copy, symlinks=True)
        figures[submitter] = summarizer_figures(copy)
    assert sorted(f"{run.submitter}/{run.system}" for run in read.left_out) == sorted(
        [DELL_RUN, "HPE+LBNL/perlmutter_512x4", EOS_RUN]
    )
    assert compare_with_summarizer(read.runs + read.left_out, figures) == 5  # Dell has no score: two runs dropped
    dell = next(score for run in read.left_out if run.submitter == "Dell" for score in run.scores)
    assert (dell["counted_runs"], dell["dropped_runs"]) == (4, 2)  # the truncated log and the link out
    assert dell["time_to_train_min"] is None  # two dropped: the summarizer's "too many non-converging runs"


# Suspicious logs: imported as the summarizer scores them, named with file and line, counted.


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def not_utf8(folder: Path) -> None:
    log = folder / DELL / "result_1.txt"
    lines = lines_of(log)
    lines[10] = lines[10].replace(b'"namespace": ""', b'"namespace": "caf\xe9"')
    log.write_bytes(b"".join(lines))


def two_run_starts(folder: Path) -> None:
    log = folder / DELL / "result_1.txt"
    lines = lines_of(log)
    start = next(line for line in lines if b'"key": "run_start"' in line)
    stamp = json.loads(start.split(b":::MLLOG ", 1)[1])["time_ms"]
    log.write_bytes(
        b"".join([*lines[:60], start.replace(str(stamp).encode(), str(stamp + 60000).encode()), *lines[60:]])
    )


def stop_before_start(gap_ms: int) -> Callable[[Path], None]:
    """run_stop stamped ``gap_ms`` after run_start (0: at the same millisecond, negative: before it)."""

    def stamp(folder: Path) -> None:
        log = folder / DELL / "result_1.txt"
        lines = lines_of(log)
        start = next(line for line in lines if b'"key": "run_start"' in line)
        stamp = json.loads(start.split(b":::MLLOG ", 1)[1])["time_ms"]
        at = next(i for i, line in enumerate(lines) if b'"key": "run_stop"' in line)
        stop = json.loads(lines[at].split(b":::MLLOG ", 1)[1])
        lines[at] = lines[at].replace(str(stop["time_ms"]).encode(), str(stamp + gap_ms).encode())
        log.write_bytes(b"".join(lines))

    return stamp


# case -> (change, what the notice says)
SUSPICIOUS = {
    "not UTF-8": (not_utf8, "line 11: not UTF-8 (byte 0xe9); read as Latin-1, as mlperf-logging reads it"),
    "two run_start": (two_run_starts, "lines 42, 61: 2 run_start; the summarizer times the run from line 61"),
    "a negative time": (
        stop_before_start(-54),
        "line 143: run_stop stamped 54 ms before the run_start of line 42: a time to train of -0.0009 min",
    ),
    "a time of zero": (
        stop_before_start(0),
        "line 143: run_stop stamped at the same millisecond as the run_start of line 42: a time to train of 0 min",
    ),
}


@pytest.mark.parametrize("case", SUSPICIOUS)
def test_a_suspicious_log_is_scored_as_the_summarizer_scores_it_and_named(case, capsys, tmp_path):
    change, what = SUSPICIOUS[case]
    folder = round_of(tmp_path, "Dell")
    change(folder)
    url = f"sqlite:///{tmp_path}/history.db"
    status, out, err = imported(capsys, url, folder)
    assert status == 0
    assert err.startswith(f"mlcampaign import-mlperf: suspicious logs: {folder}/{DELL}/result_1.txt: {what}"), err
    assert err.count("\n") == 1
    assert report_of(out)["notices"] == {"suspicious logs": 1}
    with open_store(url) as store:
        (run,) = store.published_results()
    stored = {log["file"]: log["record"]["sha256"] for log in run["logs"]}
    assert stored["result_1.txt"] == hashlib.sha256((folder / DELL / "result_1.txt").read_bytes()).hexdigest()
    figures = {"Dell": summarizer_figures(writable_copy(folder / "Dell", tmp_path / "summarized" / "Dell"))}

    class Stored:  # the stored scores, as compare_with_summarizer reads runs
        submitter, system, scores = run["submitter"], run["system"], run["scores"]

    assert compare_with_summarizer([Stored], figures) == 1


def test_a_log_read_otherwise_than_its_stored_twin_is_named(capsys, tmp_path, monkeypatch):
    """The same bytes in a v2.0 round, read there with another result (as an older reader, or another ruleset,
    would): the stored record is kept and the difference named."""
    url = f"sqlite:///{tmp_path}/history.db"
    assert imported(capsys, url, round_of(tmp_path / "a", "Dell"))[0] == 0
    older = writable_copy(SUBSET / "Dell", tmp_path / "b" / "hpc_results_v2.0" / "Dell").parent
    read_log_record = result_logs.log_record

    def read_otherwise(log, ruleset):
        record = read_log_record(log, ruleset)
        return record | {"quality": round(record["quality"], 2)} if ruleset == "2.0.0" else record

    monkeypatch.setattr(result_logs, "log_record", read_otherwise)
    before = store_rows(url)
    with open_store(url) as store:
        (run,) = store.published_results()
    quality = next(log["record"]["quality"] for log in run["logs"] if log["file"] == "result_0.txt")
    status, out, err = imported(capsys, url, older)
    assert status == 0 and report_of(out)["notices"] == {"logs read otherwise than their stored twin": 5}
    assert (
        f"logs read otherwise than their stored twin: {older}/{DELL}/result_0.txt: its bytes are stored already "
        f"(read under hpc 3.0.0), and this round reads them otherwise: quality ({quality!r} in the store, "
        f"{round(quality, 2)!r} given); the stored record is kept" in err
    ), err
    after = store_rows(url)
    assert after["published_logs"] == before["published_logs"]  # one record per log, as first stored
    assert len(after["published_runs"]) == 2


# A re-import whose score differs.


@pytest.mark.parametrize("change", ["scaling.json removed", "scaling.json added"])
def test_a_changed_score_is_refused_naming_both_figures_or_superseded(change, capsys, tmp_path):
    first = round_of(tmp_path / "first", "NVIDIA")
    second = round_of(tmp_path / "second", "NVIDIA")
    if change == "scaling.json removed":
        (second / EOS / "scaling.json").unlink()
    else:
        (first / EOS / "scaling.json").unlink()
    url = f"sqlite:///{tmp_path}/history.db"
    assert imported(capsys, url, first)[0] == 0
    before = store_rows(url)
    status, _, err = imported(capsys, url, second)
    assert status == 2 and store_rows(url) == before
    with open_store(url) as store:
        (stored,) = store.published_results()
    old = stored["scores"][0]
    assert f"published run v3.0/{EOS_RUN} is already in results store {url} with other content: " in err
    assert f"strong/cosmoflow score: scaling_factor ({old['scaling_factor']!r} in the store, " in err
    assert f"strong/cosmoflow score: time_to_train_min ({old['time_to_train_min']!r} in the store, " in err
    assert "Import it with --supersede to replace it" in err
    status, out, err = imported(capsys, url, second, "--supersede")
    assert (status, err) == (0, "") and report_of(out)["runs_superseded"] == 1
    with open_store(url) as store:
        (replaced,) = store.published_results()
        (kept,) = store.superseded_published_runs()
    assert replaced["scores"][0]["scaling_factor"] != old["scaling_factor"]
    assert kept["scores"] == [old] and (kept["round"], kept["submitter"], kept["system"]) == (
        "v3.0",
        *EOS_RUN.split("/"),
    )
    # Importing the same again: nothing to supersede, nothing written.
    again = store_rows(url)
    assert imported(capsys, url, second, "--supersede")[0] == 0 and store_rows(url) == again
