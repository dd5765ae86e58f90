"""Readers of the on-disk dataset formats, returning torch datasets of (input, target) samples."""

from __future__ import annotations

import functools
from pathlib import Path

from torch.utils.data import Dataset


def image_folder(root: Path, split: str, sample_shape: tuple[int, ...]) -> Dataset:
    """ImageNet-style ``<split>/<class>/<image>`` folders, resized to the model's input size.

    Images are converted to the model's channel count (RGB for 3) and scaled to [-1, 1].
    """
    from torchvision import datasets, transforms

    channels, height, width = sample_shape
    mode = {1: "L", 3: "RGB"}[channels]
    transform = transforms.Compose(
        [
            functools.partial(_convert, mode=mode),
            transforms.Resize((height, width), antialias=True),
            transforms.ToTensor(),
            transforms.Normalize([0.5] * channels, [0.5] * channels),
        ]
    )
    return datasets.ImageFolder(str(Path(root) / split), transform=transform)


def _convert(image, mode: str):
    # A module-level function (not a lambda) so DataLoader workers can pickle the transform.
    return image.convert(mode)


READERS = {"image_folder": image_folder}


def open_split(data_format: str, root: Path, split: str, sample_shape: tuple[int, ...]) -> Dataset:
    return READERS[data_format](root, split, sample_shape)
