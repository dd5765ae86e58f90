"""Published MLPerf HPC runs beside a campaign's cells (mlcampaign.analysis.mlperf_results, through
mlcampaign.history.merge.merged_tables): one ranking with published rows marked, time to train as the store
has the summarizer's, accelerator- or node-minutes, a submitter's scaling, Valid FLOPS at the MLPerf model
size (cross-checked with the benchmark folders' closed forms), benchmarks the project does not run kept."""

import copy

import numpy as np
import pytest
from mlperf_tools import SUBSET, needs_round, needs_subset, writable_copy
from synthetic_records import synthetic_history

from mlcampaign.history.merge import AnalysisSettings, merged_tables
from mlcampaign.history.published_rounds import import_round, read_round
from mlcampaign.history.store import open_store
from mlcampaign.plan import registry

pytestmark = needs_subset
REL = 1e-9


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> list[dict]:
    url = f"sqlite:///{tmp_path_factory.mktemp('store')}/history.db"
    with open_store(url) as store:
        import_round(read_round(SUBSET), store)
        return store.published_results()


def campaign(benchmarks=("deepcam", "cosmoflow"), device="cpu"):
    """One synthetic run of a CPU system with the project's MLPerf HPC benchmarks (5 trials a cell)."""
    manifests, records = synthetic_history({"site-a": ["alpha"]}, list(benchmarks), [("1x1", "fp32")], 1, trials=(5, 5))
    for manifest in manifests:
        for name, config in manifest["benchmarks"].items():
            config["model"] = {"name": name}
        manifest["systems"]["alpha"]["device"] = device
    return manifests, records


def tables(published, benchmarks=("deepcam", "cosmoflow"), device="cpu"):
    manifests, records = campaign(benchmarks, device)
    return merged_tables(manifests, records, AnalysisSettings.from_manifest(manifests[-1]), published)


def by_system(table, benchmark=None):
    rows = table if benchmark is None else table.loc[table["benchmark"] == benchmark]
    return {row["system"]: row for row in rows.to_dict(orient="records")}


def test_published_entries_are_ranked_with_the_cells_and_marked(published):
    ranking = tables(published)["ranking"]
    deepcam = by_system(ranking, "deepcam")
    assert set(deepcam) == {"alpha", "Dell/32xXE8545x4A100-SXM4-40GB", "HPE+LBNL/perlmutter_512x4"}
    dell = deepcam["Dell/32xXE8545x4A100-SXM4-40GB"]
    assert (dell["origin"], dell["status"], dell["round"], dell["submitter"], dell["n"]) == (
        "published", "published", "v3.0", "Dell", 5
    )  # fmt: skip
    assert dell["source"].endswith("mlperf-hpc-v3.0-subset/Dell/results/32xXE8545x4A100-SXM4-40GB")
    assert deepcam["alpha"]["origin"] == "measured" and np.isnan(deepcam["alpha"]["round"])
    ranks = sorted(row["rank"] for row in deepcam.values())
    assert ranks == [1, 2, 3] and all(0 <= row["p_rank"] <= 1 for row in deepcam.values())
    cosmoflow = by_system(ranking, "cosmoflow")
    assert "Fujitsu+RIKEN/fugaku_512xA64FX_tensorflow_closed" in cosmoflow
    assert "oc20" not in set(ranking["benchmark"])  # no campaign cell to rank it with: listed in mlperf_results


def test_valid_flops_count_the_mlperf_model_size(published):
    """Per log: training FLOPs of every trained sample plus forward FLOPs of every evaluated one, over its
    time to train; the counter's FLOPs per sample within 1 % of the benchmark folder's closed form."""
    ranking = tables(published)["ranking"]
    dell_run = next(run for run in published if run["submitter"] == "Dell")
    flops = dell_run["scores"][0]["flops"]
    closed_train, closed_forward = registry.resolve(registry.models()["deepcam"].closed_form_flops)()
    assert flops["train_per_sample"] == pytest.approx(closed_train, rel=0.01)
    assert flops["forward_per_sample"] == pytest.approx(closed_forward, rel=0.01)
    expected = np.mean(
        [
            (flops["train_per_sample"] * r["samples_trained"] + flops["forward_per_sample"] * r["samples_evaluated"])
            / (r["time_to_train_min"] * 60)
            for r in (log["record"] for log in dell_run["logs"])
        ]
    )
    dell = by_system(ranking, "deepcam")["Dell/32xXE8545x4A100-SXM4-40GB"]
    assert dell["valid_flops_per_s"] == pytest.approx(expected, rel=REL) and dell["penalty"] == 1.0


def test_mlperf_results_lists_time_to_train_and_resource_minutes(published):
    table = tables(published)["mlperf_results"]
    scores = {(run["system"], s["benchmark"], s["scaling"]): s for run in published for s in run["scores"]}
    rows = {(row["system"], row["mlperf_benchmark"], row["scaling"]): row for row in table.to_dict(orient="records")}
    assert {key for key in rows if key[0] != "alpha"} == set(scores)  # every published score, oc20 included
    for key, score in scores.items():
        row = rows[key]
        assert row["origin"] == "published"
        if key[2] == "strong":
            assert row["time_to_train_min"] == score["time_to_train_min"]  # the summarizer's, as stored
    fugaku = rows[("fugaku_512xA64FX_tensorflow_closed", "cosmoflow", "strong")]
    assert (fugaku["resource"], fugaku["accelerator"]) == ("node-minutes", "none (CPU only)")
    assert fugaku["resource_minutes"] == pytest.approx(512 * fugaku["time_to_train_min"], rel=REL)
    eos = rows[("eos_n64_ngc23.09_pytorch", "cosmoflow", "strong")]
    assert eos["resource"] == "accelerator-minutes" and eos["accelerator"] == "NVIDIA H100 80GB HBM3"
    assert eos["resource_minutes"] == pytest.approx(64 * 8 * eos["time_to_train_min"], rel=REL)
    weak = rows[("perlmutter_10x128x4_ngc21.09_pytorch", "deepcam", "weak")]
    assert weak["number_of_models"] == 10 and weak["throughput_models_per_min"] == pytest.approx(
        10 / weak["time_to_train_min"], rel=REL
    )
    assert weak["resource_minutes"] == pytest.approx(10 * 128 * 4 * weak["time_to_train_min"], rel=REL)
    assert rows[("perlmutter_128x4", "oc20", "strong")]["benchmark"] == "oc20"  # not a campaign benchmark
    measured = rows[("alpha", "cosmoflow", "strong")]
    assert (measured["origin"], measured["resource"]) == ("measured", "node-minutes")  # a CPU system


def test_a_submitters_published_scales_give_its_scaling(published):
    """Dell at twice the nodes, in half the time but one minute: a speedup below 2 and its efficiency."""
    doubled = copy.deepcopy(next(run for run in published if run["submitter"] == "Dell"))
    doubled["system"] = "64xXE8545x4A100-SXM4-40GB"
    doubled["description"]["number_of_nodes"] = "64"
    for log in doubled["logs"]:
        log["record"]["number_of_nodes"] = 64
        log["record"]["sha256"] = log["record"]["sha256"][::-1]  # other logs: another result, not the same one
    score = doubled["scores"][0]
    score["time_to_train_min"] = score["time_to_train_min"] / 2 + 1
    table = tables([*published, doubled], benchmarks=("deepcam",))["mlperf_results"]
    dell = table.loc[table["submitter"] == "Dell"].set_index("system")
    speedup = published[0]["scores"][0]["time_to_train_min"] / score["time_to_train_min"]
    assert dell.loc["32xXE8545x4A100-SXM4-40GB", "speedup"] == 1.0
    assert dell.loc["64xXE8545x4A100-SXM4-40GB", "speedup"] == pytest.approx(speedup, rel=REL)
    assert dell.loc["64xXE8545x4A100-SXM4-40GB", "scaling_efficiency"] == pytest.approx(speedup / 2, rel=REL)
    others = table.loc[(table["submitter"] != "Dell") & (table["scaling"] == "strong")]
    assert others["speedup"].isna().all()  # one scale each


def test_without_published_runs_the_tables_are_the_campaigns_own(published):
    without = tables(None)
    assert "mlperf_results" not in without and "origin" not in without["ranking"]
    assert set(without["ranking"]["system"]) == {"alpha"}


def test_a_result_published_in_two_rounds_is_ranked_once_under_its_first(published, tmp_path):
    """Dell's logs, byte for byte, as a v2.0 round too: one ranking entry and one mlperf_results row, under v2.0,
    naming v3.0."""
    older = writable_copy(SUBSET / "Dell", tmp_path / "hpc_results_v2.0" / "Dell").parent
    url = f"sqlite:///{tmp_path}/history.db"
    with open_store(url) as store:
        import_round(read_round(SUBSET), store)
        import_round(read_round(older), store)
        both = store.published_results()
    built = tables(both, benchmarks=("deepcam",))
    dell = built["ranking"].loc[built["ranking"]["submitter"] == "Dell"]
    assert (len(dell), dell.iloc[0]["round"], dell.iloc[0]["n"]) == (1, "v2.0", 5)
    assert dell.iloc[0]["also_published_in"] == "v3.0 Dell/32xXE8545x4A100-SXM4-40GB"
    results = built["mlperf_results"]
    (row,) = results.loc[results["submitter"] == "Dell"].to_dict(orient="records")
    assert (row["round"], row["also_published_in"]) == ("v2.0", "v3.0 Dell/32xXE8545x4A100-SXM4-40GB")
    assert len(built["ranking"].loc[built["ranking"]["benchmark"] == "deepcam"]) == 3  # alpha, Dell, Perlmutter


@needs_round
def test_weak_scaling_figures_are_per_instance_and_equal_the_summarizers_columns(
    whole_round_store, whole_round_summarizer
):
    """Per weak-scaling folder of the whole v3.0 round, from the summarizer's columns (number_of_models M,
    instance_scale S, time_to_train_all TTTa, accelerators_count T, or number_of_nodes without accelerators):
    throughput M / TTTa; resources min(M x S, T) x TTTa, per model that / M."""
    with open_store(whole_round_store, create=False) as store:
        runs = store.published_results()
    table = tables(runs)["mlperf_results"]
    weak = table.loc[(table["scaling"] == "weak") & (table["origin"] == "published")]
    weak = weak.drop_duplicates(["submitter", "system", "mlperf_benchmark"])
    assert len(weak) == 8
    for row in weak.to_dict(orient="records"):
        theirs = whole_round_summarizer[row["submitter"]][(row["system"], "weak", row["mlperf_benchmark"])]
        models, scale, minutes = (
            float(theirs[key]) for key in ("number_of_models", "instance_scale", "time_to_train_all")
        )
        system = float(theirs["accelerators_count"]) or float(theirs["number_of_nodes"])
        assert (row["number_of_models"], row["instance_scale"]) == (models, scale)
        assert row["throughput_models_per_min"] == pytest.approx(models / minutes, rel=REL)
        assert row["resource_minutes"] == pytest.approx(min(models * scale, system) * minutes, rel=REL)
        assert row["resource_minutes_per_model"] == pytest.approx(row["resource_minutes"] / models, rel=REL)
        assert row["resource"] == ("accelerator-minutes" if float(theirs["accelerators_count"]) else "node-minutes")
    by_folder = {(row["system"], row["mlperf_benchmark"]): row for row in weak.to_dict(orient="records")}
    # NVIDIA's DeepCAM logs name the whole 256-node system as each of the 128 instances' scale: the system is
    # counted once (2048 accelerators for the time to train all), not once per model (128 times as much).
    eos = by_folder[("eos_n256_ngc23.09_pytorch", "deepcam")]
    assert (eos["instance_scale"], eos["number_of_models"]) == (2048, 128)
    assert eos["resource_minutes"] == pytest.approx(2048 * eos["time_to_train_min"], rel=REL)
    # Perlmutter's ten DeepCAM instances of 128 nodes x 4 fill its 1280 nodes.
    perlmutter = by_folder[("perlmutter_10x128x4_ngc21.09_pytorch", "deepcam")]
    assert perlmutter["resource_minutes_per_model"] == pytest.approx(512 * perlmutter["time_to_train_min"], rel=REL)


@pytest.mark.parametrize("benchmarks", [("extreme_weather",), ("resnet50",), ("extreme_weather", "deepcam")])
def test_published_runs_never_break_the_tables_of_any_mix_of_benchmarks(published, benchmarks):
    """Campaigns without an MLPerf HPC benchmark (HPC AI500's, a ResNet-50 one) and a mixed one."""
    built = tables(published, benchmarks=benchmarks)
    assert set(built["ranking"]["benchmark"]) == set(benchmarks)
    assert len(built["mlperf_results"].loc[built["mlperf_results"]["origin"] == "published"]) == 7
