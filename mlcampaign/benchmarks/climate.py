"""The CAM5 climate fields that both climate benchmarks draw (DeepCAM segmentation, HPC AI500's extreme-weather
detection): the 16 variables with a typical value and spread each, smooth random weather, the two event
signatures (atmospheric rivers, tropical cyclones), per-sample seeding, and the training set's statistics file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

# The per-channel normalisation statistics of a climate dataset, at its root (every subset keeps it).
STATS_FILE = "stats.h5"

# The 16 CAM5 variables of the DeepCAM data, in file order, with a typical value and spread
# of each (so that the stats.h5 normalisation has real work to do).
CAM5_CHANNELS = (
    ("TMQ", 25.0, 12.0),  # integrated water vapour, kg m-2
    ("U850", 0.0, 8.0),
    ("V850", 0.0, 8.0),
    ("UBOT", 0.0, 6.0),
    ("VBOT", 0.0, 6.0),
    ("QREFHT", 0.01, 0.005),
    ("PS", 98000.0, 1500.0),
    ("PSL", 101000.0, 1200.0),
    ("T200", 218.0, 5.0),
    ("T500", 258.0, 8.0),
    ("PRECT", 3e-8, 2e-8),
    ("TS", 288.0, 12.0),
    ("TREFHT", 287.0, 11.0),
    ("Z1000", 100.0, 80.0),
    ("Z200", 11800.0, 300.0),
    ("ZBOT", 65.0, 5.0),
)
CHANNEL_INDEX = {name: index for index, (name, _, _) in enumerate(CAM5_CHANNELS)}


def smooth_map(rng: np.random.Generator, height: int, width: int, length: float) -> np.ndarray:
    noise = rng.standard_normal((height, width))
    ky = np.fft.fftfreq(height)[:, None] * 2 * np.pi
    kx = np.fft.fftfreq(width)[None, :] * 2 * np.pi
    field = np.fft.ifft2(np.fft.fft2(noise) * np.exp(-0.5 * (ky**2 + kx**2) * length**2)).real
    return (field - field.mean()) / field.std()


def weather_background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth random weather on every channel, in standard units (height, width, 16)."""
    scale = min(height, width)
    fields = np.stack([smooth_map(rng, height, width, length=scale / 8) for _ in CAM5_CHANNELS], axis=-1)
    return fields + 0.3 * rng.standard_normal(fields.shape)


def add_river(rng: np.random.Generator, fields: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Draw one atmospheric river into ``fields`` (a long curved band of high water vapour with wind
    along it); return its pixel mask."""
    height, width = rows.shape
    # Centre line row = a + b * col + c * sin(col / period + phase) over part of the width.
    start, stop = sorted(rng.uniform(0, width, size=2))
    stop = max(stop, start + width / 2)
    base, slope = rng.uniform(0.2 * height, 0.8 * height), rng.uniform(-0.3, 0.3) * height / width
    bend, period, phase = rng.uniform(0, 0.1 * height), rng.uniform(0.1, 0.3) * width, rng.uniform(0, 2 * np.pi)
    centre = base + slope * (cols - start) + bend * np.sin(cols / period + phase)
    half_width = rng.uniform(0.05, 0.08) * min(height, width)
    inside = (np.abs(rows - centre) < half_width) & (cols >= start) & (cols <= stop)
    fields[..., CHANNEL_INDEX["TMQ"]] += 3.0 * inside
    fields[..., CHANNEL_INDEX["QREFHT"]] += 1.5 * inside
    fields[..., CHANNEL_INDEX["U850"]] += 2.0 * inside
    fields[..., CHANNEL_INDEX["PRECT"]] += 1.0 * inside
    return inside


def add_cyclone(rng: np.random.Generator, fields: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Draw one tropical cyclone into ``fields`` (a disc of low pressure with a vortex, heavy rain and
    moisture); return its pixel mask."""
    height, width = rows.shape
    centre_row, centre_col = rng.uniform(0.15, 0.85) * height, rng.uniform(0.1, 0.9) * width
    radius = rng.uniform(0.08, 0.12) * min(height, width)
    distance = np.hypot(rows - centre_row, cols - centre_col)
    inside = distance < radius
    profile = inside * (1.0 - 0.5 * (distance / radius) ** 2)
    fields[..., CHANNEL_INDEX["PSL"]] -= 3.0 * profile
    fields[..., CHANNEL_INDEX["PS"]] -= 3.0 * profile
    fields[..., CHANNEL_INDEX["PRECT"]] += 2.0 * profile
    fields[..., CHANNEL_INDEX["TMQ"]] += 2.0 * profile
    # Counter-clockwise vortex: tangential wind, strongest near the edge of the disc.
    tangential = 3.0 * inside * distance / radius
    with np.errstate(invalid="ignore", divide="ignore"):
        unit_row = np.where(distance > 0, (rows - centre_row) / distance, 0.0)
        unit_col = np.where(distance > 0, (cols - centre_col) / distance, 0.0)
    for u, v in (("U850", "V850"), ("UBOT", "VBOT")):
        fields[..., CHANNEL_INDEX[u]] -= tangential * unit_row
        fields[..., CHANNEL_INDEX[v]] += tangential * unit_col
    return inside


def physical_units(fields: np.ndarray) -> np.ndarray:
    typical = np.array([value for _, value, _ in CAM5_CHANNELS])
    spread = np.array([value for _, _, value in CAM5_CHANNELS])
    return (typical + spread * fields).astype(np.float32)


def weather_samples(
    out_dir: Path,
    split_dirs: dict[str, str],
    seed: int,
    train_samples: int,
    val_samples: int,
    max_cyclones: int,
    max_rivers: int,
) -> Iterator[tuple[str, Path, int, np.random.Generator, int, int]]:
    """The samples of a climate dataset (DeepCAM, extreme weather) to draw: (split, its directory,
    index, the sample's generator, cyclones, rivers). Each sample's generator is seeded by (seed,
    split, index), so a sample does not depend on how many others are drawn."""
    for split_index, (split, count) in enumerate((("train", train_samples), ("val", val_samples))):
        directory = Path(out_dir) / split_dirs[split]
        directory.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            rng = np.random.default_rng([seed, split_index, index])
            cyclones, rivers = rng.integers(0, max_cyclones + 1), rng.integers(0, max_rivers + 1)
            yield split, directory, index, rng, cyclones, rivers
