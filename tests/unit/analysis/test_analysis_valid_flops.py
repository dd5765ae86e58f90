"""HPC AI500 Valid FLOPS on hand-computed cases, for both metric directions, its command line, and the
FLOP-counting conventions (valid_flops.counting) as the tables apply and name them."""

import re
import shlex

import numpy as np
import pandas as pd
import pytest
import synthetic_records as synthetic
import yaml

from mlcampaign.analysis.frame import campaign_frame, planned_frame, trial_frame
from mlcampaign.analysis.valid_flops import (
    counted_flops,
    counting_label,
    counting_of,
    valid_flops,
    valid_flops_penalty,
)
from mlcampaign.cli import main
from mlcampaign.measure.flops import count_flops
from mlcampaign.plan.config import load_campaign
from mlcampaign.plan.config_files import ConfigError, load_yaml, validate
from mlcampaign.plan.metrics import work_flops
from mlcampaign.trial.torch import models

from conftest import REPO


def test_higher_is_better_below_target():
    # 1e15 FLOPs in 100 s = 1e13 FLOP/s; (0.7 / 0.763)^10 = 0.42241...
    result = valid_flops(1e15, 100.0, achieved=0.7, target=0.763, direction="higher", exponent=10)
    assert result.flops_per_s == pytest.approx(1e13)
    assert result.penalty == pytest.approx(0.4224108069)
    assert result.valid_flops_per_s == pytest.approx(4.224108069e12)


def test_lower_is_better_above_target():
    # MAE 0.15 against a target of 0.124: (0.124 / 0.15)^5 = 0.38606...
    result = valid_flops(2e14, 50.0, achieved=0.15, target=0.124, direction="lower", exponent=5)
    assert result.flops_per_s == pytest.approx(4e12)
    assert result.penalty == pytest.approx(0.3860576214)
    assert result.valid_flops_per_s == pytest.approx(1.5442304855e12)


@pytest.mark.parametrize(("achieved", "direction"), [(0.80, "higher"), (0.763, "higher"), (0.1, "lower")])
def test_meeting_the_target_earns_no_bonus_with_the_default_cap(achieved, direction):
    target = 0.763 if direction == "higher" else 0.124
    assert valid_flops_penalty(achieved, target, direction, exponent=10) == 1.0


def test_cap_is_configurable():
    # (0.8 / 0.76)^10 = 1.670 is capped at 1.2; with n = 1 the bonus 1.053 stays below the cap.
    assert valid_flops_penalty(0.8, 0.76, "higher", exponent=10, cap=1.2) == pytest.approx(1.2)
    assert valid_flops_penalty(0.8, 0.76, "higher", exponent=1, cap=1.2) == pytest.approx(0.8 / 0.76)


def test_penalty_is_elementwise_and_empty_without_a_measurement():
    penalty = valid_flops_penalty(
        np.array([0.7, 0.15, np.nan]),
        np.array([0.763, 0.124, 0.5]),
        np.array(["higher", "lower", None], dtype=object),
        np.array([10.0, 5.0, 10.0]),
        np.array([1.0, 1.0, 1.0]),
    )
    np.testing.assert_allclose(penalty, [0.4224108069, 0.3860576214, np.nan])


def test_unknown_direction_is_rejected():
    with pytest.raises(ValueError, match="'sideways'"):
        valid_flops_penalty(0.5, 0.7, "sideways", exponent=1)


def test_command_line_recomputes_an_entry_from_flops_per_sample(capsys):
    main(
        shlex.split(
            "valid-flops --flops-per-sample 23.0e9 --samples 1e6 --time 100 --achieved 0.7 --target 0.763 "
            "--direction higher --exponent 10"
        )
    )
    output = capsys.readouterr().out
    assert "FLOPS:       2.3e+14 FLOP/s" in output  # 23e9 x 1e6 / 100
    assert "penalty:     0.422411" in output
    assert "Valid FLOPS: 9.71545e+13 FLOP/s" in output


def test_command_line_needs_samples_with_flops_per_sample(capsys):
    status = main(
        shlex.split(
            "valid-flops --flops-per-sample 1e9 --time 1 --achieved 1 --target 1 --direction higher --exponent 1"
        )
    )
    assert status == 2
    assert "--flops-per-sample and --samples go together" in capsys.readouterr().err


# -- what is counted: valid_flops.counting ------------------------------------------------------
DEFAULT = {"work": "training_and_evaluation", "samples": "measured"}
STUDY = {"work": "training", "samples": "nominal", "nominal_epochs": 90, "train_flops_per_sample": 23.0e9}


def test_work_flops_is_the_records_formula():
    assert work_flops(3.0, 1.0, 10, 4) == 34.0
    # No evaluated samples: nothing added, even where the forward count is unknown.
    assert work_flops(3.0, np.nan, 10, 0) == 30.0


@pytest.mark.parametrize(
    ("counting", "expected"),
    [
        (DEFAULT, 3210.0),  # what the run did: the record's flops.total
        ({"work": "training", "samples": "measured"}, 3.0 * 1000),
        ({"work": "training", "samples": "nominal", "nominal_epochs": 90}, 3.0 * 90 * 100),
        ({"work": "training_and_evaluation", "samples": "measured", "train_flops_per_sample": 2.0}, 2.0 * 1000 + 200),
        ({"work": "training_and_evaluation", "samples": "nominal", "nominal_epochs": 2}, 3.0 * 2 * 100 + 1.0 * 200),
        (STUDY, 23.0e9 * 90 * 100),  # the study's FLOPs per sample replace the record's
    ],
)
def test_counted_flops_follows_the_convention(counting, expected):
    # 1000 samples trained (10 epochs of a 100-sample training set), 200 evaluated; the record's total
    # (3210, not 3.0 x 1000 + 1.0 x 200) tells the record's number from a recomputed one.
    assert counted_flops(counting, 3210.0, 3.0, 1.0, 1000, 200, 100) == pytest.approx(expected)


def test_counting_labels_say_what_is_counted():
    assert counting_label(DEFAULT) == "training + evaluation; measured samples; counted FLOPs per sample"
    assert counting_label(STUDY) == "training only; 90 nominal epochs x training set; 23 GFLOP per training sample"


def test_a_config_without_counting_counts_as_before():
    assert counting_of({"exponent": 10, "cap": 1.0}) == DEFAULT
    assert counting_of({"exponent": 10, "counting": STUDY}) == STUDY


@pytest.mark.parametrize(
    ("counting", "problem"),
    [
        ({"samples": "nominal"}, "samples: nominal needs nominal_epochs"),
        ({"nominal_epochs": 90}, "nominal_epochs goes with samples: nominal only"),
        ({"work": "evaluation"}, "key 'valid_flops.counting.work': value 'evaluation'"),
        ({"train_flops_per_sample": 23.0e9}, "key 'valid_flops.counting.source': missing (required)"),
        ({"samples": "nominal", "nominal_epochs": 0}, "key 'valid_flops.counting.nominal_epochs': value 0"),
    ],
)
def test_a_bad_convention_is_an_error_naming_file_and_key(counting, problem):
    benchmark = load_yaml(REPO / "config" / "benchmarks" / "resnet50.yaml")
    benchmark["valid_flops"]["counting"] = counting
    with pytest.raises(ConfigError, match=re.escape(problem)) as error:
        validate(benchmark, "benchmark", "resnet50.yaml")
    assert "resnet50.yaml: key 'valid_flops.counting" in str(error.value)


def _frame(benchmark_config: dict) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    rows = [synthetic.plan_row("sys", "b", "1x2", "fp32", trial) for trial in range(3)]
    records = [synthetic.record(row, rng) for row in rows]
    records[2] = synthetic.record(rows[2], rng, failure_reason="out_of_memory")
    return campaign_frame(planned_frame(pd.DataFrame(rows)), trial_frame(records), {"b": benchmark_config})


def test_the_frame_counts_by_the_default_convention_what_the_record_counted():
    frame = _frame(synthetic.benchmark_config())
    ok = frame.loc[frame["status"] == "ok"]
    np.testing.assert_allclose(ok["flops_counted"], ok["flops_total"], rtol=1e-12)
    np.testing.assert_allclose(ok["flops_per_s"], ok["flops_total"] / ok["run_time_s"], rtol=1e-12)
    assert set(frame["flops_counting"]) == {counting_label(DEFAULT)}
    assert frame.loc[frame["status"] == "failed", "flops_per_s"].isna().all()


def test_the_frame_counts_a_campaigns_convention_and_names_it():
    config = synthetic.benchmark_config()
    config["valid_flops"]["counting"] = STUDY
    frame = _frame(config)
    ok = frame.loc[frame["status"] == "ok"]
    # Nominal: 90 epochs of the record's 1400-sample training set at 23.0 GFLOP, whatever the run trained.
    np.testing.assert_allclose(ok["flops_counted"], 23.0e9 * 90 * 1400)
    np.testing.assert_allclose(ok["valid_flops_per_s"], ok["flops_counted"] / ok["run_time_s"] * ok["penalty"])
    assert set(frame["flops_counting"]) == {counting_label(STUDY)}


def test_project_counts_seven_percent_more_than_hpcai500_for_the_same_resnet50_run():
    """The difference the hpcai500 campaign's convention removes: the project's default count of a 90-epoch
    ImageNet-1k run (training + evaluation every epoch, at its exact count for torchvision's ResNet-50) over
    the study's count of the same run (training only, 90 nominal epochs, 23.0 GFLOP per image)."""
    config = yaml.safe_load((REPO / "config" / "campaigns" / "hpcai500.yaml").read_text())
    benchmark = load_campaign(config, REPO / "config").benchmarks["resnet50"]
    study = benchmark["valid_flops"]["counting"]
    subset = benchmark["dataset"]["source"]["subset"]
    epochs = benchmark["training"]["epochs_max"]
    assert (epochs, benchmark["training"]["eval_every"]) == (study["nominal_epochs"], 1)
    count = count_flops(models.get("resnet50").build, {"num_classes": 1000}, (3, 224, 224))
    run = (count.train_per_sample, count.forward_per_sample, epochs * subset["train"], epochs * subset["val"])
    project = counted_flops(DEFAULT, work_flops(*run), *run, subset["train"])
    hpcai500 = counted_flops(study, None, *run, subset["train"])
    assert hpcai500 == pytest.approx(23.0e9 * 90 * 1_281_167)
    # 24.30 G x 1 281 167 + 8.18 G x 50 000 per epoch against 23.0 G x 1 281 167.
    assert project / hpcai500 == pytest.approx(1.070, abs=0.001)
