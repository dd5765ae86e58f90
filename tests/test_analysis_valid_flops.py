"""HPC AI500 Valid FLOPS on hand-computed cases, for both metric directions, and its command line."""

import shlex

import numpy as np
import pytest

from mlcampaign.analysis.valid_flops import main, valid_flops, valid_flops_penalty


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
            "--flops-per-sample 23.0e9 --samples 1e6 --time 100 --achieved 0.7 --target 0.763 "
            "--direction higher --exponent 10"
        )
    )
    output = capsys.readouterr().out
    assert "FLOPS:       2.3e+14 FLOP/s" in output  # 23e9 x 1e6 / 100
    assert "penalty:     0.422411" in output
    assert "Valid FLOPS: 9.71545e+13 FLOP/s" in output


def test_command_line_needs_samples_with_flops_per_sample(capsys):
    with pytest.raises(SystemExit):
        main(shlex.split("--flops-per-sample 1e9 --time 1 --achieved 1 --target 1 --direction higher --exponent 1"))
    assert "--flops-per-sample needs --samples" in capsys.readouterr().err
