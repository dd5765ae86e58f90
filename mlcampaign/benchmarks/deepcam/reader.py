"""DeepCAM's dataset format, ``deepcam_hdf5``.

``train/*.h5`` and ``validation/*.h5``, one file per sample with ``climate/data`` (height, width, 16) and
``climate/labels_0`` (height, width), and ``stats.h5`` at the root with per-channel ``climate/minval`` and
``climate/maxval``; inputs are scaled to (x - min) / (max - min), channels first. A sample whose shape
differs from the model's input raises DatasetError naming the file.
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


class DeepCAMSamples(Dataset):
    """One HDF5 file per sample, min-max normalised with the dataset's ``stats.h5``."""

    def __init__(self, root: Path, directory: str, sample_shape: tuple[int, ...]):
        import h5py

        self.files = split_files(root, directory, ".h5")
        self.sample_shape = sample_shape
        stats_path = Path(root) / STATS_FILE
        if not stats_path.is_file():
            raise DatasetError(f"{stats_path}: missing (per-channel climate/minval and climate/maxval)")
        with h5py.File(stats_path, "r") as stats:
            minimum = stats["climate/minval"][...].astype(np.float32)
            maximum = stats["climate/maxval"][...].astype(np.float32)
        if minimum.shape != (sample_shape[0],):
            raise DatasetError(
                f"{stats_path}: climate/minval has shape {minimum.shape}, expected ({sample_shape[0]},) channels"
            )
        self.shift = minimum
        self.scale = 1.0 / (maximum - minimum)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        import h5py

        path = self.files[index]
        channels, height, width = self.sample_shape
        with h5py.File(path, "r") as handle:
            data = handle["climate/data"][...]
            labels = handle["climate/labels_0"][...]
        if data.shape != (height, width, channels) or labels.shape != (height, width):
            raise DatasetError(
                f"{path}: climate/data {data.shape} and climate/labels_0 {labels.shape} do not match the model's "
                f"input ({height}, {width}, {channels})"
            )
        x = np.moveaxis(self.scale * (data.astype(np.float32) - self.shift), -1, 0)
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(labels.astype(np.int64))


def deepcam_hdf5(root: Path, split: str, sample_shape: tuple[int, ...]) -> Dataset:
    return DeepCAMSamples(root, MLPERF_HPC_SPLITS[split], sample_shape)
