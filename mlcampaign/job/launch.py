"""Launch commands: how a system's launcher starts the processes of one trial.

A system config names its launcher; a trial names its layout (nodes x tasks per node) and its
backend. One table, ``mlcampaign.plan.launchers.LAUNCHERS``, turns the three into the command that
precedes the trial program, so every system and benchmark shares one rule:

    [site set-up] <launch command> [launcher flags] [container] python -m mlcampaign.trial --spec-file ...

The trial program is the package's own entry point (mlcampaign/trial/__main__.py), so a trial runs the
package the job imported: from a source checkout of the workflow (on ``PYTHONPATH``, as
``trial_environment`` sets it, and bound into a container), or an installed copy.

Horovod's ranks thus join through horovodrun's Gloo rendezvous on one node (no MPI needed), and
through MPI where srun or mpirun start them, which needs a Horovod built with MPI
(``envs/horovod/build.py --mpi``; ``mlcampaign.trial.distributed.init_horovod`` refuses one without).
Each process then finds its rank from its launcher's environment (``mlcampaign.trial.distributed``).

A system's site set-up is data too (mlcampaign/plan/schemas/system.schema.yaml, docs/sites.md), applied
here and nowhere else:

- ``launcher_flags`` follow the launcher's own options (e.g. srun ``--hint=nomultithread``);
- ``container`` runs the trial in an Apptainer / Singularity image (``exec``, with ``--nv`` or
  ``--rocm`` for the system's GPUs): around each rank's program where srun or mpirun start the
  ranks, around the whole launch where the launcher runs inside the image (torchrun, horovodrun,
  one process). On Kubernetes the image is the pod's (the EIDF executor takes it from the job's
  ``container_image`` resource), so nothing wraps the command there;
- ``environment`` (modules, set-up lines, variables) runs in a shell that then ``exec``\\ s the
  launch, so that every rank inherits it; it also exports ``MLCAMPAIGN_THREADS`` (the trial's
  threads per process, for variables such as ``OMP_NUM_THREADS``) and, with a container,
  ``MLCAMPAIGN_CONTAINER_IMAGE`` (the image, which the record's provenance names:
  mlcampaign.measure.software_stack.container).

Where a job queues (``slurm``: partition, QoS, account, constraint, sbatch flags, memory) becomes
the job's resources (``job_resources``), never part of the command or of the trial's spec.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

from mlcampaign.measure.software_stack import CONTAINER_IMAGE_VARIABLE
from mlcampaign.plan.launchers import LAUNCHERS, runs_bare, threads_per_process
from mlcampaign.records.provenance import SOURCE_TREE

# The trial program after the launcher's interpreter (torch.distributed.run takes the same -m).
TRIAL_PROGRAM = ("-m", "mlcampaign.trial")


def trial_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a trial's launch: ``environ``, with the source checkout first on ``PYTHONPATH``
    (where the package is imported from one), so that ``python -m mlcampaign.trial`` runs this code."""
    environment = dict(environ)
    if SOURCE_TREE is not None:
        paths = [str(SOURCE_TREE), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
        environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return environment


# The flag that makes a container see the system's GPUs, per device type (Apptainer and Singularity
# spell them alike).
CONTAINER_GPU_FLAGS = {"cuda": "--nv", "rocm": "--rocm"}
# The interpreter inside a container unless container.python names another: the name Debian- and
# Ubuntu-based images (the NVIDIA and ROCm PyTorch images among them) all have.
CONTAINER_PYTHON = "python3"
# The variables the site set-up shell exports for the trial (module docstring).
THREADS_VARIABLE = "MLCAMPAIGN_THREADS"


def launch_argv(system: dict, trial: dict, python: str) -> list[str]:
    """The argv that starts the trial's processes, up to (not including) the trial program (``TRIAL_PROGRAM``):
    the launcher
    (with the system's launcher flags), inside the site set-up shell and the container where the
    system has them (module docstring). ``python`` is the interpreter of the job; a container's
    (``container.python``) or the set-up's (``environment.python``) replaces it."""
    container = system.get("container")
    wraps = container is not None and system["executor"] != "kubernetes"
    if wraps:
        interpreter = container.get("python", CONTAINER_PYTHON)
    else:
        interpreter = system.get("environment", {}).get("python", python)
    threads = threads_per_process(system, trial["tasks_per_node"])
    if runs_bare(system, trial["processes"]):
        argv = [*(_container_argv(system) if wraps else []), interpreter]
    else:
        launcher = LAUNCHERS[system["launcher"]]
        command = launcher.commands[trial["backend"]]
        values = {
            "python": interpreter,
            "nodes": trial["nodes"],
            "processes": trial["processes"],
            "tasks_per_node": trial["tasks_per_node"],
            "threads": threads,
        }
        argv = [part.format(**values) for part in command.argv] + list(system.get("launcher_flags", []))
        if not command.runs_program:
            argv.append(interpreter)
        if wraps:
            # A launcher that starts ranks through MPI/PMI runs on the host and starts the container per
            # rank; one that starts its processes itself runs inside the image with them.
            if launcher.mpi:
                argv[-1:-1] = _container_argv(system)
            else:
                argv = [*_container_argv(system), *argv]
    prelude = _setup_script(system, threads, container if wraps else None)
    return argv if prelude is None else ["/bin/bash", "-c", prelude, "mlcampaign-site-setup", *argv]


def _container_argv(system: dict) -> list[str]:
    """``apptainer exec`` (or singularity) with the GPU flag, the checkout and the system's binds, its
    options and the image."""
    container = system["container"]
    gpu = CONTAINER_GPU_FLAGS.get(system["device"])
    binds = [*([str(SOURCE_TREE)] if SOURCE_TREE else []), *container.get("bind", [])]
    return [
        container.get("runtime", "apptainer"),
        "exec",
        *([gpu] if gpu else []),
        *(part for path in binds for part in ("--bind", path)),
        *container.get("options", []),
        container["image"],
    ]


def _setup_script(system: dict, threads: int, container: dict | None) -> str | None:
    """The shell script of the system's environment set-up that ends by exec'ing the launch ("$@"), or
    None for a system without set-up or container. Modules load first, then the set-up lines (a venv or
    conda activation), then the variables (so they may name what both defined); the first failing step
    ends the launch, and the trial's log shows why."""
    environment = system.get("environment", {})
    if not (environment.get("modules") or environment.get("setup") or environment.get("variables") or container):
        return None
    lines = ["set -e", f"export {THREADS_VARIABLE}={threads}"]
    if environment.get("modules"):
        lines.append(shlex.join(["module", "load", *environment["modules"]]))
    lines += environment.get("setup", [])
    for name, value in environment.get("variables", {}).items():
        lines.append(f"export {name}={_double_quoted(str(value))}")
    if container is not None:
        lines.append(f"export {CONTAINER_IMAGE_VARIABLE}={shlex.quote(container['image'])}")
    lines.append('exec "$@"')
    return "\n".join(lines)


def _double_quoted(value: str) -> str:
    """``value`` in double quotes: the shell expands its variables ($SLURM_CPUS_PER_TASK), as in a job
    script, and nothing else splits or globs it."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
    return f'"{escaped}"'


class LaunchError(ValueError):
    """A trial cannot be submitted as its system config says (e.g. its budget code variable is unset)."""


def slurm_account(system: dict) -> str | None:
    """The budget code of the system's trial jobs: ``slurm.account``, or the value of the environment
    variable ``slurm.account_variable`` names (LaunchError naming the file and key if it is unset)."""
    slurm = system.get("slurm", {})
    variable = slurm.get("account_variable")
    if variable is None:
        return slurm.get("account")
    value = os.environ.get(variable)
    if not value:
        raise LaunchError(
            f"config/systems/{system['name']}.yaml: key 'slurm.account_variable': value '{variable}': the "
            f"environment variable is not set; export {variable}=<budget code> before submitting"
        )
    return value


def job_resources(system: dict, trial: dict) -> dict:
    """Snakemake resources of a trial job, named as the Slurm and Kubernetes executor plugins read them.

    ``mem_mb`` is per node (Slurm ``--mem``; ``slurm.memory_per_node_mb`` where the site allows less
    than the node's memory, 0: no request); ``runtime`` is in minutes and grows with the retry attempt
    (see ``trial_runtime``); partition, QoS, account, constraint (``-C``) and extra sbatch flags
    (``slurm_extra``) come from the system's ``slurm`` block, where it has one; ``container_image`` is
    a Kubernetes trial's pod image. Local runs ignore what they do not schedule on.
    """
    slurm = system.get("slurm", {})
    multi_rank_mpi = LAUNCHERS[system["launcher"]].mpi and trial["processes"] > 1
    gpus = 0 if system["device"] == "cpu" else trial["processes"]
    tasks_in_sbatch = slurm.get("tasks_in_sbatch", True)
    resources = {
        "nodes": trial["nodes"],
        "tasks": trial["processes"],
        # -1: the plugin names no CPUs per task (slurm.tasks_in_sbatch false).
        "cpus_per_task": threads_per_process(system, trial["tasks_per_node"]) if tasks_in_sbatch else -1,
        # The launcher named here starts the ranks inside the job; empty: not an MPI job (an MPI job's
        # sbatch names its tasks, which tasks_in_sbatch false leaves out).
        "mpi": system["launcher"] if multi_rank_mpi and tasks_in_sbatch else "",
        "gpu": gpus,
        "mem_mb": slurm.get("memory_per_node_mb", system["memory_per_node_mb"]),
    }
    if gpus:
        # One process per GPU. Without this the Slurm plugin asks for --ntasks-per-gpu=<tasks>; 0: none.
        resources["tasks_per_gpu"] = 1 if tasks_in_sbatch else 0
        if slurm.get("gpu_option") == "gres":
            # --gres=gpu:<per node> instead of --gpus=<per job>.
            resources["gpu"] = 0
            resources["gres"] = f"gpu:{trial['tasks_per_node']}"
    for resource, value in (
        ("slurm_partition", slurm.get("partition")),
        ("qos", slurm.get("qos")),
        ("slurm_account", slurm_account(system)),
        ("constraint", slurm.get("constraint")),
        ("slurm_extra", shlex.join(slurm["sbatch_flags"]) if slurm.get("sbatch_flags") else None),
    ):
        if value is not None:
            resources[resource] = value
    if system["executor"] == "kubernetes" and "container" in system:
        resources["container_image"] = system["container"]["image"]
    return resources


def trial_runtime(system: dict, attempt: int) -> int:
    """Job time limit in minutes: the system's per-trial limit, scaled by the retry attempt (1, 2, ...)."""
    return system["trial_time_limit_minutes"] * attempt
