"""Synthetic DeepCAM snapshots (climate fields and per-pixel labels) and the training set's ``stats.h5``, a
deterministic function of the options and seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlcampaign.benchmarks.climate import (
    CAM5_CHANNELS,
    STATS_FILE,
    add_cyclone,
    add_river,
    physical_units,
    weather_background,
    weather_samples,
)
from mlcampaign.data.formats import write_hdf5
from mlcampaign.plan.registry import MLPERF_HPC_SPLITS

# The label of each pixel.
BACKGROUND, CYCLONE, RIVER = 0, 1, 2


def deepcam_snapshot(rng: np.random.Generator, height: int, width: int, cyclones: int, rivers: int):
    """One sample: float32 climate fields (height, width, 16) and uint8 labels (height, width).

    Smooth random weather on every channel, plus ``rivers`` atmospheric rivers (long curved
    bands of high water vapour with wind along them, label 2) and ``cyclones`` tropical
    cyclones (discs of low pressure with a vortex, heavy rain and moisture, label 1, drawn
    over rivers). The event signatures are strong but share channels, so telling the two
    classes apart needs the combination of channels and the shape of the region.
    """
    fields = weather_background(rng, height, width)
    labels = np.full((height, width), BACKGROUND, dtype=np.uint8)
    rows, cols = np.mgrid[0:height, 0:width].astype(np.float64)
    for _ in range(rivers):
        labels[add_river(rng, fields, rows, cols)] = RIVER
    for _ in range(cyclones):
        labels[add_cyclone(rng, fields, rows, cols)] = CYCLONE
    return physical_units(fields), labels


def deepcam_climate(
    out_dir: Path,
    seed: int = 0,
    train_samples: int = 512,
    val_samples: int = 128,
    height: int = 768,
    width: int = 1152,
    max_cyclones: int = 2,
    max_rivers: int = 2,
) -> None:
    """Synthetic DeepCAM samples (one HDF5 file each) and the training set's ``stats.h5``."""
    minimum = np.full(len(CAM5_CHANNELS), np.inf)
    maximum = np.full(len(CAM5_CHANNELS), -np.inf)
    samples = weather_samples(out_dir, MLPERF_HPC_SPLITS, seed, train_samples, val_samples, max_cyclones, max_rivers)
    for split, directory, index, rng, cyclones, rivers in samples:
        data, labels = deepcam_snapshot(rng, height, width, cyclones, rivers)
        if split == "train":
            minimum = np.minimum(minimum, data.min(axis=(0, 1)))
            maximum = np.maximum(maximum, data.max(axis=(0, 1)))
        write_hdf5(directory / f"data-synthetic-{index:05d}.h5", {"climate/data": data, "climate/labels_0": labels})
    write_hdf5(
        Path(out_dir) / STATS_FILE,
        {"climate/minval": minimum.astype(np.float32), "climate/maxval": maximum.astype(np.float32)},
    )
