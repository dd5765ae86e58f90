"""Numbers from outside (mlcampaign.plan.numbers): JSON read strictly (no NaN, no Infinity, no 1e999), one
number checked finite and within its unit's bounds."""

import math

import pytest

from mlcampaign.plan.numbers import NumberError, check_number, loads_json


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"a": NaN}', "key 'a': value nan"),
        ('{"a": {"b": [1, Infinity]}}', "key 'a.b.1': value inf"),
        ('{"a": -Infinity}', "key 'a': value -inf"),
        ('{"a": 1e999}', "key 'a': value inf"),
        ("NaN", "key '<top level>': value nan"),
    ],
)
def test_json_with_numbers_that_are_not_finite_is_refused_naming_the_key(text, where):
    with pytest.raises(ValueError, match="is not a finite number") as refused:
        loads_json(text)
    assert where in str(refused.value)


def test_json_with_finite_numbers_reads_as_python_reads_it():
    assert loads_json('{"a": 1.5, "b": [1, -2e300], "c": null}') == {"a": 1.5, "b": [1, -2e300], "c": None}


@pytest.mark.parametrize(
    ("value", "unit", "problem"),
    [
        (math.nan, "s", "is not a finite number"),
        (math.inf, None, "is not a finite number"),
        (-1.0, "s", "is outside 0 to 1e+08 s"),
        (1e31, "FLOP", "is outside 0 to 1e+30 FLOP"),
    ],
)
def test_a_number_outside_its_unit_is_refused_naming_where(value, unit, problem):
    with pytest.raises(NumberError) as refused:
        check_number(value, unit, "--time")
    assert str(refused.value).startswith("--time: value ") and problem in str(refused.value)


def test_a_number_within_its_unit_passes():
    assert check_number(3600.0, "s", "--time") == 3600.0
    assert check_number(-0.5, None, "--achieved") == -0.5
