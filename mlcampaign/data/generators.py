"""Dataset sources that need no download: real images shipped in a package, and learnable synthetic data.

Each generator writes the on-disk layout a real copy of the benchmark's dataset uses, so
training always goes through the same reader. Output is a deterministic function of the
options (and seed): generating twice yields byte-identical files and the same dataset id.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from mlcampaign.data.tfrecord import encode_example, write_records
from mlcampaign.registry import EXTREME_WEATHER_CHANNELS, EXTREME_WEATHER_CLASSES, STATS_FILE, VALIDATION_SPLITS


def _write_png(array: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, format="PNG", optimize=False)


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
            _write_png(images[index], Path(out_dir) / split / f"class_{label}" / f"digit_{index:04d}.png")


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
                _write_png(pixels, Path(out_dir) / split / f"class_{label}" / f"img_{index:05d}.png")


# -- CosmoFlow -------------------------------------------------------------------------------
def _smooth_field(rng: np.random.Generator, size: int, length: float) -> np.ndarray:
    """A periodic Gaussian random field of unit variance, smoothed over ``length`` voxels."""
    noise = rng.standard_normal((size, size, size))
    k = np.fft.fftfreq(size) * 2 * np.pi
    k2 = k[:, None, None] ** 2 + k[None, :, None] ** 2 + k[None, None, :] ** 2
    field = np.fft.ifftn(np.fft.fftn(noise) * np.exp(-0.5 * k2 * length**2)).real
    return (field - field.mean()) / field.std()


def cosmoflow_universe(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One sample: int16 counts (size, size, size, 4), channels last, and its 4 parameters in [-1, 1].

    The same log-normal density field at 4 redshifts (channels), as in the simulations. The
    parameters set, in order, the mean log-density, the contrast of the fluctuations, their
    correlation length, and how much the contrast grows from the first to the last redshift.
    The density's mean is conserved as the contrast grows (log-density shifted by -contrast^2/2),
    and counts are Poisson draws of it, so no single voxel gives a parameter away: recovering
    them takes statistics over the cube. The Gaussian field is clipped at 2 standard deviations
    so that the extremes a max-pooling network sees do not vary with the random draw more than
    with the parameters.
    """
    params = rng.uniform(-1.0, 1.0, size=4)
    mean_log, contrast = 2.0 + 0.5 * params[0], 0.4 + 0.4 * (params[1] + 1.0)
    field = np.clip(_smooth_field(rng, size, length=1.0 + 0.75 * (params[2] + 1.0)), -2.0, 2.0)
    contrast_per_redshift = contrast * (1.0 + 0.5 * params[3] * np.linspace(-1.0, 1.0, 4))
    log_density = mean_log + contrast_per_redshift * field[..., None] - 0.5 * contrast_per_redshift**2
    counts = rng.poisson(np.exp(log_density))
    return np.minimum(counts, np.iinfo(np.int16).max).astype("<i2"), params.astype(np.float32)


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # numpy.savez stamps the current time into the zip entries; a fixed stamp keeps files reproducible.
    with zipfile.ZipFile(path, "w") as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())


def _write_hdf5(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # No creation times (track_times, and no track_order, which timestamps the root group): equal arrays, equal bytes.
    import h5py

    with h5py.File(path, "w") as handle:
        for name, array in arrays.items():
            handle.create_dataset(name, data=array, track_times=False)


COSMOFLOW_WRITERS = {
    "cosmoflow_tfrecord": (
        ".tfrecord",
        lambda path, x, y: write_records(path, [encode_example({"x": x.tobytes(), "y": y})], compress=True),
    ),
    "cosmoflow_hdf5": (".h5", lambda path, x, y: _write_hdf5(path, {"x": x, "y": y})),
    "cosmoflow_numpy": (".npz", lambda path, x, y: _write_npz(path, {"x": x, "y": y})),
}


def cosmoflow_universes(
    out_dir: Path, data_format: str, seed: int = 0, train_samples: int = 2048, val_samples: int = 512, size: int = 128
) -> None:
    """Synthetic CosmoFlow cubes, one file per sample, in the real layout of ``data_format``."""
    suffix, write = COSMOFLOW_WRITERS[data_format]
    for split_index, (split, count) in enumerate((("train", train_samples), ("val", val_samples))):
        directory = Path(out_dir) / VALIDATION_SPLITS[split]
        directory.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            x, y = cosmoflow_universe(np.random.default_rng([seed, split_index, index]), size)
            write(directory / f"univ_synthetic_{index:05d}{suffix}", x, y)


# -- DeepCAM ---------------------------------------------------------------------------------
# The 16 CAM5 variables of the DeepCAM data, in file order, with a typical value and spread
# of each (so that the stats.h5 min-max normalisation has real work to do).
DEEPCAM_CHANNELS = (
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
_CHANNEL = {name: index for index, (name, _, _) in enumerate(DEEPCAM_CHANNELS)}
BACKGROUND, CYCLONE, RIVER = 0, 1, 2


def _smooth_map(rng: np.random.Generator, height: int, width: int, length: float) -> np.ndarray:
    noise = rng.standard_normal((height, width))
    ky = np.fft.fftfreq(height)[:, None] * 2 * np.pi
    kx = np.fft.fftfreq(width)[None, :] * 2 * np.pi
    field = np.fft.ifft2(np.fft.fft2(noise) * np.exp(-0.5 * (ky**2 + kx**2) * length**2)).real
    return (field - field.mean()) / field.std()


def _weather_background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth random weather on every channel, in standard units (height, width, 16)."""
    scale = min(height, width)
    fields = np.stack([_smooth_map(rng, height, width, length=scale / 8) for _ in DEEPCAM_CHANNELS], axis=-1)
    return fields + 0.3 * rng.standard_normal(fields.shape)


def _add_river(rng: np.random.Generator, fields: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
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
    fields[..., _CHANNEL["TMQ"]] += 3.0 * inside
    fields[..., _CHANNEL["QREFHT"]] += 1.5 * inside
    fields[..., _CHANNEL["U850"]] += 2.0 * inside
    fields[..., _CHANNEL["PRECT"]] += 1.0 * inside
    return inside


def _add_cyclone(rng: np.random.Generator, fields: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Draw one tropical cyclone into ``fields`` (a disc of low pressure with a vortex, heavy rain and
    moisture); return its pixel mask."""
    height, width = rows.shape
    centre_row, centre_col = rng.uniform(0.15, 0.85) * height, rng.uniform(0.1, 0.9) * width
    radius = rng.uniform(0.08, 0.12) * min(height, width)
    distance = np.hypot(rows - centre_row, cols - centre_col)
    inside = distance < radius
    profile = inside * (1.0 - 0.5 * (distance / radius) ** 2)
    fields[..., _CHANNEL["PSL"]] -= 3.0 * profile
    fields[..., _CHANNEL["PS"]] -= 3.0 * profile
    fields[..., _CHANNEL["PRECT"]] += 2.0 * profile
    fields[..., _CHANNEL["TMQ"]] += 2.0 * profile
    # Counter-clockwise vortex: tangential wind, strongest near the edge of the disc.
    tangential = 3.0 * inside * distance / radius
    with np.errstate(invalid="ignore", divide="ignore"):
        unit_row = np.where(distance > 0, (rows - centre_row) / distance, 0.0)
        unit_col = np.where(distance > 0, (cols - centre_col) / distance, 0.0)
    for u, v in (("U850", "V850"), ("UBOT", "VBOT")):
        fields[..., _CHANNEL[u]] -= tangential * unit_row
        fields[..., _CHANNEL[v]] += tangential * unit_col
    return inside


def _physical_units(fields: np.ndarray) -> np.ndarray:
    typical = np.array([value for _, value, _ in DEEPCAM_CHANNELS])
    spread = np.array([value for _, _, value in DEEPCAM_CHANNELS])
    return (typical + spread * fields).astype(np.float32)


def deepcam_snapshot(rng: np.random.Generator, height: int, width: int, cyclones: int, rivers: int):
    """One sample: float32 climate fields (height, width, 16) and uint8 labels (height, width).

    Smooth random weather on every channel, plus ``rivers`` atmospheric rivers (long curved
    bands of high water vapour with wind along them, label 2) and ``cyclones`` tropical
    cyclones (discs of low pressure with a vortex, heavy rain and moisture, label 1, drawn
    over rivers). The event signatures are strong but share channels, so telling the two
    classes apart needs the combination of channels and the shape of the region.
    """
    fields = _weather_background(rng, height, width)
    labels = np.full((height, width), BACKGROUND, dtype=np.uint8)
    rows, cols = np.mgrid[0:height, 0:width].astype(np.float64)
    for _ in range(rivers):
        labels[_add_river(rng, fields, rows, cols)] = RIVER
    for _ in range(cyclones):
        labels[_add_cyclone(rng, fields, rows, cols)] = CYCLONE
    return _physical_units(fields), labels


def _weather_samples(
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
    minimum = np.full(len(DEEPCAM_CHANNELS), np.inf)
    maximum = np.full(len(DEEPCAM_CHANNELS), -np.inf)
    samples = _weather_samples(out_dir, VALIDATION_SPLITS, seed, train_samples, val_samples, max_cyclones, max_rivers)
    for split, directory, index, rng, cyclones, rivers in samples:
        data, labels = deepcam_snapshot(rng, height, width, cyclones, rivers)
        if split == "train":
            minimum = np.minimum(minimum, data.min(axis=(0, 1)))
            maximum = np.maximum(maximum, data.max(axis=(0, 1)))
        _write_hdf5(directory / f"data-synthetic-{index:05d}.h5", {"climate/data": data, "climate/labels_0": labels})
    _write_hdf5(
        Path(out_dir) / STATS_FILE,
        {"climate/minval": minimum.astype(np.float32), "climate/maxval": maximum.astype(np.float32)},
    )


# -- Extreme weather (HPC AI500) ---------------------------------------------------------
# Class ids of the extreme_weather_hdf5 format (0 is the detector's background).
TROPICAL_CYCLONE = EXTREME_WEATHER_CLASSES.index("tropical_cyclone") + 1
ATMOSPHERIC_RIVER = EXTREME_WEATHER_CLASSES.index("atmospheric_river") + 1
# The DeepCAM-ordered fields of the event drawings, in the ExtremeWeather channel order.
_EXTREME_WEATHER_ORDER = [_CHANNEL[name] for name in EXTREME_WEATHER_CHANNELS]


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
    fields = _weather_background(rng, height, width)
    rows, cols = np.mgrid[0:height, 0:width].astype(np.float64)
    boxes, labels = [], []
    events = [(_add_river, ATMOSPHERIC_RIVER)] * rivers + [(_add_cyclone, TROPICAL_CYCLONE)] * cyclones
    for draw, label in events:
        mask = draw(rng, fields, rows, cols)
        if mask.any():
            boxes.append(_bounding_box(mask))
            labels.append(label)
    images = np.moveaxis(_physical_units(fields)[..., _EXTREME_WEATHER_ORDER], -1, 0)
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
    samples = _weather_samples(out_dir, VALIDATION_SPLITS, seed, train_samples, val_samples, max_cyclones, max_rivers)
    for split, directory, index, rng, cyclones, rivers in samples:
        images, boxes, labels = extreme_weather_snapshot(rng, height, width, cyclones, rivers)
        if split == "train":
            values = images.reshape(channels, -1).astype(np.float64)
            total += values.sum(axis=1)
            total_squares += (values**2).sum(axis=1)
            pixels += values.shape[1]
        _write_hdf5(
            directory / f"extreme-weather-synthetic-{index:05d}.h5",
            {"images": images, "boxes": boxes, "labels": labels},
        )
    mean = total / pixels
    std = np.sqrt(np.maximum(total_squares / pixels - mean**2, 0.0))
    _write_hdf5(
        Path(out_dir) / STATS_FILE,
        {"images/mean": mean.astype(np.float32), "images/std": std.astype(np.float32)},
    )
