"""Launch commands from the system config: one table for python, torchrun, srun and mpirun."""

import shlex
import subprocess

import pytest

from mlcampaign.launch import (
    check_layout,
    job_resources,
    launch_argv,
    launch_command,
    threads_per_process,
    trial_runtime,
)

PYTHON = "/opt/my env/bin/python"  # a space, to check the quoting


def system(launcher: str, **extra) -> dict:
    return {
        "launcher": launcher,
        "device": "cpu",
        "cores_per_node": 128,
        "devices_per_node": 1,
        "memory_per_node_mb": 256000,
        "trial_time_limit_minutes": 30,
    } | extra


def trial(nodes: int, tasks_per_node: int) -> dict:
    return {"nodes": nodes, "tasks_per_node": tasks_per_node, "processes": nodes * tasks_per_node}


def test_python_launcher_runs_one_process_directly_and_several_through_torch_distributed_run():
    assert launch_argv(system("python"), trial(1, 1), PYTHON) == [PYTHON]
    assert launch_argv(system("python"), trial(1, 2), PYTHON) == [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=2",
    ]


def test_torchrun_always_uses_the_environments_torch_distributed_run():
    argv = launch_argv(system("torchrun"), trial(1, 4), PYTHON)
    assert argv[:3] == [PYTHON, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in argv
    assert launch_argv(system("torchrun"), trial(1, 1), PYTHON)[-1] == "--nproc-per-node=1"


def test_srun_starts_one_task_per_process_with_its_cores_then_python():
    argv = launch_argv(system("srun"), trial(2, 16), PYTHON)
    assert argv == [
        "srun",
        "--nodes=2",
        "--ntasks=32",
        "--ntasks-per-node=16",
        "--cpus-per-task=8",
        "--kill-on-bad-exit=1",
        PYTHON,
    ]


def test_mpirun_places_ranks_per_node_with_their_cores():
    argv = launch_argv(system("mpirun", threads_per_process=4), trial(4, 8), PYTHON)
    assert argv == ["mpirun", "-np", "32", "--map-by", "ppr:8:node:PE=4", PYTHON]


def test_command_quotes_every_word_but_the_interpreter_expansion():
    command = launch_command(system("srun"), trial(1, 2), '"$MLCAMPAIGN_PYTHON"')
    assert command.endswith(' "$MLCAMPAIGN_PYTHON"')
    words = subprocess.run(
        ["bash", "-c", f'MLCAMPAIGN_PYTHON={shlex.quote(PYTHON)}; printf "%s\\n" {command}'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert words == launch_argv(system("srun"), trial(1, 2), PYTHON)


def test_threads_default_to_an_even_share_of_the_cores():
    assert threads_per_process(system("python", cores_per_node=2), 1) == 2
    assert threads_per_process(system("python", cores_per_node=2), 2) == 1
    assert threads_per_process(system("python", cores_per_node=2, threads_per_process=1), 1) == 1


@pytest.mark.parametrize(
    ("the_system", "nodes", "tasks", "backend", "message"),
    [
        (system("python"), 2, 1, "native", "launcher 'python' starts processes on one node"),
        (system("torchrun"), 2, 4, "native", "launcher 'torchrun' starts processes on one node"),
        (system("srun", device="cuda", devices_per_node=4), 1, 8, "native", "only 4 devices per node"),
        (system("python", cores_per_node=2, threads_per_process=2), 1, 2, "native", "exceed cores_per_node 2"),
        (system("python"), 1, 2, "horovod", "Horovod ranks need an MPI launcher"),
    ],
)
def test_layouts_a_launcher_cannot_run_are_refused(the_system, nodes, tasks, backend, message):
    with pytest.raises(ValueError, match=message):
        check_layout(the_system, nodes, tasks, backend)


def test_runnable_layouts_pass():
    check_layout(system("srun"), 4, 8, "horovod")
    check_layout(system("python"), 1, 1, "horovod")  # one Horovod process needs no MPI
    check_layout(system("srun", device="cuda", devices_per_node=4), 2, 4, "native")


def test_job_resources_mark_multi_rank_mpi_jobs():
    assert job_resources(system("srun"), trial(2, 4)) == {
        "nodes": 2,
        "tasks": 8,
        "cpus_per_task": 32,
        "mpi": "srun",
        "gpu": 0,
        "mem_mb": 256000,
    }
    assert job_resources(system("srun"), trial(1, 1))["mpi"] == ""  # the executor's plugin refuses 1-task MPI jobs
    assert job_resources(system("python"), trial(1, 2))["mpi"] == ""


def test_gpu_jobs_hold_one_gpu_per_process():
    gpu_system = system("srun", device="cuda", devices_per_node=4, cores_per_node=40)
    resources = job_resources(gpu_system, trial(2, 4))
    assert (resources["gpu"], resources["tasks_per_gpu"], resources["cpus_per_task"]) == (8, 1, 10)


def test_runtime_grows_with_the_retry_attempt():
    assert [trial_runtime(system("srun"), attempt) for attempt in (1, 2, 3)] == [30, 60, 90]
