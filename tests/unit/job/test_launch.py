"""Launch commands from the system config: one table for python, torchrun, srun and mpirun, and the
site set-up (launcher flags, environment, container) and scheduler placement of a system."""

import shlex
import subprocess

import pytest

from mlcampaign.job.launch import job_resources, launch_argv, trial_runtime
from mlcampaign.plan import launchers
from mlcampaign.plan.launchers import check_layout, threads_per_process
from mlcampaign.plan.site_setup import check_site_setup
from mlcampaign.records.provenance import SOURCE_TREE

PYTHON = "/opt/my env/bin/python"  # a space, to check the quoting


def system(launcher: str, **extra) -> dict:
    return {
        "name": "test-system",
        "executor": "slurm",
        "launcher": launcher,
        "device": "cpu",
        "cores_per_node": 128,
        "devices_per_node": 1,
        "memory_per_node_mb": 256000,
        "trial_time_limit_minutes": 30,
    } | extra


def trial(nodes: int, tasks_per_node: int, backend: str = "native") -> dict:
    return {"nodes": nodes, "tasks_per_node": tasks_per_node, "processes": nodes * tasks_per_node, "backend": backend}


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


HOROVOD_RUN = [PYTHON, "-m", "horovod.runner.launch", "-np", "2", "-H", "localhost:2", "--gloo", PYTHON]


@pytest.mark.parametrize("launcher", ["python", "torchrun"])
def test_one_node_launchers_start_horovod_ranks_through_horovodrun(launcher):
    assert launch_argv(system(launcher), trial(1, 2, "horovod"), PYTHON) == HOROVOD_RUN


def test_one_horovod_process_needs_no_launcher():
    assert launch_argv(system("python"), trial(1, 1, "horovod"), PYTHON) == [PYTHON]


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_mpi_launchers_start_horovod_ranks_as_they_start_any(launcher):
    horovod = launch_argv(system(launcher), trial(2, 4, "horovod"), PYTHON)
    assert horovod == launch_argv(system(launcher), trial(2, 4), PYTHON)
    assert horovod[0] == launcher


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
        (system("python"), 2, 2, "horovod", "launcher 'python' starts processes on one node"),
    ],
)
def test_layouts_a_launcher_cannot_run_are_refused(the_system, nodes, tasks, backend, message):
    with pytest.raises(ValueError, match=message):
        check_layout(the_system, nodes, tasks, backend)


def test_a_launcher_without_a_command_for_the_backend_is_refused(monkeypatch):
    native_only = launchers.Launcher(
        {"native": launchers.LAUNCHERS["srun"].commands["native"]}, multi_node=True, mpi=True
    )
    monkeypatch.setitem(launchers.LAUNCHERS, "native-only", native_only)
    check_layout(system("native-only"), 2, 4, "native")
    with pytest.raises(ValueError, match="launcher 'native-only' cannot start the ranks of backend 'horovod'"):
        check_layout(system("native-only"), 1, 1, "horovod")


def test_runnable_layouts_pass():
    check_layout(system("srun"), 4, 8, "horovod")
    check_layout(system("python"), 1, 1, "horovod")
    check_layout(system("python"), 1, 2, "horovod")  # horovodrun starts the ranks: no MPI needed
    check_layout(system("torchrun"), 1, 4, "horovod")
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


# -- site set-up: launcher flags, environment, container --------------------------------------------
def test_launcher_flags_follow_the_launchers_own_options():
    flags = ["--hint=nomultithread", "--distribution=block:block"]
    argv = launch_argv(system("srun", launcher_flags=flags), trial(2, 16), PYTHON)
    assert argv[argv.index("--kill-on-bad-exit=1") + 1 :] == [*flags, PYTHON]
    torchrun = launch_argv(system("torchrun", launcher_flags=["--max-restarts=0"]), trial(1, 4), PYTHON)
    assert torchrun[-2:] == ["--nproc-per-node=4", "--max-restarts=0"]  # the script follows them


def test_launcher_flags_without_a_launcher_are_refused():
    with pytest.raises(ValueError, match="launcher 'python' starts one process as the interpreter"):
        check_layout(system("python", launcher_flags=["--exclusive"]), 1, 1, "native")
    check_layout(system("python", launcher_flags=["--max-restarts=0"]), 1, 2, "native")  # torch.distributed.run


def run_launch(argv: list[str], program: str, **popen) -> subprocess.CompletedProcess:
    """Run a launch argv whose last part is the interpreter, with ``-c program``."""
    return subprocess.run([*argv, "-c", program], capture_output=True, text=True, timeout=60, **popen)


def test_environment_is_set_up_in_order_before_the_launch(tmp_path):
    loaded = tmp_path / "loaded"
    environment = {
        "modules": ["PrgEnv-gnu", "cray-python"],
        "setup": [f'echo "setup after $(cat {loaded})" > {tmp_path / "setup"}', "export FROM_SETUP=yes"],
        "variables": {
            "OMP_NUM_THREADS": "$MLCAMPAIGN_THREADS",
            "BOTH": "$FROM_SETUP-and-literal",
            "QUOTED": 'a "b" `c`',
        },
    }
    argv = launch_argv(system("python", cores_per_node=6, environment=environment), trial(1, 1), PYTHON)
    assert argv[:2] == ["/bin/bash", "-c"] and argv[-1] == PYTHON
    # A stand-in for the site's `module` shell function (Lmod and Environment Modules export theirs to
    # a batch job's shells the same way): it records what was loaded.
    stand_in_module = {"BASH_FUNC_module%%": f'() {{ echo "$@" > {loaded}; }}'}
    argv[-1] = "python3"  # PYTHON is a made-up path with a space in it
    program = "import os; print(os.environ['OMP_NUM_THREADS'], os.environ['BOTH'], os.environ['QUOTED'])"
    result = run_launch(argv, program, env={"PATH": "/usr/bin:/bin"} | stand_in_module)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == '6 yes-and-literal a "b" `c`'
    assert loaded.read_text() == "load PrgEnv-gnu cray-python\n"
    assert (tmp_path / "setup").read_text() == "setup after load PrgEnv-gnu cray-python\n"


def test_a_failing_set_up_ends_the_launch(tmp_path):
    environment = {"setup": ["false", f"touch {tmp_path / 'reached'}"]}
    argv = launch_argv(system("python", environment=environment), trial(1, 1), "python3")
    assert run_launch(argv, "print('trial')").returncode != 0
    assert not (tmp_path / "reached").exists()


def test_the_set_up_interpreter_replaces_the_jobs():
    argv = launch_argv(system("srun", environment={"python": "python"}), trial(2, 4), PYTHON)
    assert argv[-1] == "python"


def test_srun_starts_the_container_per_rank_with_the_gpu_flag_and_binds():
    container = {"image": "/work/images/torch.sif", "bind": ["/work"], "options": ["--cleanenv"]}
    gpus = system("srun", device="cuda", devices_per_node=4, cores_per_node=40, container=container)
    argv = launch_argv(gpus, trial(2, 4), PYTHON)
    srun_end = argv.index("--kill-on-bad-exit=1")
    exec_argv = ["apptainer", "exec", "--nv", "--bind", str(SOURCE_TREE), "--bind", "/work", "--cleanenv"]
    assert argv[srun_end + 1 :] == [*exec_argv, "/work/images/torch.sif", "python3"]
    assert "export MLCAMPAIGN_CONTAINER_IMAGE=/work/images/torch.sif" in argv[2].splitlines()


def test_torchrun_runs_inside_the_container_and_singularity_can_replace_apptainer():
    container = {"image": "docker://rocm/pytorch:latest", "runtime": "singularity", "python": "/opt/conda/bin/python"}
    rocm = system("torchrun", device="rocm", devices_per_node=4, cores_per_node=32, container=container)
    argv = launch_argv(rocm, trial(1, 4), PYTHON)
    inner = argv[4:]
    assert inner[:3] == ["singularity", "exec", "--rocm"]
    assert inner[inner.index("docker://rocm/pytorch:latest") + 1 :][:3] == [
        "/opt/conda/bin/python",
        "-m",
        "torch.distributed.run",
    ]


def test_a_kubernetes_trial_runs_as_its_pod_without_a_wrapper():
    pod = system("torchrun", executor="kubernetes", device="cuda", devices_per_node=4, cores_per_node=32)
    plain = launch_argv(pod, trial(1, 4), PYTHON)
    assert (
        launch_argv(pod | {"container": {"image": "registry.example.org/mlcampaign:1"}}, trial(1, 4), PYTHON) == plain
    )
    assert (
        job_resources(pod | {"container": {"image": "registry.example.org/mlcampaign:1"}}, trial(1, 4))[
            "container_image"
        ]
        == "registry.example.org/mlcampaign:1"
    )
    assert "container_image" not in job_resources(system("srun", container={"image": "x.sif"}), trial(1, 1))


def test_a_system_without_site_set_up_launches_as_before():
    assert launch_argv(system("srun"), trial(1, 2), PYTHON)[0] == "srun"


# -- scheduler placement: what sbatch gets ------------------------------------------------------------
class PluginJob:
    """What the Slurm executor plugin reads of a job: its resources (items and attributes) and threads."""

    class Resources(dict):
        def __getattr__(self, name):
            try:
                return self[name]
            except KeyError:
                raise AttributeError(name) from None

    def __init__(self, resources: dict):
        self.resources = self.Resources(resources)
        self.threads = 1


def sbatch_options(resources: dict) -> list[str]:
    """The sbatch command the stock Slurm executor plugin builds for a job of ``resources`` (placement
    options only: the plugin fills account and partition in itself)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    job = PluginJob({key: value for key, value in resources.items() if value is not None})
    validate_slurm_extra(job)
    params = {
        "run_uuid": "run",
        "slurm_logfile": "log",
        "comment_str": "c",
        "account": "",
        "partition": "",
        "workdir": "",
    }
    return shlex.split(get_submit_command(job, params) + set_gres_string(job))


def test_slurm_placement_becomes_sbatch_options():
    slurm = {
        "partition": "standard",
        "constraint": "StandardMem",
        "sbatch_flags": ["--exclusive", "--comment-free flag with spaces"],
        "memory_per_node_mb": 240000,
    }
    resources = job_resources(system("srun", slurm=slurm), trial(2, 16))
    assert resources["slurm_extra"] == "--exclusive '--comment-free flag with spaces'"
    options = sbatch_options(resources)
    assert options[options.index("-C") + 1] == "StandardMem"
    assert options[options.index("--mem") + 1] == "240000"
    assert "--exclusive" in options and "--comment-free flag with spaces" in options


def test_no_memory_request_where_the_site_allocates_memory_itself():
    resources = job_resources(system("srun", slurm={"memory_per_node_mb": 0}), trial(1, 2))
    assert not any(option.startswith("--mem") for option in sbatch_options(resources))
    assert "--mem" in sbatch_options(job_resources(system("srun"), trial(1, 2)))  # memory_per_node_mb


def test_gpu_partitions_that_refuse_task_options_get_none():
    gpu = system("srun", device="cuda", devices_per_node=4, cores_per_node=40)
    pro_rata = gpu | {"slurm": {"tasks_in_sbatch": False, "gpu_option": "gres"}}
    options = sbatch_options(job_resources(pro_rata, trial(2, 4)))
    assert not [option for option in options if option.startswith(("--ntasks", "--cpus-per-task"))]
    assert "--gres=gpu:4" in options and not [option for option in options if option.startswith("--gpus")]
    assert "--nodes=2" in options
    default = sbatch_options(job_resources(gpu, trial(2, 4)))
    assert "--gpus=8" in default and "--ntasks-per-gpu=1" in default and "--cpus-per-task=10" in default
    # The launcher's srun still places one task per GPU with its cores.
    assert launch_argv(pro_rata, trial(2, 4), PYTHON)[:5] == [
        "srun",
        "--nodes=2",
        "--ntasks=8",
        "--ntasks-per-node=4",
        "--cpus-per-task=10",
    ]


@pytest.mark.parametrize(
    ("changes", "key", "reason"),
    [
        (
            {"slurm": {"sbatch_flags": ["--exclusive", "--mem=200G"]}},
            "slurm.sbatch_flags.1",
            "slurm.memory_per_node_mb",
        ),
        ({"slurm": {"sbatch_flags": ["-C", "knl"]}}, "slurm.sbatch_flags.0", "slurm.constraint"),
        ({"slurm": {"sbatch_flags": ["--qos=long"]}}, "slurm.sbatch_flags.0", "slurm.qos"),
        ({"slurm": {"sbatch_flags": ["--time=01:00:00"]}}, "slurm.sbatch_flags.0", "trial_time_limit_minutes"),
        ({"slurm": {"tasks_in_sbatch": False}}, "slurm.tasks_in_sbatch", "GPU systems only"),
        ({"executor": "kubernetes", "slurm": {"qos": "gpu"}}, "slurm", "does not submit through Slurm"),
        ({"executor": "kubernetes", "container": {"image": "i", "bind": ["/work"]}}, "container.bind", "pod"),
    ],
)
def test_site_set_up_that_cannot_work_is_refused_naming_the_key(changes, key, reason):
    (problem,) = check_site_setup(system("srun", **changes))
    assert problem[0] == key and reason in problem[2]


def test_site_set_up_the_plugin_accepts_passes():
    slurm = {"sbatch_flags": ["--exclusive", "--hint=nomultithread", "--reservation=maint"], "constraint": "a100"}
    assert check_site_setup(system("srun", slurm=slurm, container={"image": "x.sif", "bind": ["/work"]})) == []
