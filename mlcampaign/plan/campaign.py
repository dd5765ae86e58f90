"""A campaign's plan: its trial matrix, cell ids and the (system, benchmark) pairs it runs.

``Campaign`` is a loaded, validated campaign (mlcampaign.plan.config.load_campaign): its systems and
benchmarks by name, and the matrix of scale x precision x compression x framework x backend x
seeded trial x replicate that it plans as jobs, one row per trial (``trial_matrix``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mlcampaign.plan.launchers import NO_LAUNCHER
from mlcampaign.plan.seeding import derive_seed

if TYPE_CHECKING:
    import pandas as pd  # imported where a table is built: trial processes read cell ids and settings only

# The coordinates that identify one trial (wildcards of the trial rule, index of the matrix).
TRIAL_KEYS = ["system", "benchmark", "cell", "trial", "replicate"]
# Keys of a system config that only say where its jobs are submitted (not part of a trial's spec):
# its site (the spec's run names the site it ran at) and its Slurm placement.
SCHEDULER_KEYS = ("site", "slurm")


@dataclasses.dataclass(frozen=True)
class Scale:
    """A process layout: ``nodes`` x ``tasks_per_node`` processes (one per device or MPI rank)."""

    nodes: int
    tasks_per_node: int

    @classmethod
    def parse(cls, text: str) -> Scale:
        nodes, tasks = text.split("x")
        return cls(int(nodes), int(tasks))

    @property
    def processes(self) -> int:
        return self.nodes * self.tasks_per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.tasks_per_node}"


# Matrix dimensions after scale and precision, with the value that leaves a dimension out of the
# cell id: campaigns that do not vary a dimension keep their cell names (and their results).
CELL_DEFAULTS = {"compression": "none", "framework": "torch", "backend": "native"}


# The cell of a (system, benchmark) pair that is not planned (Campaign.unplanned_cells), and the
# columns that say why.
UNPLANNED_CELL = "not planned"
UNPLANNED_COLUMNS = ["system", "benchmark", "cell", "expected_outcome", "detail", "source", "runnable"]


def runnable(system: dict) -> bool:
    """Whether this project can start trials on the system (its launcher is not ``none``)."""
    return system["launcher"] != NO_LAUNCHER


def expected_outcome(campaign_config: dict, system: str, benchmark: str) -> dict | None:
    """The ``expected_outcomes`` entry of a (system, benchmark) pair, if any."""
    return next(
        (
            entry
            for entry in campaign_config["expected_outcomes"]
            if (entry["system"], entry["benchmark"]) == (system, benchmark)
        ),
        None,
    )


def planned_pairs(campaign_config: dict, systems: Mapping[str, dict]) -> Iterator[tuple[str, str]]:
    """(system, benchmark) pairs planned as jobs: the system has a launcher and the pair no expected
    (published) outcome."""
    for system_name, system in systems.items():
        for benchmark in campaign_config["benchmarks"]:
            if runnable(system) and expected_outcome(campaign_config, system_name, benchmark) is None:
                yield system_name, benchmark


def compile_setting(training: Mapping) -> dict | None:
    """A benchmark's ``training.compile`` (torch.compile backend and mode) where enabled; None: eager."""
    setting = training.get("compile")
    return setting if setting and setting["enabled"] else None


def cell_id(
    scale: Scale,
    precision: str,
    compression: str,
    framework: str,
    backend: str,
    compiled: Mapping | None = None,
    channels_last: bool = False,
) -> str:
    """The path-safe name of one matrix cell of a (system, benchmark) pair.

    ``<scale>-<precision>``, then ``-grad_<dtype>`` for a compressed all-reduce, the framework
    when it is not torch and the backend when it is not native, ``-channels_last`` for a torch cell
    of a benchmark with ``training.channels_last`` (Keras cells are channels-last whatever it says),
    and ``-compile_<mode>`` for a benchmark whose training step is compiled (``compiled``: its
    ``compile_setting``; the torch.compile backend too where it is not inductor), e.g.
    ``1x2-bf16-grad_fp16``, ``2x4-fp32-tensorflow-horovod`` or
    ``1x1-fp32-channels_last-compile_max_autotune``: trials of another memory format or compiled
    ones never share a cell with the contiguous eager ones (up to 1.9x apart: bench/README.md), and
    contiguous eager cells keep their names.
    """
    parts = [str(scale), precision]
    if compression != CELL_DEFAULTS["compression"]:
        parts.append(f"grad_{compression}")
    if framework != CELL_DEFAULTS["framework"]:
        parts.append(framework)
    if backend != CELL_DEFAULTS["backend"]:
        parts.append(backend)
    if channels_last and framework == "torch":
        parts.append("channels_last")
    if compiled:
        words = [compiled["mode"]] if compiled["backend"] == "inductor" else [compiled["backend"], compiled["mode"]]
        parts.append("compile_" + "_".join(words).replace("-", "_"))
    return "-".join(parts)


# Settings of one invocation, not of the campaign: a run's manifest and the report leave them out.
INVOCATION_KEYS = ("run", "site", "other_sites", "rerun_failed")


@dataclasses.dataclass
class Campaign:
    config: dict
    systems: dict[str, dict]
    benchmarks: dict[str, dict]
    config_dir: Path

    @property
    def name(self) -> str:
        return self.config["campaign"]

    @property
    def described_config(self) -> dict:
        """The config without the settings of one invocation (INVOCATION_KEYS): what the run's manifest
        and the report describe, so that such a setting (rerun_failed=True) re-renders neither."""
        return {key: value for key, value in self.config.items() if key not in INVOCATION_KEYS}

    def expected_outcome(self, system: str, benchmark: str) -> dict | None:
        """The campaign's ``expected_outcomes`` entry of a (system, benchmark) pair, if any."""
        return expected_outcome(self.config, system, benchmark)

    def planned_pairs(self) -> Iterator[tuple[str, str]]:
        """(system, benchmark) pairs planned as jobs (``planned_pairs``)."""
        return planned_pairs(self.config, self.systems)

    def unplanned_cells(self, site: str | None = None) -> pd.DataFrame:
        """The (system, benchmark) pairs not planned as jobs, each with why: an expected outcome
        (published), a system this project cannot run (launcher none), or, given the ``site`` of a
        run, a system of another site. Their cell is UNPLANNED_CELL: an unplanned pair has no layout of
        this project (the study's may be unknown)."""
        planned = set(self.planned_pairs())
        rows = []
        for system_name, system in self.systems.items():
            for benchmark_name in self.benchmarks:
                if (system_name, benchmark_name) in planned:
                    if site is not None and system.get("site") != site:
                        rows.append(
                            {
                                "system": system_name,
                                "benchmark": benchmark_name,
                                "cell": UNPLANNED_CELL,
                                "expected_outcome": None,
                                "detail": f"runs at site {system['site']}",
                                "source": f"config/systems/{system_name}.yaml",
                                "runnable": True,
                            }
                        )
                    continue
                expected = self.expected_outcome(system_name, benchmark_name)
                rows.append(
                    {
                        "system": system_name,
                        "benchmark": benchmark_name,
                        "cell": UNPLANNED_CELL,
                        "expected_outcome": expected["outcome"] if expected else None,
                        "detail": (expected or {}).get("detail") or system.get("not_runnable_reason"),
                        "source": expected["source"] if expected else f"config/systems/{system_name}.yaml",
                        "runnable": runnable(system),
                    }
                )
        import pandas as pd

        return pd.DataFrame(rows, columns=UNPLANNED_COLUMNS)

    def trial_spec(self, trial: Mapping, run_id: str, site: str) -> dict:
        """Everything one trial needs (the trial job's spec): its matrix row (``trial``), the campaign's
        name and determinism, its run and site, its MLPerf log header settings, and its system and
        benchmark configs. The system's
        site and scheduler placement (``slurm``: partition, QoS, account) are left out: the trial never
        reads them, and where a job queues must not re-run a finished trial."""
        system = {key: value for key, value in self.systems[trial["system"]].items() if key not in SCHEDULER_KEYS}
        return {
            "campaign": self.name,
            "deterministic": self.config["deterministic"],
            "run": {"id": run_id, "site": site},
            "mlperf": self.config["mlperf"],
            "trial": dict(trial),
            "system": system,
            "benchmark": self.benchmarks[trial["benchmark"]],
        }

    def trials(self) -> Iterator[dict]:
        """Every planned trial, in a stable order."""
        for system_name, benchmark_name in self.planned_pairs():
            system = self.systems[system_name]
            matrix = benchmark_matrix(self.config, benchmark_name, system_name)
            training = self.benchmarks[benchmark_name]["training"]
            compiled, channels_last = compile_setting(training), training["channels_last"]
            for scale_text, precision, compression, framework, backend in itertools.product(
                matrix["scales"],
                matrix["precisions"],
                matrix["compressions"],
                matrix["frameworks"],
                matrix["backends"],
            ):
                scale = Scale.parse(scale_text)
                if compression != "none" and scale.processes == 1:
                    continue  # one process has no all-reduce to compress
                for trial, replicate in itertools.product(
                    range(self.config["trials"]), range(self.config["replicates"])
                ):
                    yield {
                        "system": system_name,
                        "benchmark": benchmark_name,
                        "cell": cell_id(scale, precision, compression, framework, backend, compiled, channels_last),
                        "trial": trial,
                        "replicate": replicate,
                        "nodes": scale.nodes,
                        "tasks_per_node": scale.tasks_per_node,
                        "processes": scale.processes,
                        "precision": precision,
                        "compression": compression,
                        "framework": framework,
                        "backend": backend,
                        "seed": derive_seed(self.config["seed"], benchmark_name, trial),
                        "executor": system["executor"],
                    }

    def trial_matrix(self) -> pd.DataFrame:
        """One row per planned trial, indexed by TRIAL_KEYS."""
        import pandas as pd

        return pd.DataFrame(list(self.trials())).set_index(TRIAL_KEYS, drop=False)


def benchmark_matrix(campaign_config: dict, benchmark: str, system: str | None = None) -> dict:
    """The campaign's matrix for one benchmark (on one system): ``matrix`` with its
    ``matrix_overrides`` entry applied, then the system's ``system_matrix_overrides`` entry and
    that entry's ``benchmarks`` entry."""
    matrix = campaign_config["matrix"] | campaign_config["matrix_overrides"].get(benchmark, {})
    per_system = dict(campaign_config["system_matrix_overrides"].get(system, {}))
    per_pair = per_system.pop("benchmarks", {}).get(benchmark, {})
    return matrix | per_system | per_pair
