"""Synthetic CosmoFlow universes in each of its formats, a deterministic function of the options and seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlcampaign.data.formats import write_hdf5, write_npz
from mlcampaign.data.tfrecord import encode_example, write_records
from mlcampaign.plan.registry import MLPERF_HPC_SPLITS


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


COSMOFLOW_WRITERS = {
    "cosmoflow_tfrecord": (
        ".tfrecord",
        lambda path, x, y: write_records(path, [encode_example({"x": x.tobytes(), "y": y})], compress=True),
    ),
    "cosmoflow_hdf5": (".h5", lambda path, x, y: write_hdf5(path, {"x": x, "y": y})),
    "cosmoflow_numpy": (".npz", lambda path, x, y: write_npz(path, {"x": x, "y": y})),
}


def cosmoflow_universes(
    out_dir: Path, data_format: str, seed: int = 0, train_samples: int = 2048, val_samples: int = 512, size: int = 128
) -> None:
    """Synthetic CosmoFlow cubes, one file per sample, in the real layout of ``data_format``."""
    suffix, write = COSMOFLOW_WRITERS[data_format]
    for split_index, (split, count) in enumerate((("train", train_samples), ("val", val_samples))):
        directory = Path(out_dir) / MLPERF_HPC_SPLITS[split]
        directory.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            x, y = cosmoflow_universe(np.random.default_rng([seed, split_index, index]), size)
            write(directory / f"univ_synthetic_{index:05d}{suffix}", x, y)
