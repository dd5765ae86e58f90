"""Numbers from outside, one validation for every file and option that carries them: finite, and within the
bounds of their unit (mlcampaign.plan.metrics.UNIT_BOUNDS) where they have one.

- ``loads_json``: JSON the project did not just write (run folders, bundles, the store's rows, a
  ``--system-json`` file). Python's json reads NaN, Infinity and -Infinity, which JSON has not, and reads
  1e999 as infinity; ``loads_json`` refuses them (a ValueError, as for any text that is not JSON).
- ``non_finite_numbers``: every number of a document that is not finite (a document built in memory, a YAML
  file's ``.nan`` and ``.inf``). Such numbers pass every bound (each comparison with NaN is false), and other
  readers refuse a whole document that holds one (SQLite's and PostgreSQL's JSON functions among them).
- ``number_problem``, ``check_number``: one number, such as a command-line option's: finite, and within its
  unit's bounds. Records are held to the same bounds by their schema (``x-unit``, mlcampaign.plan.config_files).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from mlcampaign.plan.metrics import UNIT_BOUNDS


class NumberError(ValueError):
    """A number that is not finite, or outside its unit's bounds; the message names where, and the value."""


class _NotFinite(ValueError):
    pass


def _refuse_constant(name: str) -> float:
    raise _NotFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def loads_json(text: str | bytes) -> Any:
    """JSON text as data, every number in it finite; ValueError for anything else (json.loads' errors too), for
    a number that is not finite naming its key."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _NotFinite:
        path, value = next(non_finite_numbers(json.loads(text)))  # Python's own reading, to say where it is
        raise ValueError(
            f"key '{'.'.join(map(str, path)) or '<top level>'}': value {value!r} is not a finite number "
            "(JSON has no NaN or Infinity)"
        ) from None


def non_finite_numbers(instance: Any, path: tuple = ()) -> Iterator[tuple[tuple, float]]:
    """(path, value) of every number in a document that is not finite: NaN and the infinities."""
    if isinstance(instance, float):
        if not math.isfinite(instance):
            yield path, instance
    elif isinstance(instance, Mapping):
        for key, value in instance.items():
            yield from non_finite_numbers(value, (*path, key))
    elif isinstance(instance, list):
        for index, value in enumerate(instance):
            yield from non_finite_numbers(value, (*path, index))


def number_problem(value: float, unit: str | None) -> str | None:
    """What makes ``value`` no number of ``unit`` (UNIT_BOUNDS; None or a unit without bounds: finite only), or
    None for one that is."""
    if not math.isfinite(value):
        return "is not a finite number"
    low, high = UNIT_BOUNDS.get(unit, (-math.inf, math.inf))
    if not low <= value <= high:
        return f"is outside {low:g} to {high:g} {unit}, the bounds of any measurement"
    return None


def check_number(value: float, unit: str | None, where: str) -> float:
    """``value`` if it is finite and within the bounds of ``unit`` (number_problem); NumberError naming ``where``
    (e.g. "--time") and the value otherwise."""
    problem = number_problem(value, unit)
    if problem is not None:
        raise NumberError(f"{where}: value {value:g} {problem}")
    return value
