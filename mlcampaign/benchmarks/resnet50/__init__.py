"""ResNet-50 image classification (MLPerf training's ResNet-50 v1.5; HPC AI500's image benchmark) on
ImageNet-style class folders: real handwritten digits, synthetic images, or a staged copy of ImageNet."""

from mlcampaign.plan.registry import Benchmark, DataFormat, Generator, GeneratorWork, MLPerfRules, Model

OPTIONS = ("num_classes", "image_size", "width_per_group", "zero_init_residual")
KERAS_MIN_IMAGE_SIZE = 32  # keras.applications.ResNet50 refuses smaller inputs


def check_keras_options(options: dict) -> None:
    """keras.applications.ResNet50 has the standard bottleneck width and a minimum input size."""
    if options.get("width_per_group", 64) != 64:
        raise ValueError(
            f"keras.applications.ResNet50 has bottleneck width 64, not model option "
            f"width_per_group={options['width_per_group']} (override it to 64 for TensorFlow cells)"
        )
    if options.get("image_size", 224) < KERAS_MIN_IMAGE_SIZE:
        raise ValueError(f"keras.applications.ResNet50 needs image_size >= {KERAS_MIN_IMAGE_SIZE}")


BENCHMARK = Benchmark(
    models={
        "resnet50": Model(
            torch=f"{__name__}.model:SPEC",
            options=OPTIONS,
            quality_metrics=("top1",),
            keras=f"{__name__}.keras_model:SPEC",
            keras_options=OPTIONS,
            check_keras_options=check_keras_options,
            # The training rules 4.0.0: the newest training ruleset that still has ResNet-50 (4.1.0 dropped it).
            mlperf=MLPerfRules(
                "resnet", "training", "4.0.0", "eval_accuracy", f"{__name__}.mlperf:hyperparameters", 0.759
            ),
            closed_form_flops=f"{__name__}.flop_check:closed_form_flops",
        )
    },
    data_formats={"image_folder": DataFormat(f"{__name__}.reader:image_folder", {"train": "train", "val": "val"})},
    generators={
        # 1797 8 x 8 images shipped with scikit-learn: seconds whatever the options.
        "sklearn_digits": Generator(
            f"{__name__}.generator:sklearn_digits", ("image_folder",), GeneratorWork(lambda o: 1797, lambda o: 64, 6e-7)
        ),
        "synthetic_images": Generator(
            f"{__name__}.generator:synthetic_images",
            ("image_folder",),
            GeneratorWork(
                lambda o: o["num_classes"] * (o["train_per_class"] + o["val_per_class"]),
                lambda o: 3 * o["image_size"] ** 2,
                6e-7,
            ),
        ),
    },
)
