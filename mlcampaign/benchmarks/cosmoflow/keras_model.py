"""CosmoFlow in Keras: the MLPerf HPC reference network (mlcommons/hpc cosmoflow/models/cosmoflow.py), with
the options and defaults of the torch model (mlcampaign.benchmarks.cosmoflow.model). Inputs are channels-last.
"""

from __future__ import annotations

from mlcampaign.trial.keras.models import KerasSpec


def build(
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

    from mlcampaign.benchmarks.cosmoflow.model import IN_CHANNELS, LEAKY_SLOPE, OUTPUT_SCALE, check_input_size

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


def loss(training: dict):
    import keras

    return keras.losses.MeanSquaredError()


SPEC = KerasSpec(build, loss, one_hot=False)
