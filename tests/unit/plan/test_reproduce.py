"""Campaign files that re-run a published MLPerf HPC submission here (mlcampaign.plan.reproduce, ``mlcampaign
reproduce``), from the subset's real logs: they validate as campaigns, state their scaling rules and list every
setting, carried over or not with why. Their dry runs with the site profiles and the local run:
tests/workflow/test_mlperf_workflow.py."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlperf_tools import SUBSET, needs_round, needs_subset

from mlcampaign.cli import main
from mlcampaign.plan import registry, reproduce
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.reproduce import ReproduceError, reproduce_campaign
from mlcampaign.records.mlperf import result_logs

from conftest import REPO

pytestmark = needs_subset
CONFIG = REPO / "config"
DELL = "Dell/results/32xXE8545x4A100-SXM4-40GB/strong/deepcam"
PERLMUTTER = "HPE+LBNL/results/perlmutter_128x4/strong/cosmoflow"
FUGAKU = "Fujitsu+RIKEN/results/fugaku_512xA64FX_tensorflow_closed/strong/cosmoflow"
MLCAMPAIGN = [sys.executable, "-m", "mlcampaign"]


def submission(folder: str) -> dict:
    path = SUBSET / folder
    records = [
        result_logs.log_record(result_logs.read_result_log(log.read_bytes(), "3.0.0"), "3.0.0")
        for log in sorted(path.glob("result_*.txt"))
    ]
    submitter, _, system, _, benchmark = folder.split("/")
    fields = {"round": "v3.0", "submitter": submitter, "system": system, "benchmark": benchmark}
    return fields | {"source": str(path), "records": records}


def config(name: str, kind: str) -> dict:
    return yaml.safe_load((CONFIG / kind / f"{name}.yaml").read_text())


def written(text: str) -> tuple[dict, str]:
    """The campaign and its header (the comment lines)."""
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    campaign = yaml.safe_load(text)
    load_campaign(campaign, CONFIG, "reproduced")  # a valid campaign that plans
    return campaign, header


def test_dell_deepcam_on_four_mi210_keeps_the_per_accelerator_batch_and_scales_the_rate():
    text = reproduce_campaign(
        submission(DELL), config("archer2-mi210", "systems"), config("deepcam", "benchmarks"), scale="1x4", org="EPCC"
    )
    campaign, header = written(text)
    assert campaign["matrix"] == {"scales": ["1x4"], "precisions": ["fp16"]} and campaign["trials"] == 5
    training = campaign["benchmark_overrides"]["deepcam"]["training"]
    steps_per_epoch = 121266 / 256
    assert training["global_batch_size"] == 8  # 256 over 128 accelerators: 2 each, on 4 here
    assert training["optimizer"] == {"name": "adamw", "lr": 0.0025 * 8 / 256, "weight_decay": 0.01}
    assert training["schedule"]["name"] == "step"
    assert [m["epoch"] for m in training["schedule"]["milestones"]] == [
        round(4096 / steps_per_epoch, 6),
        round(8192 / steps_per_epoch, 6),
    ]
    assert [m["factor"] for m in training["schedule"]["milestones"]] == [0.2, 0.04]
    assert training["schedule"]["warmup_epochs"] == round(100 / steps_per_epoch, 6)
    assert training["epochs_max"] == 18 and training["channels_last"] is True
    assert campaign["mlperf"] == {"org": "EPCC", "division": "open", "status": "research"}
    carried, not_carried = header.split("# Not carried over (why):")
    assert "global batch 256 on 128 processes -> 8 on 4 (the submission's 2 per process)" in header
    for setting in ("opt_weight_decay 0.01", "precision_mode amp -> precision fp16", "enable_nhwc True"):
        assert setting in carried
    for setting in ("opt_name = 'LAMB'", "opt_eps = 1e-06", "data_format = 'dali-es'", "opt_max_grad_norm = 1.0"):
        assert setting in not_carried
    assert "train_samples / eval_samples = (121266, 15158)" in not_carried and "seed = [" in not_carried


def test_on_this_machine_the_cpu_sized_override_keeps_the_submissions_rate_and_schedule():
    cpu_sized = yaml.safe_load((CONFIG / "config.yaml").read_text())["benchmark_overrides"]["deepcam"]
    text = reproduce_campaign(
        submission(DELL), config("local-cpu", "systems"), config("deepcam", "benchmarks"), cpu_sized=cpu_sized
    )
    campaign, header = written(text)
    overrides = campaign["benchmark_overrides"]["deepcam"]
    assert overrides["model"] == cpu_sized["model"] and overrides["dataset"] == cpu_sized["dataset"]
    assert overrides["training"]["global_batch_size"] == 8 and overrides["training"]["optimizer"]["lr"] == 0.0025
    assert campaign["matrix"] == {"scales": ["1x1"], "precisions": ["fp32"]}
    assert "CPU-sized (config/config.yaml's deepcam override)" in header
    assert "precision_mode = 'amp': mixed precision of accelerators: fp32 on a CPU system" in header
    assert "set mlperf.org to this site's organisation" in header and "org" not in campaign["mlperf"]


@pytest.mark.parametrize(
    ("folder", "factors"), [(PERLMUTTER, [0.5, 0.25, 0.125, 0.0625]), (FUGAKU, [0.5, 0.25, 0.125, 0.0625])]
)
def test_cosmoflow_carries_sgd_its_epochs_and_decay_factors(folder, factors):
    """HPE logs every factor of the peak; Fugaku one factor applied at each boundary."""
    text = reproduce_campaign(submission(folder), config("eidf-a100", "systems"), config("cosmoflow", "benchmarks"))
    campaign, header = written(text)
    overrides = campaign["benchmark_overrides"]["cosmoflow"]
    schedule = overrides["training"]["schedule"]
    assert overrides["training"]["optimizer"]["name"] == "sgd"
    assert schedule["warmup_epochs"] == 6 and [m["factor"] for m in schedule["milestones"]] == factors
    assert overrides["model"] == {"options": {"dropout": 0.0}}
    assert "opt_learning_rate_warmup_factor" in header.split("Not carried over")[1]


def test_what_cannot_be_reproduced_is_named():
    oc20 = submission("HPE+LBNL/results/perlmutter_128x4/strong/oc20")
    with pytest.raises(ReproduceError, match="the project has no model of MLPerf HPC benchmark 'oc20'"):
        reproduce_campaign(oc20, config("local-cpu", "systems"), config("deepcam", "benchmarks"))
    with pytest.raises(ReproduceError, match="--scale '4': not <nodes>x<processes per node>"):
        reproduce_campaign(submission(DELL), config("local-cpu", "systems"), config("deepcam", "benchmarks"), scale="4")


def test_a_benchmark_whose_folder_does_not_read_a_schedule_back_is_named(monkeypatch):
    deepcam = registry.models()["deepcam"]
    without = dataclasses.replace(deepcam, mlperf=dataclasses.replace(deepcam.mlperf, reproduce=None))
    monkeypatch.setattr(reproduce, "mlperf_models", lambda usage, name: {"deepcam": without})
    with pytest.raises(ReproduceError, match="the project's deepcam does not convert a submission's schedule"):
        reproduce_campaign(submission(DELL), config("local-cpu", "systems"), config("deepcam", "benchmarks"))


def test_the_command_line_writes_a_file_and_refuses_what_it_cannot_do(tmp_path):
    out = tmp_path / "campaign.yaml"
    command = [*MLCAMPAIGN, "reproduce", str(SUBSET / DELL), "--system", "local-cpu", "--out", str(out)]
    command += ["--config-dir", str(CONFIG)]
    result = subprocess.run(command, capture_output=True, text=True, env=os.environ)
    assert result.returncode == 0, result.stderr
    written(out.read_text())
    before = out.read_text()
    again = subprocess.run(command, capture_output=True, text=True, env=os.environ)
    assert again.returncode == 2 and f"--out {out} exists" in again.stderr and out.read_text() == before
    not_a_folder = [
        *MLCAMPAIGN,
        "reproduce",
        str(SUBSET / "Dell"),
        "--system",
        "local-cpu",
        "--out",
        str(tmp_path / "x"),
    ]
    refused = subprocess.run(not_a_folder, capture_output=True, text=True, env=os.environ)
    assert refused.returncode == 2 and "not a result folder" in refused.stderr
    unknown = [*command[:6], "no-such-system", "--out", str(tmp_path / "y"), "--config-dir", str(CONFIG)]
    refused = subprocess.run(unknown, capture_output=True, text=True, env=os.environ)
    assert refused.returncode == 2 and "--system no-such-system: no file" in refused.stderr
    assert not Path(tmp_path / "y").exists()


# Every submission of the whole v3.0 round: (submitter, system, scaling, benchmark).
ROUND_FOLDERS = [
    ("Clemson", "18xR750-2xA100-PCIe-80GB", "strong", "deepcam"),
    ("Clemson", "18xR750-2xA100-PCIe-80GB", "strong", "openfold"),
    ("Dell", "32xXE8545x4A100-SXM4-40GB", "strong", "deepcam"),
    ("Fujitsu+RIKEN", "fugaku_512xA64FX_tensorflow_closed", "strong", "cosmoflow"),
    ("Fujitsu+RIKEN", "fugaku_512xA64FX_tensorflow_open", "strong", "cosmoflow"),
    ("Fujitsu+RIKEN", "fugaku_82944xA64FX_tensorflow_closed", "weak", "cosmoflow"),
    ("Fujitsu+RIKEN", "fugaku_82944xA64FX_tensorflow_open", "weak", "cosmoflow"),
    ("HPE+LBNL", "perlmutter_10x128x4_ngc21.09_mxnet", "weak", "cosmoflow"),
    ("HPE+LBNL", "perlmutter_10x128x4_ngc21.09_pytorch", "weak", "deepcam"),
    ("HPE+LBNL", "perlmutter_128x4", "strong", "cosmoflow"),
    ("HPE+LBNL", "perlmutter_128x4", "strong", "oc20"),
    ("HPE+LBNL", "perlmutter_224x4", "strong", "openfold"),
    ("HPE+LBNL", "perlmutter_512x4", "strong", "deepcam"),
    ("NVIDIA", "eos_n256_ngc23.09_pytorch", "strong", "deepcam"),
    ("NVIDIA", "eos_n256_ngc23.09_pytorch", "weak", "cosmoflow"),
    ("NVIDIA", "eos_n256_ngc23.09_pytorch", "weak", "deepcam"),
    ("NVIDIA", "eos_n256_ngc23.09_pytorch", "weak", "oc20"),
    ("NVIDIA", "eos_n256_ngc23.09_pytorch", "weak", "openfold"),
    ("NVIDIA", "eos_n260_ngc23.09_pytorch", "strong", "openfold"),
    ("NVIDIA", "eos_n64_ngc23.09_pytorch", "strong", "cosmoflow"),
    ("NVIDIA", "eos_n80_ngc23.09_pytorch", "strong", "oc20"),
    ("TACC", "lonestar6-pytorch", "strong", "openfold"),
]


@needs_round
def test_the_listed_folders_are_the_whole_rounds(whole_round):
    found = [folder.relative_to(whole_round).parts for folder in whole_round.glob("*/results/*/*/*")]
    assert sorted(ROUND_FOLDERS) == sorted((submitter, *rest) for submitter, _, *rest in found)


@needs_round
@pytest.mark.parametrize(("submitter", "system", "scaling", "benchmark"), ROUND_FOLDERS)
@pytest.mark.parametrize("target", ["local-cpu", "archer2-mi210"])
def test_every_submission_of_the_round_gives_a_campaign_that_check_accepts(
    submitter, system, scaling, benchmark, target, whole_round, tmp_path, capsys
):
    """CosmoFlow and DeepCAM (strong and weak scaling) reproduced; OpenCatalyst and OpenFold, which the project
    has no model of, refused naming that, never a traceback."""
    folder = whole_round / submitter / "results" / system / scaling / benchmark
    out = tmp_path / "campaign.yaml"
    status = main(["reproduce", str(folder), "--system", target, "--out", str(out), "--config-dir", str(CONFIG)])
    _, err = capsys.readouterr()
    if benchmark in ("oc20", "openfold"):
        assert status == 2 and err == (
            f"mlcampaign reproduce: {folder}: the project has no benchmark {benchmark!r} "
            f"({CONFIG / 'benchmarks' / benchmark}.yaml)\n"
        )
        return
    assert (status, err) == (0, "")
    assert main(["check", str(out), "--config-dir", str(CONFIG)]) == 0
    campaign = yaml.safe_load(out.read_text())
    assert campaign["trials"] == {"deepcam": 5, "cosmoflow": 10}[benchmark]  # weak: the rules' runs, not 637
    assert "# Not carried over (why):" in out.read_text()


@needs_round
def test_a_cosmoflow_submission_without_seeds_derives_the_campaign_seed_and_says_so(whole_round, tmp_path, capsys):
    """HPE's MXNet CosmoFlow logs record no seed."""
    folder = whole_round / "HPE+LBNL/results/perlmutter_10x128x4_ngc21.09_mxnet/weak/cosmoflow"
    first_log = min(folder.glob("result_*.txt"))  # the first the command reads (names sorted)
    first = result_logs.log_record(result_logs.read_result_log(first_log.read_bytes(), "3.0.0"), "3.0.0")
    assert first["seed"] is None
    out = tmp_path / "campaign.yaml"
    assert (
        main(["reproduce", str(folder), "--system", "local-cpu", "--out", str(out), "--config-dir", str(CONFIG)]) == 0
    )
    campaign, header = written(out.read_text())
    assert campaign["seed"] == int(first["sha256"][:8], 16)
    assert (
        f"seed (campaign) = None: not logged as a number: the campaign seed {campaign['seed']} derives from the first "
        "log's sha256" in header
    )
    assert "weak scaling: its 10 logs are model instances trained at once, each at instance scale 512" in header
