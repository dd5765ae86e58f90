"""The Keras trial: ``TrialRun`` with a Keras model, tf.distribute (or Horovod) and the shared data path.

Data: the same readers, ``DistributedSampler`` (seeded with the trial seed) and DataLoader as
the torch trial, so global batch k holds the same samples in both frameworks; batches are
transposed to channels-last for Keras.

A training step is three compiled functions, timed separately:
1. forward and backward on this worker's batch (``strategy.run``) -> local gradients;
2. the gradient all-reduce: each gradient cast to the wire dtype (fp16/bf16 when compressed)
   and divided by the world size, summed over workers with the strategy's collectives
   (``MultiWorkerMirroredStrategy``: every worker a replica; workers found through
   ``mlcampaign.trial.distributed``) or Horovod, cast back -- the same arithmetic as torch's DDP
   compression hooks;
3. the optimizer update with the averaged gradients (coupled L2 weight decay for sgd/adam, as
   torch applies it; decoupled for adamw).
Keras' own all-reduce inside ``apply_gradients`` only runs in a replica context, so calling the
update outside ``strategy.run`` applies the already-reduced gradients once.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import time

import numpy as np
import torch

from mlcampaign.plan.hyperparameters import lr_factor
from mlcampaign.plan.registry import PRECISIONS, check_model_options
from mlcampaign.plan.seeding import seed_everything
from mlcampaign.trial.distributed import Rendezvous, free_port, init_horovod, node_address
from mlcampaign.trial.keras import models as keras_models
from mlcampaign.trial.keras.flops import count_keras_flops
from mlcampaign.trial.protocol import CollectiveGroup, TrainingDiverged, TrialRun, weights_digest
from mlcampaign.trial.torch import models


def channels_last(batch: torch.Tensor) -> np.ndarray:
    """A channels-first batch (N, C, ...) as the channels-last array Keras takes (N, ..., C)."""
    return np.ascontiguousarray(np.moveaxis(batch.numpy(), 1, -1))


class KerasTrial(TrialRun):
    framework = "tensorflow"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rendezvous: Rendezvous | None = None
        self.hvd = None

    def _now(self) -> float:
        if self.system["device"] != "cpu":
            import tensorflow as tf

            tf.test.experimental.sync_devices()
        return time.perf_counter()

    # -- setup -----------------------------------------------------------------------------------
    def _connect(self, tf) -> None:
        layout, backend = self.layout, self.trial["backend"]
        if backend == "horovod":
            self.hvd = init_horovod("tensorflow", layout)
            self.strategy = tf.distribute.get_strategy()
            self.communication = "horovod"
        elif layout.world_size > 1:
            self.rendezvous = Rendezvous(layout)
            workers = self.rendezvous.all_gather("tf_workers", f"{node_address(layout)}:{free_port()}")
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                tf.train.ClusterSpec({"worker": workers}), task_type="worker", task_id=layout.rank, rpc_layer="grpc"
            )
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
            self.communication = "tf.distribute MultiWorkerMirroredStrategy collectives"
        else:
            self.strategy = tf.distribute.get_strategy()

    def _optimizer(self, keras):
        config = self.training["optimizer"]
        if config["name"] == "sgd":
            optimizer = keras.optimizers.SGD(
                self.learning_rate, momentum=config["momentum"], nesterov=config["nesterov"]
            )
        elif config["name"] == "adam":
            optimizer = keras.optimizers.Adam(self.learning_rate, epsilon=1e-8)  # torch's epsilon
        else:
            optimizer = keras.optimizers.AdamW(self.learning_rate, weight_decay=config["weight_decay"], epsilon=1e-8)
        # torch's sgd and adam add weight_decay x weight to the gradient (coupled L2); adamw decays decoupled.
        self.coupled_weight_decay = config["weight_decay"] if config["name"] != "adamw" else 0.0
        if self.trial["precision"] == "fp16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        return optimizer

    def _setup(self) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ info lines out of the log
        # Triton, which torchvision (the image readers) loads through torch's compiler where it is installed,
        # crashes the process (segmentation fault) when it is loaded after TensorFlow: load it first.
        if importlib.util.find_spec("triton") is not None:
            importlib.import_module("triton")
        import keras
        import tensorflow as tf

        # Before TensorFlow runs its first op in this process (it refuses later changes).
        tf.config.threading.set_intra_op_parallelism_threads(self.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)

        torch.set_num_threads(self.threads)  # the shared readers' transforms
        self.tf, self.keras = tf, keras
        seed_everything(self.trial["seed"], self.spec["deterministic"])  # Python, NumPy, torch (data order)
        keras.utils.set_random_seed(self.trial["seed"])
        if self.spec["deterministic"]:
            tf.config.experimental.enable_op_determinism()
        self._connect(tf)

        self._stage()
        model_config = self.benchmark["model"]
        check_model_options(model_config["name"], model_config["options"], "tensorflow")
        self.keras_spec = keras_models.get(model_config["name"])
        self.model_spec = models.get(model_config["name"])
        shape = self.model_spec.sample_shape(**model_config["options"])
        self._open_data(shape)

        policy = PRECISIONS[self.trial["precision"]].keras_policy
        keras.mixed_precision.set_dtype_policy(policy)
        with self.strategy.scope():
            self.model = self.keras_spec.build(**model_config["options"])
            self.optimizer = self._optimizer(keras)
            self.optimizer.build(self.model.trainable_variables)
        if self.hvd is not None:
            # Horovod 0.28.1 takes tf.Variables, which Keras 3 variables hold but are not (given them it fails:
            # 'SymbolicTensor' object has no attribute 'assign').
            self.hvd.broadcast_variables([variable.value for variable in self.model.variables], root_rank=0)
        if self.layout.is_main:
            # Only after the trial's model: Keras names layers from a per-process counter and Horovod keys its
            # collectives by those names, so a model built first on rank 0 alone would leave every collective
            # waiting for a name the other ranks never send. Counted at float32 whatever the trial's precision.
            keras.mixed_precision.set_dtype_policy("float32")
            keras_shape = (*shape[1:], shape[0])
            self.flop_count = count_keras_flops(self.keras_spec.build, model_config["options"], keras_shape)
            keras.mixed_precision.set_dtype_policy(policy)
        self.loss = self.keras_spec.loss(self.training)
        self.lr_factor = lr_factor(
            self.training["schedule"], self.steps_per_epoch, self.steps_per_epoch * self.training["epochs_max"]
        )
        self.batch_norm_statistics = [
            variable
            for layer in self.model.layers
            if isinstance(layer, keras.layers.BatchNormalization)
            for variable in (layer.moving_mean, layer.moving_variance)
        ]
        self._compile_steps()

    def _compile_steps(self) -> None:
        tf, model, optimizer, strategy = self.tf, self.model, self.optimizer, self.strategy
        loss_fn, scaled = self.loss, self.trial["precision"] == "fp16"
        wire_dtype = {"none": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}[self.trial["compression"]]
        world, hvd = self.world_size, self.hvd
        compression = None if hvd is None else {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
        decay = self.coupled_weight_decay
        keep_mine = 1.0 if self.layout.is_main else 0.0

        @tf.function
        def gradients(inputs, targets):
            def replica(inputs, targets):
                with tf.GradientTape() as tape:
                    loss = loss_fn(targets, tf.cast(model(inputs, training=True), tf.float32))
                    objective = optimizer.scale_loss(loss) if scaled else loss
                return loss, tape.gradient(objective, model.trainable_variables)

            return strategy.run(replica, (inputs, targets))

        @tf.function
        def allreduce(grads):
            if hvd is not None:
                return hvd.grouped_allreduce(grads, op=hvd.Average, compression=compression[self.trial["compression"]])

            def replica(grads):
                wire = [tf.cast(grad, wire_dtype) / world for grad in grads]
                reduced = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, wire)
                return [tf.cast(grad, tf.float32) for grad in reduced]

            return strategy.run(replica, (grads,))

        @tf.function
        def update(grads):
            variables = model.trainable_variables
            if decay:
                # With loss scaling the gradients are still scaled here; the optimizer unscales them.
                factor = decay * optimizer.dynamic_scale if scaled else decay
                grads = [grad + factor * variable for grad, variable in zip(grads, variables, strict=True)]
            optimizer.apply_gradients(zip(grads, variables, strict=True))

        @tf.function
        def predict(inputs):
            return tf.cast(model(inputs, training=False), tf.float32)

        @tf.function
        def sum_over_workers(values):
            if hvd is not None:
                return hvd.allreduce(values, op=hvd.Sum)
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(values)), axis=None)

        @tf.function
        def statistics_of_rank0(statistics):
            # Sum of rank 0's values and zeros elsewhere: rank 0's BatchNorm statistics on every worker.
            if hvd is not None:
                return [hvd.broadcast(value, root_rank=0) for value in statistics]

            def replica(statistics):
                masked = [tf.cast(value, tf.float32) * keep_mine for value in statistics]
                return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, masked)

            return strategy.run(replica, (statistics,))

        self.gradients, self.allreduce, self.update = gradients, allreduce, update
        self.predict, self.sum_over_workers, self.statistics_of_rank0 = predict, sum_over_workers, statistics_of_rank0

    # -- training and evaluation -------------------------------------------------------------------
    def _targets(self, targets: torch.Tensor) -> np.ndarray:
        if self.keras_spec.one_hot:
            return np.eye(self.model.output_shape[-1], dtype=np.float32)[targets.numpy()]
        return targets.numpy()

    def _train_epoch(self, epoch: int) -> None:
        distributed = self.world_size > 1
        self.sampler.set_epoch(epoch)
        step_start = self._now()
        for inputs, targets in self.train_loader:
            x, y = channels_last(inputs), self._targets(targets)
            loaded = self._now()
            self.optimizer.learning_rate = self.learning_rate * self.lr_factor(self.counters.steps)
            loss, grads = self.gradients(x, y)
            if not np.isfinite(float(loss)):
                raise TrainingDiverged(f"loss is {float(loss)} at epoch {epoch}, step {self.counters.steps}")
            reduce_s = 0.0
            if distributed:
                reduce_start = self._now()
                grads = self.allreduce(grads)
                reduce_s = self._now() - reduce_start
            self.update(grads)
            step_end = self._now()
            self._step_done(loaded - step_start, step_end - loaded, reduce_s, reduce_s)
            step_start = self._now()

    def _evaluate(self) -> dict[str, float]:
        if self.world_size > 1 and self.batch_norm_statistics:
            for variable, value in zip(
                self.batch_norm_statistics, self.statistics_of_rank0(self.batch_norm_statistics), strict=True
            ):
                variable.assign(value)
        sums: dict[str, torch.Tensor] = {}
        for inputs, targets in self.val_loader:
            outputs = torch.from_numpy(self.predict(channels_last(inputs)).numpy())
            for key, value in self.model_spec.eval_sums(outputs, targets).items():
                sums[key] = sums.get(key, 0) + value
        keys = sorted(sums)
        totals = np.array([float(sums[key]) for key in keys], dtype=np.float64)
        if self.world_size > 1:
            totals = self.sum_over_workers(totals).numpy()
        return self.model_spec.eval_finalize(dict(zip(keys, totals.tolist(), strict=True)))

    def _weights_digest(self) -> str:
        return weights_digest(variable.numpy() for variable in self.model.trainable_variables)

    def _gather(self, value: dict) -> list[dict]:
        if self.hvd is not None:
            return self.hvd.allgather_object(value)
        if self.rendezvous is None:
            return [value]
        return [json.loads(text) for text in self.rendezvous.all_gather("ranks", json.dumps(value))]

    def _canary_group(self) -> CollectiveGroup:
        tf = self.tf
        return CollectiveGroup(
            self.world_size,
            "horovod.tensorflow" if self.hvd is not None else self.communication,
            lambda n, value: tf.fill([n], value),
            self.sum_over_workers,
            self._now,
        )

    def close(self, failure: str | None = None) -> None:
        super().close(failure)
        if hasattr(self, "keras"):
            self.keras.mixed_precision.set_dtype_policy("float32")  # the policy is process-global
        if self.hvd is not None:
            self.hvd.shutdown()
