"""ResNet-50 in Keras: ``keras.applications.ResNet50`` (ResNet v1 layout, bottleneck width 64), logits out,
built from the same ``model.options`` as the torch model. It has no ``width_per_group`` option, so only
the standard width 64 is accepted (the declaration's ``check_keras_options``); ``zero_init_residual``
zeroes the last BatchNorm scale of every residual branch, as torchvision does. Inputs are channels-last.
"""

from __future__ import annotations

from mlcampaign.trial.keras.models import KerasSpec


def build(num_classes: int = 1000, image_size: int = 224, width_per_group: int = 64, zero_init_residual=False):
    import keras

    model = keras.applications.ResNet50(
        weights=None, input_shape=(image_size, image_size, 3), classes=num_classes, classifier_activation=None
    )
    if zero_init_residual:
        for layer in model.layers:
            if layer.name.endswith("_3_bn"):  # last BatchNorm of each bottleneck branch
                layer.gamma.assign(keras.ops.zeros_like(layer.gamma))
    return model


def loss(training: dict):
    import keras

    return keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=training["label_smoothing"])


SPEC = KerasSpec(build, loss, one_hot=True)
