"""What the benchmarks' dataset formats share: the split folders of the MLPerf HPC datasets, a split's
one-file-per-sample listing, reproducible array and image files, and opening a split of a registered
format (mlcampaign.plan.registry.data_formats; each benchmark folder declares its formats and readers).

Files written here are a deterministic function of their arrays: no creation times, so that a
generator run twice yields byte-identical files and the same dataset id.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from mlcampaign.data.manifest import DatasetError
from mlcampaign.plan.registry import data_formats


def split_files(root: Path, directory: str, suffix: str) -> list[Path]:
    """The sample files of one split (one file per sample), sorted; DatasetError where there is none."""
    files = sorted((Path(root) / directory).glob(f"*{suffix}"))
    if not files:
        raise DatasetError(f"{Path(root) / directory}: no *{suffix} files")
    return files


def write_png(array: np.ndarray, path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, format="PNG", optimize=False)


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # numpy.savez stamps the current time into the zip entries; a fixed stamp keeps files reproducible.
    with zipfile.ZipFile(path, "w") as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())


def write_hdf5(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # No creation times (track_times, and no track_order, which timestamps the root group): equal arrays, equal bytes.
    import h5py

    with h5py.File(path, "w") as handle:
        for name, array in arrays.items():
            handle.create_dataset(name, data=array, track_times=False)


def open_split(data_format: str, root: Path, split: str, sample_shape: tuple[int, ...], options: dict | None = None):
    """A torch Dataset of one split of a staged dataset in a registered format."""
    return data_formats()[data_format].open_split(root, split, sample_shape, **(options or {}))
