"""Synthetic ExtremeWeather images (climate fields with boxed events) and the training set's per-channel
``stats.h5``, a deterministic function of the options and seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlcampaign.benchmarks.climate import (
    CHANNEL_INDEX,
    STATS_FILE,
    add_cyclone,
    add_river,
    physical_units,
    weather_background,
    weather_samples,
)
from mlcampaign.data.formats import write_hdf5
from mlcampaign.plan.registry import MLPERF_HPC_SPLITS

# The 16 CAM5 variables of the ExtremeWeather dataset (Racah et al. 2017), in its file order.
EXTREME_WEATHER_CHANNELS = (
    "PRECT", "PS", "PSL", "QREFHT", "T200", "T500", "TMQ", "TREFHT",
    "TS", "U850", "UBOT", "V850", "VBOT", "Z1000", "Z200", "ZBOT",
)  # fmt: skip
# Its event classes 0..3; the format stores class + 1 (torchvision detectors reserve 0 for background).
EXTREME_WEATHER_CLASSES = ("tropical_depression", "tropical_cyclone", "extratropical_cyclone", "atmospheric_river")


# Class ids of the extreme_weather_hdf5 format (0 is the detector's background).
TROPICAL_CYCLONE = EXTREME_WEATHER_CLASSES.index("tropical_cyclone") + 1
ATMOSPHERIC_RIVER = EXTREME_WEATHER_CLASSES.index("atmospheric_river") + 1
# The DeepCAM-ordered fields of the event drawings, in the ExtremeWeather channel order.
_EXTREME_WEATHER_ORDER = [CHANNEL_INDEX[name] for name in EXTREME_WEATHER_CHANNELS]


def _bounding_box(mask: np.ndarray) -> list[float]:
    """Pixel box (xmin, ymin, xmax, ymax) enclosing a mask: pixel (row r, col c) covers [c, c+1) x [r, r+1)."""
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    return [float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1)]


def extreme_weather_snapshot(rng: np.random.Generator, height: int, width: int, cyclones: int, rivers: int):
    """One sample: float32 fields (16, height, width) in the ExtremeWeather channel order, float32 boxes
    (n, 4) as (xmin, ymin, xmax, ymax) pixels, and int64 class ids (n,).

    The DeepCAM weather (same background and event drawings): ``rivers`` atmospheric rivers, then
    ``cyclones`` tropical cyclones, each boxed by the pixels it changed. An event that falls outside
    the image (a river whose band misses it) has no box.
    """
    fields = weather_background(rng, height, width)
    rows, cols = np.mgrid[0:height, 0:width].astype(np.float64)
    boxes, labels = [], []
    events = [(add_river, ATMOSPHERIC_RIVER)] * rivers + [(add_cyclone, TROPICAL_CYCLONE)] * cyclones
    for draw, label in events:
        mask = draw(rng, fields, rows, cols)
        if mask.any():
            boxes.append(_bounding_box(mask))
            labels.append(label)
    images = np.moveaxis(physical_units(fields)[..., _EXTREME_WEATHER_ORDER], -1, 0)
    return (
        np.ascontiguousarray(images),
        np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
        np.asarray(labels, dtype=np.int64),
    )


def extreme_weather_events(
    out_dir: Path,
    seed: int = 0,
    train_samples: int = 512,
    val_samples: int = 128,
    height: int = 768,
    width: int = 1152,
    max_cyclones: int = 2,
    max_rivers: int = 1,
) -> None:
    """Synthetic ExtremeWeather samples (one HDF5 file each) and the training set's per-channel ``stats.h5``.

    Each image holds 0..``max_cyclones`` tropical cyclones and 0..``max_rivers`` atmospheric rivers.
    """
    channels = len(EXTREME_WEATHER_CHANNELS)
    total, total_squares, pixels = np.zeros(channels), np.zeros(channels), 0
    samples = weather_samples(out_dir, MLPERF_HPC_SPLITS, seed, train_samples, val_samples, max_cyclones, max_rivers)
    for split, directory, index, rng, cyclones, rivers in samples:
        images, boxes, labels = extreme_weather_snapshot(rng, height, width, cyclones, rivers)
        if split == "train":
            values = images.reshape(channels, -1).astype(np.float64)
            total += values.sum(axis=1)
            total_squares += (values**2).sum(axis=1)
            pixels += values.shape[1]
        write_hdf5(
            directory / f"extreme-weather-synthetic-{index:05d}.h5",
            {"images": images, "boxes": boxes, "labels": labels},
        )
    mean = total / pixels
    std = np.sqrt(np.maximum(total_squares / pixels - mean**2, 0.0))
    write_hdf5(
        Path(out_dir) / STATS_FILE,
        {"images/mean": mean.astype(np.float32), "images/std": std.astype(np.float32)},
    )
