"""CosmoFlow's three dataset formats.

- ``cosmoflow_tfrecord``: ``train/*.tfrecord`` and ``validation/*.tfrecord``, one gzip (or plain)
  TFRecord per sample holding a ``tf.train.Example`` with ``x`` (int16 particle counts, raw bytes of shape
  (size, size, size, 4)) and ``y`` (4 floats), as in ``cosmoUniverse_2019_05_4parE_tf_v2``;
- ``cosmoflow_hdf5`` and ``cosmoflow_numpy``: the same samples converted to one ``.h5`` / ``.npz`` file
  each with arrays ``x`` and ``y``.

Inputs become ``log1p(counts)``, channels first. A sample whose shape differs from the model's input
raises DatasetError naming the file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from mlcampaign.data.formats import split_files
from mlcampaign.data.manifest import DatasetError
from mlcampaign.data.tfrecord import TFRecordError, decode_example, read_records
from mlcampaign.plan.registry import MLPERF_HPC_SPLITS


def read_cosmoflow_tfrecord(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``x`` bytes (int16, little-endian) and ``y`` of the only Example in a CosmoFlow TFRecord file."""
    records = read_records(path)
    first = next(records, None)
    if first is None:
        raise DatasetError(f"{path}: holds no record")
    if next(records, None) is not None:
        raise DatasetError(f"{path}: holds more than one sample; expected one per file (the _tf_v2 layout)")
    try:
        example = decode_example(first)
    except TFRecordError as error:
        raise DatasetError(f"{path}: not a valid tf.train.Example: {error}") from error
    for key in ("x", "y"):
        if key not in example:
            raise DatasetError(f"{path}: the Example has no feature '{key}' (found {sorted(example)})")
    if not isinstance(example["x"], bytes):
        raise DatasetError(f"{path}: feature 'x' must hold one byte string")
    return np.frombuffer(example["x"], dtype="<i2"), np.asarray(example["y"], dtype=np.float32)


def read_cosmoflow_hdf5(path: Path) -> tuple[np.ndarray, np.ndarray]:
    import h5py

    with h5py.File(path, "r") as handle:
        return handle["x"][...], handle["y"][...].astype(np.float32)


def read_cosmoflow_numpy(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as arrays:
        return arrays["x"], arrays["y"].astype(np.float32)


class CosmoFlowSamples(Dataset):
    """One sample per file: ``log1p`` of the counts (channels first) and the 4 target parameters."""

    def __init__(self, files: list[Path], read: Callable, sample_shape: tuple[int, ...]):
        channels, *spatial = sample_shape
        self.files, self.read = files, read
        self.file_shape = (*spatial, channels)  # stored channels last, as the reference writes it

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        path = self.files[index]
        counts, target = self.read(path)
        if counts.size != np.prod(self.file_shape):
            raise DatasetError(
                f"{path}: feature 'x' holds {counts.size} values, expected {np.prod(self.file_shape)} for shape "
                f"{self.file_shape} (the model's input size)"
            )
        x = np.log1p(counts.reshape(self.file_shape).astype(np.float32))
        return torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 0))), torch.from_numpy(target)


def _cosmoflow_reader(read: Callable, suffix: str) -> Callable[..., Dataset]:
    def open_split(root: Path, split: str, sample_shape: tuple[int, ...]) -> Dataset:
        return CosmoFlowSamples(split_files(root, MLPERF_HPC_SPLITS[split], suffix), read, sample_shape)

    return open_split


cosmoflow_tfrecord = _cosmoflow_reader(read_cosmoflow_tfrecord, ".tfrecord")
cosmoflow_hdf5 = _cosmoflow_reader(read_cosmoflow_hdf5, ".h5")
cosmoflow_numpy = _cosmoflow_reader(read_cosmoflow_numpy, ".npz")
