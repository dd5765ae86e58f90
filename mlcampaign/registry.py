"""What the project can run and report, by name: models, dataset formats, dataset generators, failure reasons.

Each registry entry names its implementation by dotted path (``module:attribute``) and carries the
facts that planning needs without importing it (torch is not imported while Snakemake plans a
campaign). The config schemas take their enums from here (``x-registry`` in
``config/schemas/*.yaml``; mlcampaign.schemas), so a name is declared once: adding a model, format
or generator is its implementation plus one entry below. ``tests/test_registry.py`` checks each
entry against its implementation (builder signatures, generator formats).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any


def resolve(path: str) -> Any:
    """The attribute that ``module:attribute`` names (the module alone without a colon)."""
    module, _, attribute = path.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


@dataclasses.dataclass(frozen=True)
class Model:
    module: str  # defines SPEC (mlcampaign.models.ModelSpec)
    options: tuple[str, ...]  # keyword options of the torch builder (model.options in a benchmark file)
    quality_metrics: tuple[str, ...]  # what its evaluation returns (a benchmark's target.metric)
    keras_options: tuple[str, ...] | None = None  # options of its Keras builder (mlcampaign.tf.models); None: none

    def spec(self):
        return resolve(self.module).SPEC


@dataclasses.dataclass(frozen=True)
class DataFormat:
    reader: str  # (root, split, sample_shape, **reader_options) -> torch Dataset
    split_dirs: dict[str, str]  # split ("train", "val") -> its directory under the dataset root
    shared_files: tuple[str, ...] = ()  # files outside the splits that every subset keeps (statistics)

    def open_split(self, *args, **options):
        return resolve(self.reader)(*args, **options)


@dataclasses.dataclass(frozen=True)
class Generator:
    writer: str  # (out_dir, [data_format,] **options) -> None
    formats: tuple[str, ...]  # the dataset formats it writes
    takes_format: bool = False  # the writer's second argument is the format (it writes several)

    def write(self, out_dir, data_format: str, **options) -> None:
        writer = resolve(self.writer)
        writer(out_dir, data_format, **options) if self.takes_format else writer(out_dir, **options)


_COSMOFLOW_OPTIONS = (
    "input_size",
    "base_filters",
    "n_conv_layers",
    "kernel_size",
    "fc1_size",
    "fc2_size",
    "dropout",
    "target_size",
)
MODELS = {
    "resnet50": Model(
        "mlcampaign.models.resnet",
        options=("num_classes", "image_size", "width_per_group", "zero_init_residual"),
        quality_metrics=("top1",),
        keras_options=("num_classes", "image_size", "width_per_group", "zero_init_residual"),
    ),
    "cosmoflow": Model(
        "mlcampaign.models.cosmoflow",
        options=_COSMOFLOW_OPTIONS,
        quality_metrics=("mae",),
        keras_options=_COSMOFLOW_OPTIONS,
    ),
    "deepcam": Model(
        "mlcampaign.models.deepcam",
        options=("in_channels", "num_classes", "image_height", "image_width", "width", "middle_blocks"),
        quality_metrics=("iou",),
    ),
    "extreme_weather": Model(
        "mlcampaign.models.extreme_weather",
        options=(
            "in_channels",
            "num_classes",
            "image_height",
            "image_width",
            "backbone",
            "stage_blocks",
            "fpn_channels",
            "representation_size",
            "anchor_sizes",
            "aspect_ratios",
            "rpn_pre_nms_top_n_train",
            "rpn_pre_nms_top_n_test",
            "rpn_post_nms_top_n_train",
            "rpn_post_nms_top_n_test",
            "box_batch_size_per_image",
            "box_detections_per_img",
        ),
        quality_metrics=("map50",),
    ),
}

# The split directories of the MLPerf HPC datasets, and the per-channel statistics file of the climate datasets.
VALIDATION_SPLITS = {"train": "train", "val": "validation"}
STATS_FILE = "stats.h5"
# The 16 CAM5 variables of the ExtremeWeather dataset (Racah et al. 2017), in its file order.
EXTREME_WEATHER_CHANNELS = (
    "PRECT", "PS", "PSL", "QREFHT", "T200", "T500", "TMQ", "TREFHT",
    "TS", "U850", "UBOT", "V850", "VBOT", "Z1000", "Z200", "ZBOT",
)  # fmt: skip
# Its event classes 0..3; the format stores class + 1 (torchvision detectors reserve 0 for background).
EXTREME_WEATHER_CLASSES = ("tropical_depression", "tropical_cyclone", "extratropical_cyclone", "atmospheric_river")
DATA_FORMATS = {
    "image_folder": DataFormat("mlcampaign.data.readers:image_folder", {"train": "train", "val": "val"}),
    "cosmoflow_tfrecord": DataFormat("mlcampaign.data.readers:cosmoflow_tfrecord", VALIDATION_SPLITS),
    "cosmoflow_hdf5": DataFormat("mlcampaign.data.readers:cosmoflow_hdf5", VALIDATION_SPLITS),
    "cosmoflow_numpy": DataFormat("mlcampaign.data.readers:cosmoflow_numpy", VALIDATION_SPLITS),
    "deepcam_hdf5": DataFormat("mlcampaign.data.readers:deepcam_hdf5", VALIDATION_SPLITS, shared_files=(STATS_FILE,)),
    "extreme_weather_hdf5": DataFormat(
        "mlcampaign.data.readers:extreme_weather_hdf5", VALIDATION_SPLITS, shared_files=(STATS_FILE,)
    ),
}

GENERATORS = {
    "sklearn_digits": Generator("mlcampaign.data.generators:sklearn_digits", ("image_folder",)),
    "synthetic_images": Generator("mlcampaign.data.generators:synthetic_images", ("image_folder",)),
    "cosmoflow_universes": Generator(
        "mlcampaign.data.generators:cosmoflow_universes",
        ("cosmoflow_tfrecord", "cosmoflow_hdf5", "cosmoflow_numpy"),
        takes_format=True,
    ),
    "deepcam_climate": Generator("mlcampaign.data.generators:deepcam_climate", ("deepcam_hdf5",)),
    "extreme_weather_events": Generator("mlcampaign.data.generators:extreme_weather_events", ("extreme_weather_hdf5",)),
}


# Why a trial failed (a record's failure.reason, a campaign's expected_outcomes), with its label in tables.
FAILURE_REASONS = {
    "out_of_memory": "out of memory",
    "compile_error": "compile error",
    "unsupported": "unsupported operation",
    "diverged": "diverged",
    "timeout": "timeout",
    "scheduler": "scheduler failure",
    "dataset": "dataset error",
    "error": "error",
}


def check_model_options(name: str, options: dict, framework: str) -> None:
    """Raise ValueError naming the options that the model's builder in ``framework`` does not take."""
    model = MODELS[name]
    accepted = model.options if framework == "torch" else model.keras_options
    if accepted is None:
        with_keras = sorted(n for n, m in MODELS.items() if m.keras_options is not None)
        raise ValueError(f"no Keras implementation of model '{name}' (there are: {', '.join(with_keras)})")
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        builder = "torch" if framework == "torch" else "Keras"
        raise ValueError(
            f"the {builder} model '{name}' has no option(s) {unknown} (it takes: {', '.join(sorted(accepted))})"
        )
