"""Keras models of the benchmarks: the protocol each benchmark folder's Keras model follows
(``SPEC = KerasSpec(...)`` in its ``keras_model.py``, named in its registry entry), built from the same
``model.options`` as its torch model. Inputs are channels-last (NHWC / NDHWC): the trial transposes the
readers' channels-first samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mlcampaign.plan.registry import models


@dataclasses.dataclass(frozen=True)
class KerasSpec:
    build: Callable  # (**model options) -> keras.Model
    loss: Callable[[dict], Callable]  # training config -> loss(y_true, y_pred)
    one_hot: bool  # targets are class indices that the loss wants one-hot


def get(name: str) -> KerasSpec:
    """The Keras model of registered model ``name`` (ValueError where it has none)."""
    model = models()[name]
    if model.keras is None:
        raise ValueError(f"model '{name}' has no Keras implementation")
    return model.keras_spec()
