"""Keras models of the benchmarks, built from the same ``model.options`` as their torch modules.

- ``resnet50``: ``keras.applications.ResNet50`` (ResNet v1 layout, bottleneck width 64), logits
  out. It has no ``width_per_group`` option, so only the standard width 64 is accepted;
  ``zero_init_residual`` zeroes the last BatchNorm scale of every residual branch, as torchvision does.
- ``cosmoflow``: the MLPerf HPC reference network (mlcommons/hpc cosmoflow/models/cosmoflow.py)
  with the options and defaults of ``mlcampaign.models.cosmoflow``.

Inputs are channels-last (NHWC / NDHWC): the trial transposes the readers' channels-first samples.
``check_keras_model`` validates options without importing TensorFlow (used when the campaign is
planned).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mlcampaign.registry import check_model_options

RESNET_MIN_IMAGE_SIZE = 32  # keras.applications.ResNet50 refuses smaller inputs


def check_keras_model(name: str, options: dict) -> None:
    """Raise ValueError if there is no Keras model ``name`` or it cannot honour ``options``."""
    check_model_options(name, options, "tensorflow")
    if name == "resnet50":
        if options.get("width_per_group", 64) != 64:
            raise ValueError(
                f"keras.applications.ResNet50 has bottleneck width 64, not model option "
                f"width_per_group={options['width_per_group']} (override it to 64 for TensorFlow cells)"
            )
        if options.get("image_size", 224) < RESNET_MIN_IMAGE_SIZE:
            raise ValueError(f"keras.applications.ResNet50 needs image_size >= {RESNET_MIN_IMAGE_SIZE}")


def _resnet50(num_classes: int = 1000, image_size: int = 224, width_per_group: int = 64, zero_init_residual=False):
    import keras

    model = keras.applications.ResNet50(
        weights=None, input_shape=(image_size, image_size, 3), classes=num_classes, classifier_activation=None
    )
    if zero_init_residual:
        for layer in model.layers:
            if layer.name.endswith("_3_bn"):  # last BatchNorm of each bottleneck branch
                layer.gamma.assign(keras.ops.zeros_like(layer.gamma))
    return model


def _cosmoflow(
    input_size: int = 128,
    base_filters: int = 32,
    n_conv_layers: int = 5,
    kernel_size: int = 3,
    fc1_size: int = 128,
    fc2_size: int = 64,
    dropout: float = 0.5,
    target_size: int = 4,
):
    import keras

    from mlcampaign.models.cosmoflow import IN_CHANNELS, LEAKY_SLOPE, OUTPUT_SCALE, check_input_size

    check_input_size(input_size, n_conv_layers)
    layers = [keras.Input((input_size, input_size, input_size, IN_CHANNELS))]
    for index in range(n_conv_layers):
        layers += [
            keras.layers.Conv3D(base_filters * 2**index, kernel_size, padding="same"),
            keras.layers.LeakyReLU(LEAKY_SLOPE),
            keras.layers.MaxPool3D(2),
        ]
    layers.append(keras.layers.Flatten())
    for size in (fc1_size, fc2_size):
        layers += [keras.layers.Dense(size), keras.layers.LeakyReLU(LEAKY_SLOPE), keras.layers.Dropout(dropout)]
    layers += [keras.layers.Dense(target_size, activation="tanh"), keras.layers.Rescaling(OUTPUT_SCALE)]
    return keras.Sequential(layers, name="cosmoflow")


def _classification_loss(training: dict):
    import keras

    return keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=training["label_smoothing"])


def _regression_loss(training: dict):
    import keras

    return keras.losses.MeanSquaredError()


@dataclasses.dataclass(frozen=True)
class KerasSpec:
    build: Callable  # (**model options) -> keras.Model
    loss: Callable[[dict], Callable]  # training config -> loss(y_true, y_pred)
    one_hot: bool  # targets are class indices that the loss wants one-hot


KERAS_MODELS = {
    "resnet50": KerasSpec(_resnet50, _classification_loss, one_hot=True),
    "cosmoflow": KerasSpec(_cosmoflow, _regression_loss, one_hot=False),
}
