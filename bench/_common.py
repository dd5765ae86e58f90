"""What the bench scripts share: a benchmark of a campaign config as a staged, set-up TorchTrial,
and interleaved timing.

The trial is the real ``mlcampaign.trial.torch.trial.TorchTrial`` after its ``prepare`` (data loaders, model,
optimizer, schedule, precision), i.e. exactly what a campaign trial trains with; only the
campaign's first trial of the benchmark is used (seed and cell as planned).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from mlcampaign.data.manifest import ID_FILE  # noqa: E402
from mlcampaign.data.staging import stage_into  # noqa: E402
from mlcampaign.plan.config import deep_merge, load_campaign  # noqa: E402
from mlcampaign.trial.distributed import detect_layout  # noqa: E402
from mlcampaign.trial.torch.trial import TorchTrial  # noqa: E402

DEFAULT_CONFIG = REPO / "config" / "config.yaml"
# The benchmarks measured: the CPU-sized variants of the default campaign, with smaller training and
# validation splits (same sample size, format and model) so that a bench epoch takes seconds: 2-3
# training steps. resnet50-digits is left out:
# its split is the real digits set (44 steps), and its model and reader are resnet50-synthetic's.
SMALL_SPLITS = {
    "resnet50-synthetic": {"name": "bench-img-32", "source": {"options": {"train_per_class": 8, "val_per_class": 2}}},
    "cosmoflow": {"name": "bench-cosmoflow-32", "source": {"options": {"train_samples": 48, "val_samples": 16}}},
    "deepcam": {"name": "bench-deepcam-64x96", "source": {"options": {"train_samples": 24, "val_samples": 8}}},
    "extreme-weather": {"name": "bench-weather-64x96", "source": {"options": {"train_samples": 24, "val_samples": 8}}},
}
CONTENTION_NOTE = "absolute rates depend on what else runs on this machine; ratios of interleaved measurements do not"


def trial_spec(benchmark: str, overrides: dict | None = None) -> dict:
    """The trial spec (as the trial rule passes it) of the default campaign's first trial of
    ``benchmark`` at scale 1x1, with the bench's small splits; ``overrides`` are further
    benchmark_overrides of that benchmark."""
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    config["matrix"] = {"scales": ["1x1"], "precisions": ["fp32"]}
    config["benchmarks"] = [benchmark]
    campaign_overrides = config.get("benchmark_overrides", {}).get(benchmark, {})
    bench_overrides = deep_merge({"dataset": SMALL_SPLITS[benchmark]}, overrides or {})
    config["benchmark_overrides"] = {benchmark: deep_merge(campaign_overrides, bench_overrides)}
    campaign = load_campaign(config, REPO / "config", source=str(DEFAULT_CONFIG))
    return campaign.trial_spec(next(campaign.trials()), "bench", "local")


def staged_dataset(spec: dict, datasets_dir: Path) -> Path:
    """Stage (generate or copy, then hash) the benchmark's dataset under ``datasets_dir``, once per
    dataset name; returns its id file (data and manifest beside it), as trials take it."""
    root = Path(datasets_dir) / spec["benchmark"]["dataset"]["name"]
    if not (root / ID_FILE).is_file():
        stage_into(spec["benchmark"]["dataset"], root)
    return root / ID_FILE


def ready_trial(spec: dict, datasets_dir: Path, workdir: Path) -> TorchTrial:
    """A TorchTrial of ``spec`` set up as ``TrialRun.run`` does before its first epoch (``prepare``)."""
    id_path = staged_dataset(spec, datasets_dir)
    trial = TorchTrial(spec, detect_layout(), id_path, Path(workdir) / f"{spec['trial']['benchmark']}.mllog")
    trial.prepare()
    return trial


def bare_loader(trial: TorchTrial) -> DataLoader:
    """The bare loops' loader: the trial's dataset, batch, loader workers and collation, shuffled by a plain
    DataLoader instead of the trial's distributed sampler."""
    return DataLoader(
        trial.train_loader.dataset,
        batch_size=trial.local_batch,
        shuffle=True,
        drop_last=True,
        num_workers=trial.training["data_workers"],
        collate_fn=trial.train_loader.collate_fn,
    )


def interleaved(measures: dict[str, Callable[[], object]], rounds: int, warmup: int = 1) -> dict[str, dict]:
    """Wall and CPU seconds of each measure, run in turns (AB BA AB ..., so that neither always runs
    first); the first ``warmup`` rounds are run and discarded. CPU time (this process, all threads)
    is barely touched by other people's work on a shared machine, unlike wall time."""
    names = list(measures)
    seconds = {name: {"wall": [], "cpu": []} for name in names}
    for round_index in range(warmup + rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            measures[name]()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if round_index >= warmup:
                seconds[name]["wall"].append(wall)
                seconds[name]["cpu"].append(cpu)
    return seconds
