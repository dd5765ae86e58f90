"""ResNet-50's dataset format ``image_folder``: ImageNet-style class folders, ``train/<class>/<image>`` and
``val/<class>/<image>``."""

from __future__ import annotations

import functools
from pathlib import Path

from torch.utils.data import Dataset

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
