"""Readers of the on-disk dataset formats, returning torch datasets of (input, target) samples.

Each format is registered in ``mlcampaign.registry.DATA_FORMATS`` with its reader here, the
directory of each split under the dataset root (as the real datasets lay them out) and the files
outside the splits that belong to every subset of it (the climate data's normalisation statistics).

- ``image_folder``: ImageNet-style ``train/<class>/<image>`` and ``val/<class>/<image>``.
- ``cosmoflow_tfrecord``: ``train/*.tfrecord`` and ``validation/*.tfrecord``, one gzip (or
  plain) TFRecord per sample holding a ``tf.train.Example`` with ``x`` (int16 particle counts,
  raw bytes of shape (size, size, size, 4)) and ``y`` (4 floats), as in
  ``cosmoUniverse_2019_05_4parE_tf_v2``; ``cosmoflow_hdf5`` and ``cosmoflow_numpy`` are the
  same samples converted to one ``.h5`` / ``.npz`` file each with arrays ``x`` and ``y``.
  Inputs become ``log1p(counts)``, channels first.
- ``deepcam_hdf5``: ``train/*.h5`` and ``validation/*.h5``, one file per sample with
  ``climate/data`` (height, width, 16) and ``climate/labels_0`` (height, width), and
  ``stats.h5`` at the root with per-channel ``climate/minval`` and ``climate/maxval``;
  inputs are scaled to (x - min) / (max - min), channels first.
- ``extreme_weather_hdf5``: ``train/*.h5`` and ``validation/*.h5``, one file per image with
  ``images`` (16, height, width) float32 in the ExtremeWeather channel order, ``boxes`` (n, 4)
  float32 pixel corners (xmin, ymin, xmax, ymax) and ``labels`` (n,) int64 class ids (1..4 =
  ExtremeWeather class + 1; 0 is the detector's background), n >= 0; and ``stats.h5`` at the
  root with per-channel ``images/mean`` and ``images/std`` of the training images. Inputs are
  standardised to (x - mean) / std; targets are torchvision detection dicts (boxes, labels).

A sample whose shape differs from the model's input raises DatasetError naming the file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from mlcampaign.data.manifest import DatasetError
from mlcampaign.data.tfrecord import TFRecordError, decode_example, read_records
from mlcampaign.registry import DATA_FORMATS, STATS_FILE, VALIDATION_SPLITS

COSMOFLOW_CHANNELS = 4


# -- image folders ---------------------------------------------------------------------------
# ImageNet channel statistics, used by the MLPerf ResNet-50 preprocessing.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def image_folder(root: Path, split: str, sample_shape: tuple[int, ...], augment: bool = False) -> Dataset:
    """ImageNet-style class folders at the model's input size.

    Without ``augment`` (small CPU sets): resize to the input size, convert to the model's
    channel count (RGB for 3) and scale to [-1, 1]. With ``augment`` (MLPerf ResNet-50):
    training images get a random-resized crop and horizontal flip, validation images a resize
    to 8/7 of the input size and a centre crop (256 -> 224), both normalised with the ImageNet
    channel statistics.
    """
    from torchvision import datasets, transforms

    channels, height, width = sample_shape
    mode = {1: "L", 3: "RGB"}[channels]
    convert = functools.partial(_convert, mode=mode)
    if not augment:
        steps = [convert, transforms.Resize((height, width), antialias=True), transforms.ToTensor()]
        steps.append(transforms.Normalize([0.5] * channels, [0.5] * channels))
    elif split == "train":
        steps = [convert, transforms.RandomResizedCrop((height, width), antialias=True)]
        steps += [transforms.RandomHorizontalFlip(), transforms.ToTensor()]
        steps.append(transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD))
    else:
        steps = [convert, transforms.Resize(round(min(height, width) * 8 / 7), antialias=True)]
        steps += [transforms.CenterCrop((height, width)), transforms.ToTensor()]
        steps.append(transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD))
    return datasets.ImageFolder(str(Path(root) / split), transform=transforms.Compose(steps))


def _convert(image, mode: str):
    # A module-level function (not a lambda) so DataLoader workers can pickle the transform.
    return image.convert(mode)


# -- CosmoFlow -------------------------------------------------------------------------------
def _split_files(root: Path, directory: str, suffix: str) -> list[Path]:
    files = sorted((Path(root) / directory).glob(f"*{suffix}"))
    if not files:
        raise DatasetError(f"{Path(root) / directory}: no *{suffix} files")
    return files


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
        return CosmoFlowSamples(_split_files(root, VALIDATION_SPLITS[split], suffix), read, sample_shape)

    return open_split


cosmoflow_tfrecord = _cosmoflow_reader(read_cosmoflow_tfrecord, ".tfrecord")
cosmoflow_hdf5 = _cosmoflow_reader(read_cosmoflow_hdf5, ".h5")
cosmoflow_numpy = _cosmoflow_reader(read_cosmoflow_numpy, ".npz")


# -- DeepCAM ---------------------------------------------------------------------------------
class DeepCAMSamples(Dataset):
    """One HDF5 file per sample, min-max normalised with the dataset's ``stats.h5``."""

    def __init__(self, root: Path, directory: str, sample_shape: tuple[int, ...]):
        import h5py

        self.files = _split_files(root, directory, ".h5")
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
    return DeepCAMSamples(root, VALIDATION_SPLITS[split], sample_shape)


# -- Extreme weather (HPC AI500) ---------------------------------------------------------


class ExtremeWeatherSamples(Dataset):
    """One HDF5 file per image: standardised fields and a detection target {boxes, labels}."""

    def __init__(self, root: Path, directory: str, sample_shape: tuple[int, ...]):
        import h5py

        self.files = _split_files(root, directory, ".h5")
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
    return ExtremeWeatherSamples(root, VALIDATION_SPLITS[split], sample_shape)


def open_split(
    data_format: str, root: Path, split: str, sample_shape: tuple[int, ...], options: dict | None = None
) -> Dataset:
    return DATA_FORMATS[data_format].open_split(root, split, sample_shape, **(options or {}))
