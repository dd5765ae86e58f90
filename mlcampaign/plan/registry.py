"""What the project can run and report, by name: benchmarks (their models, dataset formats and dataset
generators), precisions and failure reasons.

A benchmark is one folder of ``mlcampaign/benchmarks/`` whose ``__init__.py`` declares it:
``BENCHMARK = Benchmark(models=..., data_formats=..., generators=...)``. The registry finds the folders
and reads their declarations (``benchmark_folders``); a declaration is data (names, option names,
quality metrics, the cost of generating a sample) and names its implementations by dotted path
(``module:attribute``), which are imported only when used (``resolve``). So planning imports neither
torch nor Keras, and adding a benchmark touches its folder and a ``config/benchmarks/*.yaml`` only.
Finding the folders by name is the one place where this layer names a layer above it: a plug-in
lookup, as entry points are (tests/unit/test_layers.py checks that a declaration imports nothing but
this module).

The config schemas take their enums from here (``x-registry`` in ``mlcampaign/plan/schemas/*.yaml``;
mlcampaign.plan.config_files), so a name is declared once. ``tests/unit/plan/test_registry.py`` checks
each entry against its implementation (builder signatures, generator formats, reader paths).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

BENCHMARKS_PACKAGE = "mlcampaign.benchmarks"


def resolve(path: str) -> Any:
    """The attribute that ``module:attribute`` names (the module alone without a colon)."""
    module, _, attribute = path.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


@dataclasses.dataclass(frozen=True)
class MLPerfRules:
    """A model's benchmark in MLPerf's rules: its ``submission_benchmark`` name, the compliance checker's
    ``usage`` and ``ruleset``, the log key of its quality value, the function that gives its
    closed-division hyperparameter keys (``module:function``; mlcampaign.records.mlperf.trial_log calls it),
    the quality target its closed rules check (the ATLEAST_ONE_CHECK of the quality key in the ruleset's
    closed_<name>.yaml), and the function that carries a published submission's schedule and model settings
    over into a campaign (``module:function``, called with the reproduction's ``Settings`` and the
    submission's steps per epoch; mlcampaign.plan.reproduce; None: its submissions are not reproduced).
    The HPC rules check the target in the open division too (open_<name>.yaml): an open HPC run may change
    the model and the data, not the target.

    Everything benchmark-specific of MLPerf is in the benchmark's folder (its ``mlperf.py``), reached
    through these names: a new MLPerf benchmark is a folder and a config file."""

    name: str
    usage: str
    ruleset: str
    quality_key: str
    hyperparameters: str
    target: float
    reproduce: str | None = None

    @property
    def target_direction(self) -> str:
        """ "lower" for an error (eval_error), "higher" for an accuracy."""
        return "lower" if self.quality_key == "eval_error" else "higher"

    @property
    def target_text(self) -> str:
        """The target as the rules check it, e.g. "eval_error <= 0.124"."""
        return f"{self.quality_key} {'<=' if self.target_direction == 'lower' else '>='} {self.target:g}"


@dataclasses.dataclass(frozen=True)
class Model:
    torch: str  # module:attribute of its ModelSpec (mlcampaign.trial.torch.models)
    options: tuple[str, ...]  # keyword options of the torch builder (model.options in a benchmark file)
    quality_metrics: tuple[str, ...]  # what its evaluation returns (a benchmark's target.metric)
    keras: str | None = None  # module:attribute of its KerasSpec (mlcampaign.trial.keras.models); None: none
    keras_options: tuple[str, ...] = ()  # options of its Keras builder
    # ValueError for model options the Keras builder cannot honour beyond their names (imports no TensorFlow).
    check_keras_options: Callable[[dict], None] | None = None
    mlperf: MLPerfRules | None = None  # None: MLPerf has no rules for it
    # module:function -> (training, forward) FLOPs per sample of the full-size model from its published
    # architecture: the FLOP counter's cross-check (None: no closed form).
    closed_form_flops: str | None = None

    def spec(self):
        return resolve(self.torch)

    def keras_spec(self):
        return resolve(self.keras)


# The split directories of the MLPerf HPC datasets (CosmoFlow, DeepCAM; the extreme-weather set follows them).
MLPERF_HPC_SPLITS = {"train": "train", "val": "validation"}


@dataclasses.dataclass(frozen=True)
class DataFormat:
    reader: str  # (root, split, sample_shape, **reader_options) -> torch Dataset
    split_dirs: dict[str, str]  # split ("train", "val") -> its directory under the dataset root
    shared_files: tuple[str, ...] = ()  # files outside the splits that every subset keeps (statistics)

    def open_split(self, *args, **options):
        return resolve(self.reader)(*args, **options)


@dataclasses.dataclass(frozen=True)
class GeneratorWork:
    """The work of generating a dataset, for its staging job's time limit and memory (mlcampaign.data.cost)."""

    samples: Callable[[dict], int]  # samples written, from the generator's options
    values_per_sample: Callable[[dict], int]  # float32 values of one sample (channels x voxels or pixels)
    seconds_per_value: float  # measured on the development machine (mlcampaign.data.cost says how)


@dataclasses.dataclass(frozen=True)
class Generator:
    writer: str  # (out_dir, [data_format,] **options) -> None
    formats: tuple[str, ...]  # the dataset formats it writes
    work: GeneratorWork
    takes_format: bool = False  # the writer's second argument is the format (it writes several)

    def write(self, out_dir, data_format: str, **options) -> None:
        writer = resolve(self.writer)
        writer(out_dir, data_format, **options) if self.takes_format else writer(out_dir, **options)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One benchmark folder's declaration: what it adds to the registries, by name."""

    models: dict[str, Model]
    data_formats: dict[str, DataFormat] = dataclasses.field(default_factory=dict)
    generators: dict[str, Generator] = dataclasses.field(default_factory=dict)


@functools.cache
def benchmark_folders() -> dict[str, Benchmark]:
    """Every benchmark folder's declaration, by folder name."""
    package = importlib.import_module(BENCHMARKS_PACKAGE)
    folders = {}
    for entry in sorted(pkgutil.iter_modules(package.__path__), key=lambda entry: entry.name):
        if entry.ispkg:
            declaration = getattr(importlib.import_module(f"{BENCHMARKS_PACKAGE}.{entry.name}"), "BENCHMARK", None)
            if not isinstance(declaration, Benchmark):
                raise TypeError(f"{BENCHMARKS_PACKAGE}.{entry.name} declares no BENCHMARK = Benchmark(...)")
            folders[entry.name] = declaration
    return folders


def _declared(kind: str) -> dict[str, Any]:
    """The entries of one kind (models, data_formats, generators) of every folder; a name declared by two
    folders is refused, naming both."""
    merged, owner = {}, {}
    for folder, declaration in benchmark_folders().items():
        for name, entry in getattr(declaration, kind).items():
            if name in merged:
                raise ValueError(f"{kind} '{name}' is declared by benchmark folders {owner[name]} and {folder}")
            merged[name], owner[name] = entry, folder
    return merged


@functools.cache
def models() -> dict[str, Model]:
    return _declared("models")


@functools.cache
def data_formats() -> dict[str, DataFormat]:
    return _declared("data_formats")


@functools.cache
def generators() -> dict[str, Generator]:
    return _declared("generators")


def mlperf_rules(benchmark: Mapping, usage: str | None = None) -> MLPerfRules | None:
    """The MLPerf benchmark a benchmark config is: its model's rules (every ResNet-50 variant is MLPerf's
    "resnet", whatever its dataset), where ``usage`` is given only those of that ruleset ("hpc",
    "training"); None where MLPerf has no rules for it or the registry has no such model (a stored run's
    config may name one that was removed)."""
    model = models().get(benchmark.get("model", {}).get("name"))
    rules = model.mlperf if model is not None else None
    return rules if rules is not None and usage in (None, rules.usage) else None


def mlperf_models(usage: str, name: str) -> dict[str, Model]:
    """The registered models that are MLPerf benchmark ``name`` of the ``usage`` rules (e.g. "hpc", "deepcam")."""
    return {
        model_name: model
        for model_name, model in models().items()
        if model.mlperf is not None and model.mlperf.usage == usage and model.mlperf.name == name
    }


@dataclasses.dataclass(frozen=True)
class Precision:
    """A numeric precision of a trial: its dtype in each framework, and what the trial does with it."""

    torch_dtype: str  # attribute of the torch module (torch.bfloat16)
    keras_policy: str  # keras.mixed_precision policy name
    autocast: bool  # torch trains under autocast to this dtype (fp32 needs none)
    compresses_gradients: bool  # a gradient all-reduce can be cast to it (the matrix's compressions)


PRECISIONS = {
    "fp32": Precision("float32", "float32", autocast=False, compresses_gradients=False),
    "bf16": Precision("bfloat16", "mixed_bfloat16", autocast=True, compresses_gradients=True),
    "fp16": Precision("float16", "mixed_float16", autocast=True, compresses_gradients=True),
}
# A gradient all-reduce in the gradients' own dtype, or cast to a precision that compresses it.
NO_COMPRESSION = "none"
COMPRESSIONS = (NO_COMPRESSION, *(name for name, precision in PRECISIONS.items() if precision.compresses_gradients))


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
    """Raise ValueError naming the options that the model's builder in ``framework`` does not take, or
    that its Keras builder cannot honour."""
    model = models()[name]
    if framework != "torch" and model.keras is None:
        with_keras = sorted(n for n, m in models().items() if m.keras is not None)
        raise ValueError(f"no Keras implementation of model '{name}' (there are: {', '.join(with_keras)})")
    accepted = model.options if framework == "torch" else model.keras_options
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        builder = "torch" if framework == "torch" else "Keras"
        raise ValueError(
            f"the {builder} model '{name}' has no option(s) {unknown} (it takes: {', '.join(sorted(accepted))})"
        )
    if framework != "torch" and model.check_keras_options is not None:
        model.check_keras_options(options)
