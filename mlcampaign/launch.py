"""Launch commands: how a system's launcher starts the processes of one trial.

A system config names its launcher; a trial names its layout (nodes x tasks per node). One
table, ``LAUNCHERS``, turns the two into the command that precedes the trial script, so every
system and benchmark shares one rule:

    <launch command> scripts/run_trial.py --spec ...

- ``python``: the environment's interpreter for one process; for more, ``python -m
  torch.distributed.run --standalone`` on the local node (a free rendezvous port, so concurrent
  local trials do not collide). The local workstation's launcher, for 1 and N processes alike.
- ``torchrun``: ``python -m torch.distributed.run`` (what the ``torchrun`` script runs) with the
  environment's interpreter, one node; sites that launch GPUs per node with torchrun.
- ``srun``: one Slurm task per process, ``--cpus-per-task`` threads each; a failing rank ends the step.
- ``mpirun``: OpenMPI, ``ppr:<tasks per node>:node`` placement with ``PE=<threads>`` cores per rank.

Each process then finds its rank from its launcher's environment (``mlcampaign.distributed``).
"""

from __future__ import annotations

import dataclasses
import shlex


@dataclasses.dataclass(frozen=True)
class Launcher:
    argv: tuple[str, ...]  # filled with {python} {nodes} {processes} {tasks_per_node} {threads}
    runs_script: bool  # takes the script path itself (torch.distributed.run) instead of a program to run
    multi_node: bool
    mpi: bool  # starts ranks through MPI/PMI, as Horovod needs for more than one process


_TORCH_RUN = (
    "{python}",
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nnodes=1",
    "--nproc-per-node={tasks_per_node}",
)

LAUNCHERS = {
    "python": Launcher(_TORCH_RUN, runs_script=True, multi_node=False, mpi=False),
    "torchrun": Launcher(_TORCH_RUN, runs_script=True, multi_node=False, mpi=False),
    "srun": Launcher(
        (
            "srun",
            "--nodes={nodes}",
            "--ntasks={processes}",
            "--ntasks-per-node={tasks_per_node}",
            "--cpus-per-task={threads}",
            "--kill-on-bad-exit=1",
        ),
        runs_script=False,
        multi_node=True,
        mpi=True,
    ),
    "mpirun": Launcher(
        ("mpirun", "-np", "{processes}", "--map-by", "ppr:{tasks_per_node}:node:PE={threads}"),
        runs_script=False,
        multi_node=True,
        mpi=True,
    ),
}


def threads_per_process(system: dict, tasks_per_node: int) -> int:
    """Intra-op threads of each process: the system's ``threads_per_process``, else its cores shared evenly."""
    return system.get("threads_per_process") or max(1, system["cores_per_node"] // tasks_per_node)


def check_layout(system: dict, nodes: int, tasks_per_node: int, backend: str) -> None:
    """Raise ValueError (with the reason) if the system's launcher cannot run this layout."""
    launcher = LAUNCHERS[system["launcher"]]
    if nodes > 1 and not launcher.multi_node:
        raise ValueError(f"launcher '{system['launcher']}' starts processes on one node; use srun or mpirun")
    if system["device"] != "cpu" and tasks_per_node > system["devices_per_node"]:
        raise ValueError(f"{tasks_per_node} processes per node but only {system['devices_per_node']} devices per node")
    threads = threads_per_process(system, tasks_per_node)
    if threads * tasks_per_node > system["cores_per_node"]:
        raise ValueError(
            f"{tasks_per_node} processes x {threads} threads_per_process exceed cores_per_node "
            f"{system['cores_per_node']} (oversubscribed cores distort timings)"
        )
    if backend == "horovod" and nodes * tasks_per_node > 1 and not launcher.mpi:
        raise ValueError(f"Horovod ranks need an MPI launcher (srun or mpirun), not '{system['launcher']}'")


def launch_argv(system: dict, trial: dict, python: str) -> list[str]:
    """The argv that starts the trial's processes, up to (not including) the trial script."""
    name = system["launcher"]
    if name == "python" and trial["processes"] == 1:
        return [python]
    launcher = LAUNCHERS[name]
    values = {
        "python": python,
        "nodes": trial["nodes"],
        "processes": trial["processes"],
        "tasks_per_node": trial["tasks_per_node"],
        "threads": threads_per_process(system, trial["tasks_per_node"]),
    }
    argv = [part.format(**values) for part in launcher.argv]
    return argv if launcher.runs_script else [*argv, python]


# Stands for the interpreter in launch_argv's words until launch_command puts in its shell word.
_PYTHON = "<python>"


def launch_command(system: dict, trial: dict, python_word: str) -> str:
    """:func:`launch_argv` as shell text: each word quoted, except the interpreter's ``python_word``.

    ``python_word`` goes in as written, e.g. ``"$MLCAMPAIGN_PYTHON"``: the workflow expands the
    interpreter in the job's shell so that the command, a rule parameter, stays the same wherever
    the checkout and its environment live (a moved checkout re-runs no trial).
    """
    return " ".join(
        python_word if word == _PYTHON else shlex.quote(word) for word in launch_argv(system, trial, _PYTHON)
    )


def job_resources(system: dict, trial: dict) -> dict:
    """Snakemake resources of a trial job, named as the Slurm and Kubernetes executor plugins read them.

    ``mem_mb`` is per node (Slurm ``--mem``); ``runtime`` is in minutes and grows with the retry
    attempt (see ``trial_runtime``). Local runs ignore what they do not schedule on.
    """
    multi_rank_mpi = LAUNCHERS[system["launcher"]].mpi and trial["processes"] > 1
    gpus = 0 if system["device"] == "cpu" else trial["processes"]
    resources = {
        "nodes": trial["nodes"],
        "tasks": trial["processes"],
        "cpus_per_task": threads_per_process(system, trial["tasks_per_node"]),
        # The launcher named here starts the ranks inside the job; empty: not an MPI job.
        "mpi": system["launcher"] if multi_rank_mpi else "",
        "gpu": gpus,
        "mem_mb": system["memory_per_node_mb"],
    }
    if gpus:
        # One process per GPU. Without this the Slurm plugin asks for --ntasks-per-gpu=<tasks>.
        resources["tasks_per_gpu"] = 1
    return resources


def trial_runtime(system: dict, attempt: int) -> int:
    """Job time limit in minutes: the system's per-trial limit, scaled by the retry attempt (1, 2, ...)."""
    return system["trial_time_limit_minutes"] * attempt
