"""MLPerf HPC DeepCAM: DeepLabv3+ segmentation of extreme weather (tropical cyclones, atmospheric rivers)
in CAM5 climate snapshots stored as HDF5, with synthetic snapshots."""

from mlcampaign.benchmarks.climate import STATS_FILE
from mlcampaign.plan.registry import (
    MLPERF_HPC_SPLITS,
    Benchmark,
    DataFormat,
    Generator,
    GeneratorWork,
    MLPerfRules,
    Model,
)

BENCHMARK = Benchmark(
    models={
        "deepcam": Model(
            torch=f"{__name__}.model:SPEC",
            options=("in_channels", "num_classes", "image_height", "image_width", "width", "middle_blocks"),
            quality_metrics=("iou",),
            mlperf=MLPerfRules(
                "deepcam",
                "hpc",
                "3.0.0",
                "eval_accuracy",
                f"{__name__}.mlperf:hyperparameters",
                0.82,
                reproduce=f"{__name__}.mlperf:reproduce_schedule",
            ),
            closed_form_flops=f"{__name__}.flop_check:closed_form_flops",
        )
    },
    data_formats={
        "deepcam_hdf5": DataFormat(f"{__name__}.reader:deepcam_hdf5", MLPERF_HPC_SPLITS, shared_files=(STATS_FILE,))
    },
    generators={
        "deepcam_climate": Generator(
            f"{__name__}.generator:deepcam_climate",
            ("deepcam_hdf5",),
            GeneratorWork(
                lambda o: o["train_samples"] + o["val_samples"], lambda o: 16 * o["height"] * o["width"], 5.3e-6 / 16
            ),
        )
    },
)
