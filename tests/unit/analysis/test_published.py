"""Published campaigns as configs (config/campaigns/), their numbers as data (config/published/) and
the comparison of measured cells with them (mlcampaign.analysis.published)."""

import copy
import os
import re
import subprocess

import numpy as np
import pandas as pd
import pytest
import synthetic_records as synthetic
import yaml

from mlcampaign.analysis.capability import capability_matrix
from mlcampaign.analysis.frame import campaign_frame, planned_frame, trial_frame
from mlcampaign.analysis.plots import published_comparison_figure
from mlcampaign.analysis.published import comparison_table, measured_cells
from mlcampaign.analysis.valid_flops import counting_label
from mlcampaign.plan.campaign import UNPLANNED_CELL
from mlcampaign.plan.config import load_campaign, load_published
from mlcampaign.plan.config_files import ConfigError

from conftest import REPO, SNAKEMAKE, job_counts, trial_resources

CONFIG_DIR = REPO / "config"


def campaign_file(name: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / "campaigns" / f"{name}.yaml").read_text())


def cells_of(campaign) -> pd.DataFrame:
    plan = campaign.trial_matrix().reset_index(drop=True)
    return plan.groupby(["system", "benchmark", "cell"]).size().rename("trials").reset_index()


# -- the EPCC 2024 campaign --------------------------------------------------------------------
def test_epcc_plans_the_paper_layouts_and_lists_the_unsupported_pairs():
    campaign = load_campaign(campaign_file("epcc-2024"), CONFIG_DIR, source="epcc-2024.yaml")
    cells = cells_of(campaign)
    layouts = {(row.system, row.benchmark): row.cell for row in cells.itertuples()}
    # ARCHER2 CPU: 32 ranks, ResNet-50 and CosmoFlow as 2 x 16, DeepCAM as 4 x 8; GPUs: 4 per run.
    assert layouts.pop(("archer2-cpu", "resnet50")) == "2x16-fp32"
    assert layouts.pop(("archer2-cpu", "cosmoflow")) == "2x16-fp32"
    assert layouts.pop(("archer2-cpu", "deepcam")) == "4x8-fp32"
    assert set(layouts.values()) == {"1x4-fp32"}
    assert {system for system, _ in layouts} == {"archer2-mi210", "cirrus-v100", "eidf-a100"}
    assert (cells["trials"] == 3).all() and len(cells) == 12

    unplanned = campaign.unplanned_cells().set_index(["system", "benchmark"])
    assert len(unplanned) == 6 and (unplanned["cell"] == UNPLANNED_CELL).all()
    expected = unplanned["expected_outcome"].dropna().to_dict()
    assert expected == {
        ("graphcore-bow-pod64", "deepcam"): "out_of_memory",
        ("cerebras-cs2", "cosmoflow"): "compile_error",
        ("cerebras-cs2", "deepcam"): "compile_error",
    }
    # Pairs that ran in the paper cannot run here: no launcher, said by the system file.
    assert unplanned.loc[("graphcore-bow-pod64", "resnet50"), "detail"].startswith("no launcher for IPUs")
    assert not unplanned["runnable"].any()


def test_capability_matrix_shows_expected_outcomes_as_such():
    campaign = load_campaign(campaign_file("epcc-2024"), CONFIG_DIR)
    frame = campaign_frame(planned_frame(campaign.trial_matrix()), trial_frame([]), campaign.benchmarks)
    capability = capability_matrix(frame, campaign.unplanned_cells()).set_index(["system", "benchmark"])
    assert capability.loc[("graphcore-bow-pod64", "deepcam"), "outcome"] == "expected: out of memory (published)"
    assert capability.loc[("cerebras-cs2", "cosmoflow"), "outcome"] == "expected: compile error (published)"
    assert capability.loc[("cerebras-cs2", "resnet50"), "status"] == "not supported"
    assert capability.loc[("cerebras-cs2", "resnet50"), "planned"] == 0
    assert (capability.loc["archer2-cpu", "status"] == "not run").all()


def test_an_expected_outcome_on_a_runnable_system_is_not_planned(default_campaign):
    config = default_campaign | {
        "expected_outcomes": [
            {"system": "local-cpu", "benchmark": "deepcam", "outcome": "out_of_memory", "source": "test"}
        ]
    }
    campaign = load_campaign(config, CONFIG_DIR)
    assert "deepcam" not in set(campaign.trial_matrix()["benchmark"])
    (row,) = campaign.unplanned_cells().itertuples()
    assert (row.system, row.benchmark, row.expected_outcome, row.runnable) == (
        "local-cpu",
        "deepcam",
        "out_of_memory",
        True,
    )


def test_system_matrix_overrides_and_expected_outcomes_are_checked(default_campaign):
    def load(**changes):
        return load_campaign(copy.deepcopy(default_campaign) | changes, CONFIG_DIR, source="c.yaml")

    with pytest.raises(ConfigError, match=re.escape("key 'system_matrix_overrides.nope': value 'nope': no file")):
        load(system_matrix_overrides={"nope": {"scales": ["1x1"]}})
    with pytest.raises(
        ConfigError, match=re.escape("key 'system_matrix_overrides.local-cpu.benchmarks': value 'x': no file")
    ):
        load(system_matrix_overrides={"local-cpu": {"benchmarks": {"x": {"scales": ["1x1"]}}}})
    with pytest.raises(
        ConfigError, match=re.escape("key 'system_matrix_overrides.local-cpu.benchmarks.deepcam.scales': value '3x1'")
    ):
        load(system_matrix_overrides={"local-cpu": {"benchmarks": {"deepcam": {"scales": ["3x1"]}}}})
    with pytest.raises(ConfigError, match=re.escape("key 'expected_outcomes.0.benchmark': value 'resnet50'")):
        load(expected_outcomes=[{"system": "local-cpu", "benchmark": "resnet50", "outcome": "error", "source": "s"}])
    with pytest.raises(ConfigError, match=re.escape("key 'expected_outcomes.0.outcome': value 'slow'")):
        load(expected_outcomes=[{"system": "local-cpu", "benchmark": "deepcam", "outcome": "slow", "source": "s"}])
    with pytest.raises(ConfigError, match="no trial is planned"):
        load(systems=["cerebras-cs2"])


def test_a_system_without_launcher_needs_a_reason_not_numbers(tmp_path):
    config_dir = tmp_path / "config"
    (config_dir / "systems").mkdir(parents=True)
    (config_dir / "benchmarks").symlink_to(CONFIG_DIR / "benchmarks")
    system = yaml.safe_load((CONFIG_DIR / "systems" / "cerebras-cs2.yaml").read_text())
    del system["not_runnable_reason"]
    (config_dir / "systems" / "cerebras-cs2.yaml").write_text(yaml.safe_dump(system))
    config = {"campaign": "c", "seed": 1, "trials": 1, "systems": ["cerebras-cs2"], "benchmarks": ["deepcam"]}
    with pytest.raises(ConfigError, match=r"key 'not_runnable_reason': missing \(required\)"):
        load_campaign(config | {"matrix": {"scales": ["1x1"], "precisions": ["fp32"]}}, config_dir)


def test_hpcai500_scales_one_to_64_gpus_fp32_and_mixed_with_compression():
    if not (CONFIG_DIR / "benchmarks" / "extreme-weather.yaml").is_file():
        pytest.skip("config/benchmarks/extreme-weather.yaml (issue 9) does not exist yet")
    campaign = load_campaign(campaign_file("hpcai500"), CONFIG_DIR, source="hpcai500.yaml")
    plan = campaign.trial_matrix().reset_index(drop=True)
    assert set(plan["benchmark"]) == {"resnet50", "extreme-weather"}
    assert sorted(set(plan["processes"])) == [1, 2, 4, 8, 16, 32, 64]
    assert set(plan["precision"]) == {"fp32", "fp16"}
    # Gradient compression only where there is an all-reduce to compress.
    assert set(plan.loc[plan["processes"] == 1, "compression"]) == {"none"}
    assert set(plan.loc[plan["processes"] == 64, "compression"]) == {"none", "fp16"}
    assert campaign.benchmarks["resnet50"]["target"]["value"] == 0.763


# -- published numbers -------------------------------------------------------------------------
@pytest.mark.parametrize("study", ["epcc-2024", "hpcai500"])
def test_published_numbers_are_valid_data_with_citations(study):
    published = load_published(study, CONFIG_DIR)
    assert published["citation"] and published["unlisted"]
    assert all(entry["where"] and entry["units"] for entry in published["values"])


def test_hpcai500_cells_count_flops_as_the_study_does():
    """The comparison is like for like: the campaign's ResNet-50 cells follow the accounting the study's
    image-classification FLOPS follow; the extreme-weather numbers state none (unknown)."""
    campaign = load_campaign(campaign_file("hpcai500"), CONFIG_DIR)
    measured_side = counting_label(campaign.benchmarks["resnet50"]["valid_flops"]["counting"])
    published = {
        (entry["benchmark"], entry["value"]): entry.get("flops_counting")
        for entry in load_published("hpcai500", CONFIG_DIR)["values"]
        if entry["metric"] == "valid_flops_per_s"
    }
    assert {counting_label(c) for (benchmark, _), c in published.items() if benchmark == "resnet50"} == {measured_side}
    assert published[("extreme-weather", 109)] is None
    assert measured_side == "training only; 90 nominal epochs x training set; 23 GFLOP per training sample"


def test_published_epcc_numbers_are_the_readable_ones():
    values = {(e["system"], e["metric"]): e["value"] for e in load_published("epcc-2024", CONFIG_DIR)["values"]}
    assert values == {
        ("archer2-cpu", "compute_throughput_samples_per_s"): 40.5,
        ("archer2-cpu", "throughput_samples_per_s"): 40.1,
        ("archer2-mi210", "compute_throughput_samples_per_s"): 293.2,
        ("archer2-mi210", "throughput_samples_per_s"): None,  # unknown: the row says so
    }


def test_bad_published_file_names_file_key_and_value(tmp_path):
    (tmp_path / "published").mkdir()
    data = yaml.safe_load((CONFIG_DIR / "published" / "epcc-2024.yaml").read_text())
    data["values"][0]["value"] = "forty"
    (tmp_path / "published" / "epcc-2024.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=re.escape("epcc-2024.yaml: key 'values.0.value': value 'forty'")):
        load_published("epcc-2024", tmp_path)
    data["values"][0] |= {"value": 40.5, "system": "archer2"}
    (tmp_path / "published" / "epcc-2024.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "systems").symlink_to(CONFIG_DIR / "systems")
    (tmp_path / "benchmarks").symlink_to(CONFIG_DIR / "benchmarks")
    with pytest.raises(ConfigError, match=re.escape("key 'values.0.system': value 'archer2': no file config/systems")):
        load_published("epcc-2024", tmp_path)


# -- the comparison ----------------------------------------------------------------------------
PUBLISHED = {
    "study": "s",
    "citation": "Paper 2024",
    "unlisted": "unknown: not in the paper",
    "values": [
        {
            "system": "sys-a",
            "benchmark": "b",
            "configuration": {"scale": "1x4", "precision": "fp32"},
            "metric": "throughput_samples_per_s",
            "published_metric": "speed",
            "value": 100.0,
            "units": "inputs/s",
            "scale_to_measured": 1.0,
            "where": "Table 2",
        },
        {
            "system": "sys-a",
            "benchmark": "b",
            "configuration": {"scale": "1x4", "precision": "fp32"},
            "metric": "compute_throughput_samples_per_s",
            "published_metric": "compute speed",
            "value": 50.0,
            "units": "inputs/s",
            "scale_to_measured": 1.0,
            "where": "Table 2",
            "tolerance": {"below": 0.05, "above": 0.10},
        },
        {
            "system": "sys-a",
            "benchmark": "b",
            "configuration": {"scale": "1x4", "precision": "bf16"},
            "metric": "throughput_samples_per_s",
            "published_metric": "speed",
            "value": 400.0,
            "units": "inputs/s",
            "scale_to_measured": 1.0,
            "where": "Table 2",
        },
        {
            "system": None,
            "benchmark": "b",
            "configuration": {"processes": 4},
            "metric": "valid_flops_per_s",
            "published_metric": "TFLOPS",
            "value": 2.0,
            "units": "TFLOPS",
            "scale_to_measured": 1e12,
            "where": "Fig. 3",
        },
        {
            "system": "sys-gc",
            "benchmark": "b",
            "metric": "throughput_samples_per_s",
            "published_metric": "speed",
            "value": None,
            "units": "inputs/s",
            "scale_to_measured": 1.0,
            "where": "Table 2",
        },
    ],
}
NO_STAND_INS = {"systems": {}, "benchmarks": {}}


def measured(rows, flops_counting="training + evaluation; measured samples; counted FLOPs per sample"):
    """measured_cells() rows; the Valid FLOPS rows follow ``flops_counting``."""
    table = pd.DataFrame(
        rows, columns=["system", "benchmark", "cell", "metric", "n", "measured", "measured_ci_low", "measured_ci_high"]
    )
    table["flops_counting"] = table["metric"].map({"valid_flops_per_s": flops_counting}).fillna("")
    return table


def cells(*rows):
    return pd.DataFrame(rows, columns=["system", "benchmark", "cell", "scale", "processes", "precision", "compression"])


def capability(*rows):
    return pd.DataFrame(rows, columns=["system", "benchmark", "cell", "status", "outcome"])


def test_verdicts_within_ci_tolerance_faster_slower_and_missing():
    table = comparison_table(
        measured(
            [
                ("sys-a", "b", "1x4-fp32", "throughput_samples_per_s", 3, 98.0, 90.0, 106.0),  # 100 inside CI
                ("sys-a", "b", "1x4-fp32", "compute_throughput_samples_per_s", 3, 54.0, 53.0, 55.0),  # +8 % < +10 %
                ("sys-a", "b", "1x4-fp32", "valid_flops_per_s", 3, 1.0e12, 0.9e12, 1.1e12),  # half of 2 TFLOPS
                ("sys-a", "b", "1x4-bf16", "throughput_samples_per_s", 3, 500.0, 480.0, 520.0),  # above 400
                ("sys-b", "b", "1x1-fp32", "throughput_samples_per_s", 3, 10.0, 9.0, 11.0),  # no entry
            ]
        ),
        cells(
            ("sys-a", "b", "1x4-fp32", "1x4", 4, "fp32", "none"),
            ("sys-a", "b", "1x4-bf16", "1x4", 4, "bf16", "none"),
            ("sys-b", "b", "1x1-fp32", "1x1", 1, "fp32", "none"),
        ),
        capability(
            ("sys-a", "b", "1x4-fp32", "ok", "ok"),
            ("sys-a", "b", "1x4-bf16", "ok", "ok"),
            ("sys-b", "b", "1x1-fp32", "ok", "ok"),
            ("sys-gc", "b", UNPLANNED_CELL, "expected", "expected: out of memory (published)"),
        ),
        PUBLISHED,
        NO_STAND_INS,
    )
    verdicts = {(r.system, r.cell, r.published_metric): r.verdict for r in table.itertuples()}
    assert verdicts == {
        ("sys-a", "1x4-fp32", "speed"): "within CI",
        ("sys-a", "1x4-fp32", "compute speed"): "within published tolerance",
        ("sys-a", "1x4-fp32", "TFLOPS"): "slower",
        ("sys-a", "1x4-bf16", "speed"): "faster",
        ("sys-a", "1x4-bf16", "TFLOPS"): "not measured: no valid_flops_per_s in this cell",
        ("sys-b", "1x1-fp32", ""): "no published number",
        ("sys-gc", UNPLANNED_CELL, "speed"): "not measured: expected: out of memory (published)",
    }
    row = table.set_index(["cell", "published_metric"]).loc[("1x4-fp32", "TFLOPS")]
    assert row["measured"] == pytest.approx(1.0) and row["ratio"] == pytest.approx(0.5)  # in published units
    assert row["source"] == "Paper 2024; Fig. 3" and row["tolerance"] == "none published"
    no_number = table.set_index("system").loc["sys-b"]
    assert no_number["note"] == "unknown: not in the paper"
    assert (no_number["metric"], no_number["measured"], no_number["n"]) == ("throughput_samples_per_s", 10.0, 3)


def test_a_stand_in_compares_regardless_of_layout_but_not_of_precision():
    stand_ins = {"systems": {"laptop": ["sys-a"]}, "benchmarks": {"b-small": "b"}}
    table = comparison_table(
        measured([("laptop", "b-small", "1x1-fp32", "throughput_samples_per_s", 2, 5.0, 4.0, 6.0)]),
        cells(("laptop", "b-small", "1x1-fp32", "1x1", 1, "fp32", "none")),
        capability(("laptop", "b-small", "1x1-fp32", "ok", "ok")),
        PUBLISHED,
        stand_ins,
    )
    (row,) = table.loc[table["published_metric"] == "speed"].itertuples()
    assert (row.published_system, row.published_benchmark, row.published_configuration) == (
        "sys-a",
        "b",
        "1x4 precision=fp32",
    )
    assert row.verdict == "slower" and row.ratio == pytest.approx(0.05)
    # The bf16 number does not stand beside an fp32 cell; the study-machine number needs 4 processes.
    assert 400.0 not in set(table["published"]) and 2.0 not in set(table["published"])
    figure = published_comparison_figure(table)
    assert figure.axes[0].get_xscale() == "log"


def test_published_numbers_without_a_measured_cell_are_listed():
    table = comparison_table(
        measured([]),
        cells(("sys-a", "b", "1x4-fp32", "1x4", 4, "fp32", "none")),
        capability(("sys-a", "b", "1x4-fp32", "failed", "failed: out of memory")),
        PUBLISHED,
        NO_STAND_INS,
    )
    verdicts = table.groupby("cell")["verdict"].agg(set).to_dict()
    assert verdicts["1x4-fp32"] == {"not measured: failed: out of memory"}
    # The bf16 number of a campaign system with no bf16 cell in the campaign.
    assert verdicts[""] == {"not measured: no cell of this campaign has this configuration"}


STUDY_COUNTING = {"work": "training", "samples": "nominal", "nominal_epochs": 90, "train_flops_per_sample": 23.0e9}


def _flops_comparison(flops_counting: str, published_counting: dict | None):
    published = copy.deepcopy(PUBLISHED)
    entry = published["values"][3]  # the study-machine TFLOPS number
    if published_counting is not None:
        entry["flops_counting"] = published_counting
    table = comparison_table(
        measured(
            [
                ("sys-a", "b", "1x4-fp32", "valid_flops_per_s", 3, 1.9e12, 1.8e12, 2.1e12),
                ("sys-a", "b", "1x4-fp32", "throughput_samples_per_s", 3, 98.0, 90.0, 106.0),
            ],
            flops_counting,
        ),
        cells(("sys-a", "b", "1x4-fp32", "1x4", 4, "fp32", "none")),
        capability(("sys-a", "b", "1x4-fp32", "ok", "ok")),
        published,
        NO_STAND_INS,
    )
    return table.loc[table["cell"] == "1x4-fp32"].set_index("published_metric")


def test_a_valid_flops_row_states_the_convention_of_both_sides():
    same = counting_label(STUDY_COUNTING)
    table = _flops_comparison(same, STUDY_COUNTING)
    flops = table.loc["TFLOPS"]
    assert (flops["measured_flops_counting"], flops["published_flops_counting"]) == (same, same)
    assert flops["verdict"] == "within CI" and "not like for like" not in flops["note"]
    # A throughput compares no FLOPs: no convention on either side.
    assert (table.loc["speed", "measured_flops_counting"], table.loc["speed", "published_flops_counting"]) == ("", "")


def test_different_flop_accounting_is_flagged_and_an_unstated_one_is_said_so():
    project = "training + evaluation; measured samples; counted FLOPs per sample"
    flops = _flops_comparison(project, STUDY_COUNTING).loc["TFLOPS"]
    assert flops["published_flops_counting"] == counting_label(STUDY_COUNTING)
    assert flops["note"].startswith("FLOP accounting differs from the study's: the ratio is not like for like")
    unstated = _flops_comparison(project, None).loc["TFLOPS"]
    assert unstated["published_flops_counting"] == "not stated" and "not like for like" not in unstated["note"]


def test_measured_cells_carry_the_convention_of_their_valid_flops():
    config = synthetic.benchmark_config()
    config["valid_flops"]["counting"] = STUDY_COUNTING | {"source": "test"}
    rng = np.random.default_rng(5)
    rows = [synthetic.plan_row("sys", "b", "1x1", "fp32", trial) for trial in range(3)]
    frame = campaign_frame(
        planned_frame(pd.DataFrame(rows)), trial_frame([synthetic.record(row, rng) for row in rows]), {"b": config}
    )
    cells_measured = measured_cells(frame, [], 0.95).set_index("metric")
    assert cells_measured.loc["valid_flops_per_s", "flops_counting"] == counting_label(STUDY_COUNTING)
    assert cells_measured.loc["throughput_samples_per_s", "flops_counting"] == ""


# -- dry runs of the published campaigns with their site profiles ---------------------------------
def snakemake_dry_run(tmp_path, profile: str, *configfiles, config: tuple = (), env: dict | None = None):
    return subprocess.run(
        [
            *(SNAKEMAKE, "all", "--dry-run", "--snakefile", str(REPO / "Snakefile")),
            *("--directory", str(tmp_path)),
            *("--profile", str(REPO / "profiles" / profile)),
            *(("--config", *config) if config else ()),
            *("--configfile", *map(str, configfiles)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=None if env is None else os.environ | env,
    )


@pytest.mark.integration
def test_epcc_campaign_dry_runs_with_the_archer2_profiles(tmp_path, shipped_dry_run):
    epcc = CONFIG_DIR / "campaigns" / "epcc-2024.yaml"
    account = {"ARCHER2_ACCOUNT": "e123"}
    # The whole campaign through ARCHER2's profile: Cirrus and EIDF trials would go to ARCHER2's
    # partitions, so planning stops and names them (nothing is planned, nothing written).
    whole = snakemake_dry_run(tmp_path, "archer2", epcc, env=account | {"CIRRUS_ACCOUNT": "ec42"})
    assert whole.returncode != 0
    refusal = whole.stdout + whole.stderr
    assert "this run is at site 'archer2'" in refusal
    assert "cirrus-v100 (site cirrus)" in refusal and "eidf-a100 (site eidf)" in refusal
    assert "other_sites=skip" in refusal and not (tmp_path / "results").exists()

    # This site's part only: ARCHER2's CPU and MI210 systems (3 benchmarks x 3 trials each); the other
    # sites' trials are no jobs here; Graphcore and Cerebras pairs are never jobs.
    here = job_counts(shipped_dry_run("archer2", "epcc-2024", "other_sites=skip", env=account))
    assert here["trial"] == 18 and here["stage_dataset"] == 3 and here["published_comparison"] == 1

    cpu = shipped_dry_run("archer2", "epcc-2024", "systems=[archer2-cpu]", env=account)
    assert job_counts(cpu)["trial"] == 9
    layouts = sorted((r["nodes"], r["tasks"], r["cpus_per_task"], r["slurm_account"]) for r in trial_resources(cpu))
    assert layouts == [("2", "32", "8", "e123")] * 6 + [("4", "32", "16", "e123")] * 3


@pytest.mark.integration
def test_epcc_campaign_dry_runs_with_the_cirrus_and_eidf_profiles(shipped_dry_run):
    cirrus = trial_resources(
        shipped_dry_run("cirrus", "epcc-2024", "systems=[cirrus-v100]", env={"CIRRUS_ACCOUNT": "ec42"})
    )
    # Cirrus asks for GPUs per node (--gres=gpu:4; config/systems/cirrus-v100.yaml, slurm.gpu_option).
    assert len(cirrus) == 9 and {(r["gres"], r["slurm_account"]) for r in cirrus} == {("gpu:4", "ec42")}
    eidf = trial_resources(shipped_dry_run("eidf", "epcc-2024", "systems=[eidf-a100]"))
    assert len(eidf) == 9 and {(r["gpu"], r["mem_mb"]) for r in eidf} == {("4", "64000")}


@pytest.mark.integration
def test_hpcai500_campaign_dry_runs_with_the_cirrus_profile(shipped_dry_run):
    if not (CONFIG_DIR / "benchmarks" / "extreme-weather.yaml").is_file():
        pytest.skip("config/benchmarks/extreme-weather.yaml (issue 9) does not exist yet")
    output = shipped_dry_run("cirrus", "hpcai500", env={"CIRRUS_ACCOUNT": "ec42"})
    resources = trial_resources(output)
    # 2 benchmarks x (7 scales x 2 precisions + 6 multi-GPU scales x 2 precisions compressed) x 3 trials.
    assert len(resources) == 2 * (14 + 12) * 3
    # 64 GPUs at most: 16 nodes of --gres=gpu:4 (Cirrus asks for GPUs per node).
    assert max(int(r["nodes"]) for r in resources) == 16
    assert {r["gres"] for r in resources} == {"gpu:1", "gpu:2", "gpu:4"}
    assert job_counts(output)["published_comparison"] == 1


@pytest.mark.integration
def test_local_epcc_comparison_plans_on_this_machine(shipped_dry_run):
    output = shipped_dry_run("local", "epcc-2024-local")
    counts = job_counts(output)
    assert counts["trial"] == 6 and counts["published_comparison"] == 1
