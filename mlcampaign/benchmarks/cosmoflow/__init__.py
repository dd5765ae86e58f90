"""MLPerf HPC CosmoFlow: a 3D CNN regressing four cosmological parameters from dark-matter density cubes,
on its three dataset formats (gzip TFRecords as published, HDF5, NumPy), with synthetic universes."""

from mlcampaign.plan.registry import (
    MLPERF_HPC_SPLITS,
    Benchmark,
    DataFormat,
    Generator,
    GeneratorWork,
    MLPerfRules,
    Model,
)

OPTIONS = (
    "input_size",
    "base_filters",
    "n_conv_layers",
    "kernel_size",
    "fc1_size",
    "fc2_size",
    "dropout",
    "target_size",
)

BENCHMARK = Benchmark(
    models={
        "cosmoflow": Model(
            torch=f"{__name__}.model:SPEC",
            options=OPTIONS,
            quality_metrics=("mae",),
            keras=f"{__name__}.keras_model:SPEC",
            keras_options=OPTIONS,
            # "eval_error": the HPC rules' quality key, which mlperf-logging has no constant for.
            mlperf=MLPerfRules(
                "cosmoflow",
                "hpc",
                "3.0.0",
                "eval_error",
                f"{__name__}.mlperf:hyperparameters",
                0.124,
                reproduce=f"{__name__}.mlperf:reproduce_schedule",
            ),
            closed_form_flops=f"{__name__}.flop_check:closed_form_flops",
        )
    },
    data_formats={
        name: DataFormat(f"{__name__}.reader:{name}", MLPERF_HPC_SPLITS)
        for name in ("cosmoflow_tfrecord", "cosmoflow_hdf5", "cosmoflow_numpy")
    },
    generators={
        "cosmoflow_universes": Generator(
            f"{__name__}.generator:cosmoflow_universes",
            ("cosmoflow_tfrecord", "cosmoflow_hdf5", "cosmoflow_numpy"),
            GeneratorWork(lambda o: o["train_samples"] + o["val_samples"], lambda o: 4 * o["size"] ** 3, 3e-6 / 4),
            takes_format=True,
        )
    },
)
