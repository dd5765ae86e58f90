"""The dataset format of HPC AI500's extreme-weather benchmark, ``extreme_weather_hdf5``.

``train/*.h5`` and ``validation/*.h5``, one file per image with ``images`` (16, height, width) float32 in
the ExtremeWeather channel order, ``boxes`` (n, 4) float32 pixel corners (xmin, ymin, xmax, ymax) and
``labels`` (n,) int64 class ids (1..4 = ExtremeWeather class + 1; 0 is the detector's background), n >= 0;
and ``stats.h5`` at the root with per-channel ``images/mean`` and ``images/std`` of the training images.
Inputs are standardised to (x - mean) / std; targets are torchvision detection dicts (boxes, labels). A
sample whose shape differs from the model's input raises DatasetError naming the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from mlcampaign.benchmarks.climate import STATS_FILE
from mlcampaign.data.formats import split_files
from mlcampaign.data.manifest import DatasetError
from mlcampaign.plan.registry import MLPERF_HPC_SPLITS


class ExtremeWeatherSamples(Dataset):
    """One HDF5 file per image: standardised fields and a detection target {boxes, labels}."""

    def __init__(self, root: Path, directory: str, sample_shape: tuple[int, ...]):
        import h5py

        self.files = split_files(root, directory, ".h5")
        self.sample_shape = sample_shape
        stats_path = Path(root) / STATS_FILE
        if not stats_path.is_file():
            raise DatasetError(f"{stats_path}: missing (per-channel images/mean and images/std)")
        with h5py.File(stats_path, "r") as stats:
            mean = stats["images/mean"][...].astype(np.float32)
            std = stats["images/std"][...].astype(np.float32)
        if mean.shape != (sample_shape[0],) or std.shape != (sample_shape[0],) or not (std > 0).all():
            raise DatasetError(
                f"{stats_path}: images/mean {mean.shape} and images/std {std.shape} must hold {sample_shape[0]} "
                "channels, with std > 0"
            )
        self.mean, self.inverse_std = mean[:, None, None], (1.0 / std)[:, None, None]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        import h5py

        path = self.files[index]
        with h5py.File(path, "r") as handle:
            images, boxes, labels = (handle[key][...] for key in ("images", "boxes", "labels"))
        if images.shape != self.sample_shape:
            raise DatasetError(f"{path}: images {images.shape} do not match the model's input {self.sample_shape}")
        _, height, width = self.sample_shape
        boxes = boxes.astype(np.float32).reshape(-1, 4)
        valid = (
            (boxes[:, 0] >= 0)
            & (boxes[:, 1] >= 0)
            & (boxes[:, 2] <= width)
            & (boxes[:, 3] <= height)
            & (boxes[:, 2] > boxes[:, 0])
            & (boxes[:, 3] > boxes[:, 1])
        )
        if labels.shape != (len(boxes),) or not valid.all() or (labels < 1).any():
            raise DatasetError(
                f"{path}: boxes {boxes.shape} must be (n, 4) corners xmin < xmax <= {width}, ymin < ymax <= {height}, "
                f"with labels of shape (n,) >= 1 (got {labels.shape})"
            )
        x = self.inverse_std * (images.astype(np.float32) - self.mean)
        target = {"boxes": torch.from_numpy(boxes), "labels": torch.from_numpy(labels.astype(np.int64))}
        return torch.from_numpy(np.ascontiguousarray(x)), target


def extreme_weather_hdf5(root: Path, split: str, sample_shape: tuple[int, ...]) -> Dataset:
    return ExtremeWeatherSamples(root, MLPERF_HPC_SPLITS[split], sample_shape)
