"""The launchers a system may name, and the process layouts each can start: checked when a campaign is
planned (mlcampaign.plan.config), used when a trial is launched (mlcampaign.job.launch).

Each launcher turns a layout (nodes x tasks per node) and a backend into the command that precedes the
trial's program (its argv templates, filled with {python} {nodes} {processes} {tasks_per_node} {threads}):

- ``python``: the local workstation's launcher. One process is the environment's interpreter itself,
  whatever the backend. More: ``python -m torch.distributed.run --standalone`` on the local node (a free
  rendezvous port, so concurrent local trials do not collide) for backend native;
  ``python -m horovod.runner.launch -np N -H localhost:N --gloo`` (horovodrun) for backend horovod.
- ``torchrun``: sites that launch GPUs per node with torchrun: the same two commands on one node, for one
  process too.
- ``srun``: one Slurm task per process, ``--cpus-per-task`` threads each; a failing rank ends the step.
- ``mpirun``: OpenMPI, ``ppr:<tasks per node>:node`` placement with ``PE=<threads>`` cores per rank.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]  # filled with {python} {nodes} {processes} {tasks_per_node} {threads}
    runs_program: bool  # takes the program itself (torch.distributed.run) instead of an interpreter to run it


@dataclasses.dataclass(frozen=True)
class Launcher:
    commands: dict[str, Command]  # per backend
    multi_node: bool
    # Starts ranks through MPI/PMI (the Slurm job is an MPI job); such a launcher runs outside a
    # container and starts the container once per rank.
    mpi: bool


_TORCH_RUN = Command(
    ("{python}", "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node={tasks_per_node}"),
    runs_program=True,
)
# horovodrun with the environment's interpreter; Gloo, because MPI may not exist here.
_HOROVOD_RUN = Command(
    ("{python}", "-m", "horovod.runner.launch", "-np", "{processes}", "-H", "localhost:{processes}", "--gloo"),
    runs_program=False,
)
_SRUN = Command(
    (
        "srun",
        "--nodes={nodes}",
        "--ntasks={processes}",
        "--ntasks-per-node={tasks_per_node}",
        "--cpus-per-task={threads}",
        "--kill-on-bad-exit=1",
    ),
    runs_program=False,
)
_MPIRUN = Command(
    ("mpirun", "-np", "{processes}", "--map-by", "ppr:{tasks_per_node}:node:PE={threads}"), runs_program=False
)

# The launcher of a system this project has no way to start trials on (vendor stacks): its cells are
# listed, never planned as jobs.
NO_LAUNCHER = "none"
LAUNCHERS = {
    "python": Launcher({"native": _TORCH_RUN, "horovod": _HOROVOD_RUN}, multi_node=False, mpi=False),
    "torchrun": Launcher({"native": _TORCH_RUN, "horovod": _HOROVOD_RUN}, multi_node=False, mpi=False),
    "srun": Launcher({"native": _SRUN, "horovod": _SRUN}, multi_node=True, mpi=True),
    "mpirun": Launcher({"native": _MPIRUN, "horovod": _MPIRUN}, multi_node=True, mpi=True),
}


def threads_per_process(system: dict, tasks_per_node: int) -> int:
    """Intra-op threads of each process: the system's ``threads_per_process``, else its cores shared evenly."""
    return system.get("threads_per_process") or max(1, system["cores_per_node"] // tasks_per_node)


def runs_bare(system: dict, processes: int) -> bool:
    """Whether the trial's one process is the interpreter itself, with no launcher command around it."""
    return system["launcher"] == "python" and processes == 1


def check_layout(system: dict, nodes: int, tasks_per_node: int, backend: str) -> None:
    """Raise ValueError (with the reason) if the system's launcher cannot run this layout with ``backend``."""
    launcher = LAUNCHERS[system["launcher"]]
    if backend not in launcher.commands:
        raise ValueError(f"launcher '{system['launcher']}' cannot start the ranks of backend '{backend}'")
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
    if system.get("launcher_flags") and runs_bare(system, nodes * tasks_per_node):
        raise ValueError(
            f"launcher_flags {system['launcher_flags']}: launcher 'python' starts one process as the interpreter "
            "itself, with no launcher to take them (use torchrun, srun or mpirun, or drop launcher_flags)"
        )
