"""HPC AI500's extreme weather analytics: Faster R-CNN detection of weather events in CAM5 climate images
(the ExtremeWeather dataset's layout, HDF5), with synthetic images. MLPerf has no rules for it."""

from mlcampaign.benchmarks.climate import STATS_FILE
from mlcampaign.plan.registry import MLPERF_HPC_SPLITS, Benchmark, DataFormat, Generator, GeneratorWork, Model

BENCHMARK = Benchmark(
    models={
        "extreme_weather": Model(
            torch=f"{__name__}.model:SPEC",
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
            closed_form_flops=f"{__name__}.flop_check:closed_form_flops",
        )
    },
    data_formats={
        "extreme_weather_hdf5": DataFormat(
            f"{__name__}.reader:extreme_weather_hdf5", MLPERF_HPC_SPLITS, shared_files=(STATS_FILE,)
        )
    },
    generators={
        "extreme_weather_events": Generator(
            f"{__name__}.generator:extreme_weather_events",
            ("extreme_weather_hdf5",),
            GeneratorWork(
                lambda o: o["train_samples"] + o["val_samples"], lambda o: 16 * o["height"] * o["width"], 3.5e-6 / 16
            ),
        )
    },
)
