"""MLPerf HPC result rounds into the results store (mlcampaign.history.published_rounds, ``mlcampaign
import-mlperf``): every figure equals mlperf-logging's result_summarizer run on a clean copy of the same
folders (never typed-in numbers), on the subset and on the whole v3.0 round, weak scaling and the CPU-only
Fugaku system included; the whole round imports with exit status 0, counting what it skipped; importing again
adds nothing; a log in two rounds is one record. Bad input, one test each: test_published_import.py."""

import json
import math

import pytest
import sqlalchemy
from mlperf_tools import SUBSET, needs_round, needs_subset, summarizer_figures, writable_copy

from mlcampaign.cli import main
from mlcampaign.history.published_rounds import RoundError, import_round, read_round
from mlcampaign.history.store import open_store
from mlcampaign.records.mlperf.system_descriptions import system_summary

pytestmark = needs_subset
REL = 1e-6


def close(ours, theirs: str) -> bool:
    return math.isclose(float(ours), float(theirs), rel_tol=REL)


def store_rows(url: str) -> dict[str, list[tuple]]:
    """Every row of every table of the store but the schema version's, sorted, without the times of ingest."""
    engine = sqlalchemy.create_engine(url)
    rows = {}
    with engine.connect() as connection:
        inspector = sqlalchemy.inspect(connection)
        for name in inspector.get_table_names():
            if name == "schema_version":
                continue
            columns = [column["name"] for column in inspector.get_columns(name) if not column["name"].endswith("_utc")]
            selected = ", ".join(f'"{column}"' for column in columns)
            rows[name] = sorted(map(tuple, connection.exec_driver_sql(f"SELECT {selected} FROM {name}")))
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
    assert subset_round.problems == [] and subset_round.notices == [] and subset_round.left_out == []
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
        first = import_round(subset_round, store)
        assert first.problems == [] and all(result.run_created for result in first.results)
        assert first.counts()["logs_added"] == 55
        before = store_rows(url)
        again = import_round(read_round(SUBSET), store).counts()
        assert (again["runs_stored"], again["runs_present"], again["logs_added"]) == (0, 6, 0)
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
        report = import_round(read_round(older), store)
        stored = store.published_results()
    (result,) = report.results
    assert report.problems == [] and report.notices == []  # read alike under the hpc 2.0.0 rules: no notice
    assert (result.round, result.run_created, result.logs_added, result.logs_present) == (
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
    (tmp_path / "v3.0" / "README.md").write_text("a round's top holds its repository's files")
    with pytest.raises(RoundError, match="not a round folder"):
        read_round(tmp_path / "v3.0")
    with pytest.raises(RoundError, match=r"rules for rounds v1\.0, v2\.0, v3\.0 only"):
        read_round(tmp_path / "v3.0", "v4.0")


# The whole v3.0 round.


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``mlcampaign *argv`` in this process: exit status, stdout, stderr."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def report_of(out: str) -> dict:
    """The report line of an ``import-mlperf``'s stdout."""
    (report,) = [json.loads(line)["report"] for line in out.splitlines() if line.startswith('{"report"')]
    return report


@needs_round
def test_the_whole_round_imports_with_exit_0_counting_what_it_skipped(whole_round_import):
    """pruned_results/, the repository's LICENSE.md and the systems descriptions without results (NVIDIA's
    template.json, two Perlmutter scales of other rounds) are the round's normal content: skipped and counted.
    (The session's import of the round, into a new store, by the command.)"""
    _, imported = whole_round_import
    status, out, err = imported.returncode, imported.stdout, imported.stderr
    assert (status, err) == (0, "")
    report = report_of(out)
    assert report["skipped"] == {
        "README and LICENSE files": 1,
        "pruned_results/ folders (runs the summarizer does not read)": 1,
        "systems descriptions without results (e.g. a template.json)": 3,
    }
    assert (report["runs_stored"], report["runs_left_out"], report["problems"], report["notices"]) == (16, 0, 0, {})
    # Fugaku's ten open strong-scaling logs are ten of its open weak-scaling models too: stored once.
    assert (report["logs_added"], report["logs_present"]) == (1069, 10)
    assert len(out.splitlines()) == 16 + 1


@needs_round
def test_every_figure_of_the_whole_round_equals_the_summarizers(whole_round, whole_round_summarizer):
    read = read_round(whole_round)
    assert read.problems == [] and read.notices == [] and read.left_out == []
    assert compare_with_summarizer(read.runs, whole_round_summarizer) == 22  # 14 strong folders, 8 weak


def test_numbers_where_the_systems_json_has_strings_are_read_as_older_rounds_write_them(tmp_path):
    """v1.0 and v2.0 rounds write counts as JSON numbers; the figures are the same."""
    round_ = writable_copy(SUBSET / "Dell", tmp_path / "v3.0" / "Dell").parent
    description = round_ / "Dell/systems/32xXE8545x4A100-SXM4-40GB.json"
    fields = json.loads(description.read_text())
    fields |= {"number_of_nodes": 32, "accelerators_per_node": 4, "host_processors_per_node": 2.0}
    fields |= {"host_processor_core_count": 64}
    description.write_text(json.dumps(fields))
    (run,) = read_round(round_).runs
    (subset_dell,) = [run for run in read_round(SUBSET).runs if run.submitter == "Dell"]
    assert run.scores == subset_dell.scores and run.description == fields
    assert system_summary(run.description)["nodes"] == 32


# What the store holds of published rounds: mlcampaign published list | show.


@needs_round
def test_published_list_shows_every_result_in_human_units_and_filters(capsys, whole_round_store):
    status, out, err = cli(capsys, "--store", whole_round_store, "published", "list")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["round", "submitter", "system", "scaling", "benchmark", "division"]
    assert len(lines) == 1 + 22 and "e+" not in out
    fugaku = next(line for line in lines if "fugaku_82944xA64FX_tensorflow_closed" in line)
    assert "82944 nodes" in fugaku and "8 h 15 min" in fugaku and "40.4 M node-minutes" in fugaku
    eos = next(line for line in lines if "eos_n64_ngc23.09_pytorch" in line)
    assert "64x8" in eos and "2 min 6 s" in eos and "1,074 accelerator-minutes" in eos

    status, out, _ = cli(
        capsys, "--store", whole_round_store, "published", "list", "--submitter", "hpe*", "--scaling", "weak"
    )
    assert status == 0 and [line.split()[2] for line in out.splitlines()[1:]] == [
        "perlmutter_10x128x4_ngc21.09_mxnet",
        "perlmutter_10x128x4_ngc21.09_pytorch",
    ]
    status, out, _ = cli(capsys, "--store", whole_round_store, "published", "list", "--benchmark", "oc20", "--json")
    rows = json.loads(out)
    with open_store(whole_round_store, create=False) as store:
        scores = {
            (run["system"], score["scaling"]): score
            for run in store.published_results()
            for score in run["scores"]
            if score["benchmark"] == "oc20"
        }
    assert {(row["system"], row["scaling"]) for row in rows} == set(scores)
    for row in rows:
        score = scores[(row["system"], row["scaling"])]
        minutes = score["time_to_train_min"] if row["scaling"] == "strong" else score["time_to_train_all_min"]
        assert row["time_to_train_min"] == minutes  # full precision
    status, out, _ = cli(capsys, "--store", whole_round_store, "published", "list", "--round", "v2.0")
    assert (status, out) == (0, "no published result matches\n")


@needs_round
def test_published_show_gives_one_run_and_names_the_runs_where_none_is_found(capsys, whole_round_store):
    run = "v3.0/NVIDIA/eos_n256_ngc23.09_pytorch"
    status, out, err = cli(capsys, "--store", whole_round_store, "published", "show", run)
    assert (status, err) == (0, "")
    assert out.startswith("v3.0 NVIDIA eos_n256_ngc23.09_pytorch\n  source: ")
    assert "256 nodes x 8 accelerators (NVIDIA H100 80GB HBM3)" in out and "236 result logs:" in out and "e+" not in out
    status, out, _ = cli(capsys, "--store", whole_round_store, "published", "show", run, "--json")
    shown = json.loads(out)
    assert (shown["round"], shown["submitter"], shown["system"], len(shown["logs"])) == (
        "v3.0",
        "NVIDIA",
        run.split("/")[2],
        236,
    )
    status, _, err = cli(capsys, "--store", whole_round_store, "published", "show", "v3.0/NVIDIA/eos")
    assert status == 2 and err.startswith(
        "mlcampaign published: no published run 'v3.0/NVIDIA/eos' (<round>/<submitter>/<system>); published runs: "
        "v3.0/Clemson/18xR750-2xA100-PCIe-80GB, "
    )
    assert "v3.0/NVIDIA/eos_n64_ngc23.09_pytorch" in err and err.endswith(f" (results store {whole_round_store})\n")
