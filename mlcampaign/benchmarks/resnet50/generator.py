"""Image-folder datasets that need no download: real handwritten digits shipped with scikit-learn, and
learnable synthetic images. Output is a deterministic function of the options (and seed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from mlcampaign.data.formats import write_png


def sklearn_digits(out_dir: Path, val_fraction: float = 0.2, split_seed: int = 0) -> None:
    """The 1797 real 8x8 handwritten digits shipped with scikit-learn, as ImageNet-style class folders.

    Writes ``train/<class>/<index>.png`` and ``val/<class>/<index>.png`` (8-bit grayscale),
    with a split stratified by class.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    # The shipped pixel values are integers 0..16.
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    indices = np.arange(len(images))
    train_idx, val_idx = train_test_split(
        indices, test_size=val_fraction, stratify=digits.target, random_state=split_seed
    )
    for split, split_indices in (("train", train_idx), ("val", val_idx)):
        for index in sorted(split_indices):
            label = int(digits.target[index])
            write_png(images[index], Path(out_dir) / split / f"class_{label}" / f"digit_{index:04d}.png")


def synthetic_images(
    out_dir: Path,
    seed: int = 0,
    num_classes: int = 10,
    train_per_class: int = 64,
    val_per_class: int = 16,
    image_size: int = 32,
    noise: float = 0.35,
) -> None:
    """Class-conditional RGB images: a smooth random prototype per class plus per-image noise and jitter.

    The label is recoverable from the image (the prototypes differ), but the noise and random
    shifts keep the task from being trivial, so accuracy rises over epochs like a real task.
    """
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0.0, 1.0, size=(num_classes, 4, 4, 3))
    prototypes = (
        np.stack(
            [
                np.asarray(Image.fromarray((c * 255).astype(np.uint8)).resize((image_size, image_size), Image.BILINEAR))
                for c in coarse
            ]
        ).astype(np.float64)
        / 255.0
    )
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        for label in range(num_classes):
            for index in range(per_class):
                shift = rng.integers(-2, 3, size=2)
                image = np.roll(prototypes[label], shift=tuple(shift), axis=(0, 1))
                image = image * rng.uniform(0.7, 1.3) + rng.normal(0.0, noise, size=image.shape)
                pixels = np.clip(image * 255.0, 0, 255).astype(np.uint8)
                write_png(pixels, Path(out_dir) / split / f"class_{label}" / f"img_{index:05d}.png")
