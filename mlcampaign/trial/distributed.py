"""One distributed initialisation for every launcher.

Each process of a trial learns its rank, the world size, its rank on its node and where rank 0
listens from the environment its launcher sets (checked in this order, because torchrun may run
inside an srun or mpirun allocation):

=============  ====================  ====================  ==========================  =====================
launcher       rank                  world size            local rank                  rank 0 at
=============  ====================  ====================  ==========================  =====================
torchrun       RANK                  WORLD_SIZE            LOCAL_RANK                  MASTER_ADDR:MASTER_PORT
horovodrun     HOROVOD_RANK          HOROVOD_SIZE          HOROVOD_LOCAL_RANK          see below
OpenMPI        OMPI_COMM_WORLD_RANK  OMPI_COMM_WORLD_SIZE  OMPI_COMM_WORLD_LOCAL_RANK  see below
MPICH / PMI    PMI_RANK              PMI_SIZE              MPI_LOCALRANKID             see below
Slurm srun     SLURM_PROCID          SLURM_STEP_NUM_TASKS  SLURM_LOCALID               first host of the step
none           0                     1                     0                           -
=============  ====================  ====================  ==========================  =====================

Slurm is recognised only inside a job step (SLURM_STEP_NUM_TASKS set): a batch script also sees
SLURM_PROCID=0 and the job's SLURM_NTASKS, but it is one process. horovodrun (its Gloo mode; in
its MPI mode mpirun's variables are set) comes before the MPI launchers, because it may run
inside an allocation too. Under horovodrun and the MPI launchers rank 0's address is MASTER_ADDR
if set, else the first host of the Slurm node list when the job runs under Slurm, else this host
when all ranks share one node. The port is MASTER_PORT if set, else one derived from the Slurm
job and step ids (so concurrent trials of one job differ), else 29500.

Horovod (``init_horovod``) is checked against the framework and the launcher before it starts:
a Horovod without the framework's extension, built against another version of the framework, or
without MPI where an MPI launcher started the ranks is refused with what is missing.

The torch process group uses gloo on CPUs and NCCL on NVIDIA GPUs; on AMD GPUs torch's ROCm
build provides RCCL under the same backend name "nccl".
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

DEFAULT_MASTER_PORT = 29500
TORCH_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "rocm": "nccl"}


class DistributedSetupError(RuntimeError):
    """The processes of a trial cannot form the planned group."""


class MissingModuleError(DistributedSetupError):
    """A selected backend needs a Python module that is not importable here."""


class MissingDeviceError(DistributedSetupError):
    """The system config names a device (a GPU) that this process cannot see: its environment cannot
    run the trial."""


@dataclasses.dataclass(frozen=True)
class ProcessLayout:
    """Where this process sits in its trial, as its launcher described it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str  # which launcher's variables were read

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# -- Slurm node lists -------------------------------------------------------------------------
def _split_top_level(text: str) -> list[str]:
    """Split ``a[1-2],b,c[3,5]`` at the commas outside brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part for part in parts if part]


def _expand_range_list(ranges: str, nodelist: str) -> list[str]:
    values = []
    for item in ranges.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not match:
            raise ValueError(f"Slurm node list {nodelist!r}: cannot read range {item!r}")
        first, last = match.group(1), match.group(2) or match.group(1)
        width = len(first)  # zero padding of the first bound is kept, as Slurm does
        values += [str(number).zfill(width) for number in range(int(first), int(last) + 1)]
    return values


def expand_hostlist(nodelist: str) -> list[str]:
    """Hosts of a Slurm node list such as ``gpu[01-03,07],login1`` or ``r[1-2]n[01-02]``, in order."""
    hosts = []
    for pattern in _split_top_level(nodelist.strip()):
        pieces = re.split(r"\[([^\]]*)\]", pattern)  # text, ranges, text, ranges, ..., text
        choices = [
            [piece] if index % 2 == 0 else _expand_range_list(piece, nodelist) for index, piece in enumerate(pieces)
        ]
        hosts += ["".join(combination) for combination in itertools.product(*choices)]
    return hosts


def slurm_hostnames(nodelist: str) -> list[str]:
    """Hosts of a Slurm node list: ``scontrol show hostnames`` where Slurm is installed, else parsed here."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        result = subprocess.run(
            [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60, check=False
        )
        if result.returncode == 0 and result.stdout.split():
            return result.stdout.split()
    return expand_hostlist(nodelist)


# -- environment of each launcher -------------------------------------------------------------
def _slurm_nodelist(env: Mapping[str, str]) -> str | None:
    return env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")


def _slurm_port(env: Mapping[str, str]) -> int:
    job, step = env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID", "0")
    if job and job.isdigit() and step.isdigit():
        return 20000 + (int(job) * 64 + int(step)) % 20000
    return DEFAULT_MASTER_PORT


def _master(env: Mapping[str, str], world_size: int, local_world_size: int) -> tuple[str, int]:
    """Rank 0's address for launchers that do not set MASTER_ADDR themselves."""
    port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else _slurm_port(env)
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"], port
    nodelist = _slurm_nodelist(env)
    if nodelist:
        return slurm_hostnames(nodelist)[0], port
    if local_world_size == world_size:
        return "127.0.0.1", port
    raise DistributedSetupError(
        f"{world_size} ranks over several nodes outside Slurm: set MASTER_ADDR to the host of rank 0 "
        "(and MASTER_PORT to a free port) in the launch environment"
    )


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise DistributedSetupError(f"environment variable {name}={env[name]!r} is not an integer") from None


def detect_layout(env: Mapping[str, str] | None = None) -> ProcessLayout:
    """This process's layout from the environment of its launcher (see the module docstring)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        return ProcessLayout(
            rank=_int(env, "RANK"),
            world_size=world,
            local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            local_world_size=_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", DEFAULT_MASTER_PORT)),
            source="torchrun",
        )
    rank_variables = {
        "horovodrun": ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
        "openmpi": (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        "pmi": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    }
    for source, (rank_var, size_var, local_rank_var, local_size_var) in rank_variables.items():
        if rank_var in env and size_var in env:
            world = _int(env, size_var)
            local_world = _int(env, local_size_var) if local_size_var in env else world
            return ProcessLayout(
                _int(env, rank_var),
                world,
                _int(env, local_rank_var) if local_rank_var in env else 0,
                local_world,
                *_master(env, world, local_world),
                source=source,
            )
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:
        world = _int(env, "SLURM_STEP_NUM_TASKS")
        nodelist = _slurm_nodelist(env)
        if not nodelist:
            raise DistributedSetupError("Slurm step without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST")
        # SLURM_STEP_TASKS_PER_NODE looks like "2(x3),1"; the first count is this layout's per-node size.
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE", str(world)).split("(")[0].split(",")[0]
        port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else _slurm_port(env)
        return ProcessLayout(
            rank=_int(env, "SLURM_PROCID"),
            world_size=world,
            local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            local_world_size=int(per_node) if per_node.isdigit() else world,
            master_addr=env.get("MASTER_ADDR") or slurm_hostnames(nodelist)[0],
            master_port=port,
            source="srun",
        )
    return ProcessLayout(0, 1, 0, 1, "127.0.0.1", DEFAULT_MASTER_PORT, source="single process")


def check_world_size(layout: ProcessLayout, planned: int) -> None:
    """The launcher started as many processes as the trial planned."""
    if layout.world_size != planned:
        raise DistributedSetupError(
            f"the trial plans {planned} processes but the launcher started {layout.world_size} "
            f"(read from the {layout.source} environment)"
        )


def require_module(name: str, purpose: str) -> ModuleType:
    """Import ``name`` or fail with a message naming the module and what needed it."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise MissingModuleError(
            f"{purpose} needs the Python module '{name}', which is not importable here ({error}); "
            "install it in the trial's environment or choose another backend"
        ) from error


# -- Horovod ----------------------------------------------------------------------------------
# Horovod's API per framework, and the key of horovod/metadata.json naming the version it was built against.
HOROVOD_APIS = {"torch": ("horovod.torch", "pytorch"), "tensorflow": ("horovod.tensorflow", "tensorflow")}
# Launchers whose ranks Horovod joins through MPI (horovodrun's Gloo mode gives them its own rendezvous).
MPI_RANK_SOURCES = ("openmpi", "pmi", "srun")


def _horovod_refusal(purpose: str, where: str, problem: str) -> MissingModuleError:
    return MissingModuleError(
        f"{purpose}: {where} {problem}; build Horovod for this environment (python envs/horovod/build.py) "
        "or choose backend 'native'"
    )


def init_horovod(framework: str, layout: ProcessLayout) -> ModuleType:
    """Horovod's API for ``framework`` (``horovod.torch`` or ``horovod.tensorflow``), initialised, after
    checking that it can run here. Refused before anything trains (MissingModuleError naming what is
    missing, so the record says ``unsupported``):

    - no Horovod, or one without this framework's extension (``import horovod.torch`` alone succeeds
      then, printing a warning, and its API lacks ``init``: the extension module is what is imported);
    - one built against another version of the framework than this environment's (its
      ``metadata.json``): Horovod itself only warns, and its extension then fails on the framework's
      C++ ABI or mid-training;
    - more than one rank started by srun or an MPI launcher, and a Horovod built without MPI: each
      rank would be a Horovod job of its own.
    """
    module_name, built_key = HOROVOD_APIS[framework]
    purpose = f"backend 'horovod' of framework {framework}"
    horovod = require_module("horovod", purpose)
    package = Path(horovod.__file__).parent
    where = f"Horovod {horovod.__version__} at {package}"
    framework_module = importlib.import_module(framework)
    try:
        built_against = json.loads((package / "metadata.json").read_text())
    except (OSError, ValueError) as error:
        problem = f"has no readable metadata.json ({error}), which names the {framework} it was built against"
        raise _horovod_refusal(purpose, where, problem) from error
    if built_key not in built_against:
        raise _horovod_refusal(purpose, where, f"was built without {framework} (metadata.json: {built_against})")
    if built_against[built_key] != framework_module.__version__:
        problem = (
            f"was built against {framework} {built_against[built_key]}, but this environment has "
            f"{framework} {framework_module.__version__}"
        )
        raise _horovod_refusal(purpose, where, problem)
    # TensorFlow reports an extension it cannot load as its NotFoundError, not as an ImportError.
    load_errors = (ImportError, OSError)
    if framework == "tensorflow":
        load_errors += (framework_module.errors.NotFoundError,)
    try:
        importlib.import_module(f"{module_name}.mpi_ops")
    except load_errors as error:
        problem = f"has no working {framework} extension ({type(error).__name__}: {error})"
        raise _horovod_refusal(purpose, where, problem) from error
    hvd = importlib.import_module(module_name)
    if layout.world_size > 1 and layout.source in MPI_RANK_SOURCES and not hvd.mpi_built():
        problem = (
            f"was built without MPI, so the {layout.world_size} ranks {layout.source} started cannot join one "
            "Horovod job (an MPI build: envs/horovod/build.py --mpi; without MPI, start them with horovodrun)"
        )
        raise _horovod_refusal(purpose, where, problem)
    if layout.world_size > 1 and layout.source not in (*MPI_RANK_SOURCES, "horovodrun"):
        raise DistributedSetupError(
            f"{purpose}: Horovod joins ranks started by horovodrun or an MPI launcher, not by {layout.source}"
        )
    hvd.init()
    if (hvd.rank(), hvd.size()) != (layout.rank, layout.world_size):
        raise DistributedSetupError(
            f"Horovod sees rank {hvd.rank()} of {hvd.size()}, the launcher ({layout.source}) rank "
            f"{layout.rank} of {layout.world_size}"
        )
    return hvd


# -- torch ------------------------------------------------------------------------------------
def torch_device(device_kind: str, layout: ProcessLayout):
    """The torch device of this process: its node-local GPU, or the CPU."""
    import torch

    if device_kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise MissingDeviceError(f"the system config says device '{device_kind}' but torch sees no GPU")
    if layout.local_rank >= torch.cuda.device_count():
        raise MissingDeviceError(
            f"local rank {layout.local_rank} has no GPU: torch sees {torch.cuda.device_count()} on this node"
        )
    device = torch.device("cuda", layout.local_rank)
    torch.cuda.set_device(device)
    return device


def init_torch_process_group(layout: ProcessLayout, device_kind: str, device) -> str | None:
    """Join the trial's torch process group (none for one process); return the backend name."""
    if layout.world_size == 1:
        return None
    import torch.distributed as dist

    backend = TORCH_BACKENDS[device_kind]
    dist.init_process_group(
        backend,
        init_method=f"tcp://{layout.master_addr}:{layout.master_port}",
        rank=layout.rank,
        world_size=layout.world_size,
        device_id=device if device.type == "cuda" else None,
    )
    return backend


class Rendezvous:
    """A key-value store hosted by rank 0 (torch's TCPStore), for frameworks without their own.

    The TensorFlow path uses it to exchange worker addresses before its collectives exist and to
    gather per-rank results afterwards.
    """

    def __init__(self, layout: ProcessLayout, timeout_s: float = 600):
        import datetime

        import torch.distributed as dist

        self.layout = layout
        self.store = dist.TCPStore(
            layout.master_addr,
            layout.master_port,
            layout.world_size,
            is_master=layout.is_main,
            timeout=datetime.timedelta(seconds=timeout_s),
        )

    def all_gather(self, key: str, value: str) -> list[str]:
        """Every rank's ``value`` for ``key``, in rank order."""
        self.store.set(f"{key}/{self.layout.rank}", value)
        values = [self.store.get(f"{key}/{rank}").decode() for rank in range(self.layout.world_size)]
        # Rank 0 hosts the store: it leaves only after every rank has read what it needs.
        self.store.set(f"{key}/read/{self.layout.rank}", "1")
        if self.layout.is_main:
            self.store.wait([f"{key}/read/{rank}" for rank in range(self.layout.world_size)])
        return values


def node_address(layout: ProcessLayout) -> str:
    """How other ranks reach this process: loopback when all ranks share a node, else the host name."""
    return "127.0.0.1" if layout.local_world_size == layout.world_size else socket.gethostname()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
