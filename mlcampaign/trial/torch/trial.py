"""The torch trial: ``TrialRun`` with DistributedDataParallel (or Horovod), autocast precision and
compressed gradient all-reduce hooks (mlcampaign.trial.torch.collectives), on CPUs and GPUs, and optionally a
compiled training step (torch.compile, the benchmark's ``training.compile``).

Compilation is model initialization. MLPerf's training rules (mlcommons/training_policies,
training_rules.adoc, "Run Results"; the HPC rules follow them) allow up to 20 minutes of model
initialization before the clock starts, and say the clock must start before any part of the system
touches the dataset. So a compiled trial compiles in ``_setup`` (between MLPerf init_start and
init_stop, before run_start) by running its network forward and backward on synthetic inputs of the
training batch's shape, never on the dataset, and times that apart (``compile_s``). The warm-up leaves
no trace in the training: weights, BatchNorm statistics, random number generators and gradients are as
before it, and the all-reduce timer forgets it. Evaluation runs the eager model: the compiled graphs
are specialised to training mode (batch statistics, dropout), an evaluation graph would be a second
compilation per validation batch size (the last batch is smaller), and evaluation is a small share of
a trial's time. The compile cache is the system's ``compile_cache_dir`` (TORCHINDUCTOR_CACHE_DIR; else
torch's default under the temporary directory), so the trials after the first on a node reuse the
compiled kernels.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import torch

from mlcampaign.measure.flops import cached_flop_count
from mlcampaign.plan.campaign import compile_setting
from mlcampaign.plan.hyperparameters import lr_factor
from mlcampaign.plan.registry import PRECISIONS
from mlcampaign.plan.seeding import seed_everything
from mlcampaign.trial.distributed import init_horovod, init_torch_process_group, torch_device
from mlcampaign.trial.protocol import CollectiveGroup, TrainingDiverged, TrialRun, weights_digest
from mlcampaign.trial.torch import models
from mlcampaign.trial.torch.collectives import AllreduceTimer, HorovodCollectives, SingleProcess, TorchDistributed
from mlcampaign.trial.torch.onednn_bf16 import float64_where_bf16_weight_gradients_fail
from mlcampaign.trial.torch.optim import build_optimizer

# Modes that capture CUDA graphs on GPUs (cudagraph trees), whose recording must not fall in the timed training.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def autocast(device: torch.device, precision: str):
    """The autocast context of a trial's forward passes at ``precision`` (none for one that needs none)."""
    if not PRECISIONS[precision].autocast:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, PRECISIONS[precision].torch_dtype))


def _memory_format(sample_shape: tuple[int, ...]) -> torch.memory_format:
    formats = {3: torch.channels_last, 4: torch.channels_last_3d}
    if len(sample_shape) not in formats:
        raise ValueError(f"channels_last applies to image or volume inputs, not samples of shape {sample_shape}")
    return formats[len(sample_shape)]


def _compiled_frames() -> int:
    """Frames torch.compile has compiled in this process (torch._dynamo's counter)."""
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


def map_tensors(function, value):
    """``function`` applied to every tensor of ``value``: a tensor, or lists, tuples and dicts of them
    (the targets and outputs of detection models)."""
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, dict):
        return {key: map_tensors(function, item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(function, item) for item in value)
    return value


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    """A model output on the host, floating point as float32 (autocast may have made it half precision)."""
    return tensor.detach().to("cpu", torch.float32 if tensor.is_floating_point() else tensor.dtype)


class TorchTrial(TrialRun):
    """PyTorch: DistributedDataParallel (or Horovod), autocast precision, compressed all-reduce hooks."""

    framework = "torch"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.device = torch.device("cpu")  # until _setup picks this rank's device
        self.compiled = False  # the training step is compiled (training.compile)

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _connect(self) -> None:
        layout, trial = self.layout, self.trial
        if trial["backend"] == "horovod":
            self.collectives = HorovodCollectives(init_horovod("torch", layout), trial["compression"])
        elif layout.world_size > 1:
            backend = init_torch_process_group(layout, self.system["device"], self.device)
            self.collectives = TorchDistributed(backend)
        else:
            self.collectives = SingleProcess()
        self.communication = self.collectives.description

    def _setup(self) -> None:
        training, trial, layout = self.training, self.trial, self.layout
        seed_everything(trial["seed"], self.spec["deterministic"])
        torch.set_num_threads(self.threads)
        self.device = torch_device(self.system["device"], layout)
        # A record's "fp32" is IEEE float32: torch runs cuDNN convolutions in TF32 on Ampere and later GPUs by
        # default. Set both ways, as trials in one process (tests, benches) may differ in precision.
        torch.backends.cudnn.conv.fp32_precision = "ieee" if trial["precision"] == "fp32" else "tf32"
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        self._connect()

        self._stage()
        model_config = self.benchmark["model"]
        self.model_spec = models.get(model_config["name"])
        shape = self.model_spec.sample_shape(**model_config["options"])
        self._open_data(shape)

        self.memory_format = _memory_format(shape) if training["channels_last"] else torch.contiguous_format
        self.model = self.model_spec.build(**model_config["options"]).to(self.device, memory_format=self.memory_format)
        if trial["precision"] == "bf16" and self.device.type == "cpu":
            float64_where_bf16_weight_gradients_fail(self.model)  # before DDP and torch.compile wrap it
        self.parameters = list(self.model.parameters())
        self.allreduce_timer = None
        self.network = self.model
        if isinstance(self.collectives, TorchDistributed):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            self.network = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device] if self.device.type == "cuda" else None
            )
            hook = {
                "none": default_hooks.allreduce_hook,
                "fp16": default_hooks.fp16_compress_hook,
                "bf16": default_hooks.bf16_compress_hook,
            }[trial["compression"]]
            self.allreduce_timer = AllreduceTimer(hook, self.device)
            self.network.register_comm_hook(state=None, hook=self.allreduce_timer)
        elif isinstance(self.collectives, HorovodCollectives):
            self.collectives.hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)

        self.criterion = self.model_spec.criterion(training)
        self.optimizer = build_optimizer(self.parameters, training["optimizer"], self.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_factor(training["schedule"], self.steps_per_epoch, self.steps_per_epoch * training["epochs_max"]),
        )
        precision = trial["precision"]
        self.autocast = autocast(self.device, precision)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
        setting = compile_setting(training)
        if setting is not None:
            start = self._now()
            self._compile(setting, shape)
            self.counters.compile_s = self._now() - start
        if layout.is_main:
            self.flop_count = cached_flop_count(
                model_config["name"],
                self.model_spec.counted_work or self.model_spec.build,
                model_config["options"],
                shape,
                self.dataset_root / "flop-counts",
            )

    def _compile(self, setting: dict, shape: tuple[int, ...]) -> None:
        """Compile the training step's network with torch.compile (``setting``: backend and mode), and run
        its forward and backward on synthetic inputs so that compilation happens now, in MLPerf init
        (the module's docstring says why; the warm-up leaves no trace in training)."""
        if self.model_spec.forward_takes_targets:
            raise NotImplementedError(
                f"training.compile: model '{self.benchmark['model']['name']}' takes the targets in its training "
                "forward (a detector: proposals chosen by value, per-image box lists), which a warm-up on synthetic "
                "inputs cannot compile before run_start; run it eager"
            )
        cache_dir = self.system.get("compile_cache_dir")
        if cache_dir is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(os.path.expandvars(cache_dir)).expanduser())
        from torch._dynamo.backends.registry import lookup_backend
        from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

        try:
            lookup_backend(setting["backend"])
        except Exception as error:  # torch's InvalidBackend lists the backends it has
            raise ValueError(f"training.compile: key 'backend': value '{setting['backend']}': {error}") from None
        self.compile_cache_dir = inductor_cache_dir()
        passes = self._warmup_passes(setting)
        self.network = torch.compile(self.network, backend=setting["backend"], mode=setting["mode"])
        generator = torch.Generator().manual_seed(0)
        inputs = torch.randn((self.local_batch, *shape), generator=generator)
        inputs = self._to_device(inputs)
        buffers = [buffer.detach().clone() for buffer in self.model.buffers()]  # BatchNorm statistics
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            self.network.train()
            for _ in range(passes):
                with self.autocast:
                    outputs = self.network(inputs)
                # The network's backward graph is the same whatever the loss: only the gradient's values differ.
                outputs.float().sum().backward()
        with torch.no_grad():
            for buffer, saved in zip(self.model.buffers(), buffers, strict=True):
                buffer.copy_(saved)
        self.optimizer.zero_grad(set_to_none=True)
        if self.allreduce_timer is not None:
            self.allreduce_timer.take_step()  # the warm-up's all-reduces are not a training step's
        self.compiled = True

    def _warmup_passes(self, setting: dict) -> int:
        """Warm-up passes (forward and backward; asked of the network before it is compiled) that leave nothing to
        compile for the training steps: CUDA graphs record on their second call and replay from their third;
        DistributedDataParallel's forward takes another path from its second iteration on (its gradient buckets
        are rebuilt after the first backward)."""
        if setting["mode"] in CUDA_GRAPH_MODES and self.device.type == "cuda":
            return 3
        return 2 if isinstance(self.network, torch.nn.parallel.DistributedDataParallel) else 1

    def _warn_if_compiled_since(self, frames: int | None) -> None:
        """Say so in the trial's log where torch.compile compiled during a training epoch (``frames``: its count
        before; a batch whose shape, dtype or strides the warm-up did not have): that time is in the training."""
        if frames is not None and _compiled_frames() > frames:
            print(
                f"warning: torch.compile compiled {_compiled_frames() - frames} frame(s) during a timed training "
                "epoch; compile_s does not hold that time",
                file=sys.stderr,
            )

    def _to_device(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs.to(self.device, memory_format=self.memory_format)

    def _train_epoch(self, epoch: int) -> None:
        self.network.train()
        self.sampler.set_epoch(epoch)
        frames = _compiled_frames() if self.compiled else None
        step_start = self._now()
        for inputs, targets in self.train_loader:
            inputs, targets = self._to_device(inputs), map_tensors(lambda t: t.to(self.device), targets)
            loaded = self._now()
            self.optimizer.zero_grad(set_to_none=True)
            with self.autocast:
                outputs = (
                    self.network(inputs, targets) if self.model_spec.forward_takes_targets else self.network(inputs)
                )
                loss = self.criterion(outputs, targets)
            if not torch.isfinite(loss):
                raise TrainingDiverged(f"loss is {loss.item()} at epoch {epoch}, step {self.counters.steps}")
            self.scaler.scale(loss).backward()  # DDP all-reduces gradient buckets during backward
            reduce_s = self._horovod_allreduce()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
            step_end = self._now()
            exposed, in_flight = self.allreduce_timer.take_step() if self.allreduce_timer else (reduce_s, reduce_s)
            self._step_done(loaded - step_start, step_end - loaded, exposed, in_flight)
            step_start = self._now()
        self._warn_if_compiled_since(frames)

    def _horovod_allreduce(self) -> float:
        """Average the gradients over the Horovod ranks after backward; its wall time (0 without Horovod or
        with one rank, which has no all-reduce: the record says so)."""
        if not isinstance(self.collectives, HorovodCollectives) or self.world_size == 1:
            return 0.0
        start = self._now()
        self.collectives.average_gradients(self.parameters)
        return self._now() - start

    def _evaluate(self) -> dict[str, float]:
        # Rank 0's BatchNorm statistics everywhere, as DDP broadcasts them before every training forward.
        self.collectives.broadcast_buffers(self.model)
        self.model.eval()
        if self.model_spec.quality_metric is not None:
            return self._evaluate_with_metric()
        sums: dict[str, torch.Tensor] = {}
        with torch.no_grad(), self.autocast:
            for inputs, targets in self.val_loader:
                outputs = self.model(self._to_device(inputs)).float()
                for key, value in self.model_spec.eval_sums(outputs, targets.to(self.device)).items():
                    sums[key] = sums.get(key, 0) + value
        keys = sorted(sums)
        totals = torch.stack([sums[key].to(self.device, torch.float64) for key in keys])
        self.collectives.sum_(totals)
        return self.model_spec.eval_finalize(dict(zip(keys, totals.tolist(), strict=True)))

    def _evaluate_with_metric(self) -> dict[str, float]:
        """Quality from a metric that is not a sum over samples (mAP): every rank's outputs and targets are
        gathered to every rank, in rank order, and go through one metric there. (torchmetrics' own
        synchronisation gathers one tensor per image, which deadlocks when ranks hold different numbers
        of validation images, and works with torch.distributed only.)"""
        batches = []
        with torch.no_grad(), self.autocast:
            for inputs, targets in self.val_loader:
                batches.append((map_tensors(_on_host, self.model(self._to_device(inputs))), targets))
        metric = self.model_spec.quality_metric()
        for rank_batches in self._gather(batches):
            for outputs, targets in rank_batches:
                metric.update(outputs, targets)
        values = {key: value.item() for key, value in metric.compute().items() if value.numel() == 1}
        return self.model_spec.eval_finalize(values)

    def _weights_digest(self) -> str:
        return weights_digest(p.detach().float().cpu().numpy() for p in self.model.parameters())

    def _gather(self, value: dict) -> list[dict]:
        return self.collectives.gather(value)

    def _device_memory_peak_bytes(self) -> int | None:
        if self.device.type != "cuda":
            return None
        return int(torch.cuda.max_memory_allocated(self.device))

    def _canary_group(self) -> CollectiveGroup:
        def summed(tensor: torch.Tensor) -> torch.Tensor:
            self.collectives.sum_(tensor)
            return tensor

        horovod = isinstance(self.collectives, HorovodCollectives)
        return CollectiveGroup(
            self.world_size,
            "horovod.torch" if horovod else f"torch.distributed {self.communication}",
            lambda n, value: torch.full((n,), value, dtype=torch.float32, device=self.device),
            summed,
            self._now,
        )

    def close(self, failure: str | None = None) -> None:
        super().close(failure)
        if hasattr(self, "collectives"):
            self.collectives.close()
