"""Counted FLOPs of a Keras model's training step and forward pass, per sample.

The forward pass and the gradient of the trainable weights are traced as graphs, pruned to what
their outputs need, and counted with TensorFlow's profiler (``float_operation``), keeping only
convolutions and matrix products, as ``mlcampaign.measure.flops`` does for torch (a multiply-add is 2
FLOPs; element-wise work is not counted). TensorFlow registers no FLOP statistics for the 3D
convolution gradients (``Conv3DBackpropInputV2``, ``Conv3DBackpropFilterV2``); each is counted
here as its forward convolution: 2 x output positions x filter taps.
"""

from __future__ import annotations

import math

from mlcampaign.measure.flops import FlopCount

# Op types whose registered statistics are counted (their gradients included).
COUNTED_OPS = {
    "Conv2D",
    "Conv2DBackpropInput",
    "Conv2DBackpropFilter",
    "Conv3D",
    "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter",
    "MatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
}
UNREGISTERED_CONV3D_GRADIENTS = {"Conv3DBackpropInputV2", "Conv3DBackpropFilterV2"}


def _conv3d_gradient_flops(op) -> int:
    """2 x MACs of the forward convolution whose gradient ``op`` computes."""
    # The filter, (depth, height, width, in, out): an input of the input gradient, the output of the filter gradient.
    kernel = op.inputs[1].shape if op.type == "Conv3DBackpropInputV2" else op.outputs[0].shape
    out_backprop = op.inputs[2].shape
    return 2 * math.prod(out_backprop) * math.prod(kernel[:4])


def _graph_flops(function, input_spec) -> int:
    import tensorflow as tf

    concrete = tf.function(function).get_concrete_function(input_spec)
    graph_def = tf.compat.v1.graph_util.extract_sub_graph(
        concrete.graph.as_graph_def(add_shapes=True), [tensor.op.name for tensor in concrete.outputs]
    )
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profile = tf.compat.v1.profiler.profile(graph=graph, options=options)
    counted = sum(
        node.total_float_ops for node in profile.children if graph.get_operation_by_name(node.name).type in COUNTED_OPS
    )
    return counted + sum(
        _conv3d_gradient_flops(op) for op in graph.get_operations() if op.type in UNREGISTERED_CONV3D_GRADIENTS
    )


def count_keras_flops(build, model_options: dict, sample_shape: tuple[int, ...], batch: int = 2) -> FlopCount:
    """FLOPs per sample of forward + weight and input gradients (training) and of the forward pass alone.

    ``sample_shape`` is channels-last, as the Keras model takes it.
    """
    import tensorflow as tf

    model = build(**model_options)
    spec = tf.TensorSpec((batch, *sample_shape), tf.float32)

    def forward(inputs):
        return model(inputs, training=False)

    def training_step(inputs):
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(tf.cast(model(inputs, training=True), tf.float32))
        return tape.gradient(total, model.trainable_variables)

    return FlopCount(
        train_per_sample=_graph_flops(training_step, spec) / batch,
        forward_per_sample=_graph_flops(forward, spec) / batch,
    )
