"""Horovod as envs/horovod/build.py builds it: the recipe's build variants, and the built Horovod under horovodrun.

The distributed tests start `horovodrun -np 2 -H localhost:2 --gloo` on this file, whose ``__main__`` runs one
worker per rank; each rank saves what it saw to ``rank<r>.npz`` and the test compares the ranks. They skip where
Horovod (or one of its framework extensions) is not installed, and fail where it is installed but broken.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]  # also when horovodrun runs this file as a script
BUILD_SCRIPT = REPO / "envs" / "horovod" / "build.py"
RANKS = 2
STEPS = 3
LEARNING_RATE = 0.1
MOMENTUM = 0.9
FEATURES, HIDDEN, OUTPUTS, BATCH = 8, 16, 2, 4
FP16_EXACT = np.array([0.5, 1.25, -2.0, 1024.0], dtype=np.float32)  # its multiples by 1..RANKS are exact in fp16
# fp16 compression rounds each gradient and their sum to 11 significant bits: after STEPS momentum-0.9 steps the weights
# stay within LEARNING_RATE * (1 + 1.9 + 2.71) * 2 * 2**-11 * max|gradient| (about 5.5e-4 * max|gradient|, and
# max|gradient| < 3 for these models and batches) of fp32 averaging.
FP16_WEIGHT_TOLERANCE = 2e-3


def load_build_script():
    spec = importlib.util.spec_from_file_location("horovod_build", BUILD_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = load_build_script()


# -- the recipe: variants, cache key, modes (no build) ------------------------------------------
def test_cpu_build_is_gloo_only_and_ignores_a_cuda_torch():
    env = build.build_environment("none", mpi=False, frameworks=["torch", "tensorflow"], jobs=3)
    assert env["MAKEFLAGS"] == "-j3"
    assert env["HOROVOD_CPU_OPERATIONS"] == "GLOO"
    for name in ("WITH_GLOO", "WITHOUT_MPI", "WITH_PYTORCH", "WITH_TENSORFLOW", "WITHOUT_MXNET", "CPU_ONLY"):
        assert env[f"HOROVOD_{name}"] == "1", name
    assert not {"HOROVOD_GPU", "HOROVOD_GPU_OPERATIONS", "HOROVOD_WITH_MPI"} & env.keys()


@pytest.mark.parametrize(("gpu", "library"), [("cuda", "CUDA"), ("rocm", "ROCM")])
def test_gpu_builds_use_nccl_or_rccl(gpu, library):
    env = build.build_environment(gpu, mpi=False, frameworks=["torch"], jobs=2)
    assert (env["HOROVOD_GPU"], env["HOROVOD_GPU_OPERATIONS"]) == (library, "NCCL")
    assert env["HOROVOD_WITHOUT_TENSORFLOW"] == "1"
    assert not {"HOROVOD_CPU_ONLY", "HOROVOD_WITHOUT_NVTX"} & env.keys()


def test_mpi_build_leaves_cpu_collectives_to_mpi():
    env = build.build_environment("none", mpi=True, frameworks=["torch", "tensorflow"], jobs=2)
    assert env["HOROVOD_WITH_MPI"] == "1"
    assert not {"HOROVOD_WITHOUT_MPI", "HOROVOD_CPU_OPERATIONS"} & env.keys()


def test_build_process_keeps_site_paths_and_drops_other_horovod_settings(monkeypatch):
    monkeypatch.setenv("HOROVOD_NCCL_HOME", "/opt/nccl")
    monkeypatch.setenv("HOROVOD_GPU_OPERATIONS", "MPI")
    env = build.build_environment("cuda", mpi=False, frameworks=["torch"], jobs=2)
    process = build.process_environment(dict(os.environ), env, "mlcampaign.0123")
    assert process["HOROVOD_NCCL_HOME"] == "/opt/nccl"
    assert process["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert process["HOROVOD_LOCAL_VERSION"] == "mlcampaign.0123"
    assert process["PATH"] == os.environ["PATH"]


def test_recipe_digest_covers_every_patch(tmp_path, monkeypatch):
    patches = tmp_path / "patches"
    patches.mkdir()
    for patch in build.PATCHES.glob("*.patch"):
        (patches / patch.name).write_bytes(patch.read_bytes())
    monkeypatch.setattr(build, "PATCHES", patches)
    original = build.recipe_digest()
    first = sorted(patches.glob("*.patch"))[0]
    first.write_text(first.read_text() + "\n")
    assert build.recipe_digest() != original


def test_sdist_pin_names_version_and_hash(tmp_path, monkeypatch):
    version, name, sha256 = build.pinned_sdist()
    assert name == f"horovod-{version}.tar.gz"
    assert len(sha256) == 64
    bad = tmp_path / "sdist.sha256"
    bad.write_text("not-a-hash  horovod-0.28.1.tar.gz\n")
    monkeypatch.setattr(build, "SDIST_PIN", bad)
    with pytest.raises(build.BuildError, match="expected one line"):
        build.pinned_sdist()


def test_installed_horovod_must_match_version_and_features():
    features = build.expected_features("none", mpi=False)
    built = {"version": "0.28.1+mlcampaign.ab", "frameworks": {"torch": dict(features)}}
    assert build.installed_mismatch(built, "0.28.1+mlcampaign.ab", ["torch"], features) is None
    assert build.installed_mismatch(None, "0.28.1+mlcampaign.ab", ["torch"], features) == "not installed"
    assert "installed version is" in build.installed_mismatch(built, "0.28.1+mlcampaign.cd", ["torch"], features)
    without_gloo = {"version": built["version"], "frameworks": {"torch": {**features, "gloo": False}}}
    assert "was built with" in build.installed_mismatch(without_gloo, built["version"], ["torch"], features)
    broken = {"version": built["version"], "frameworks": {"torch": {"error": "ImportError: x"}}}
    assert "does not import" in build.installed_mismatch(broken, built["version"], ["torch"], features)


def test_site_horovod_must_match_the_frameworks_it_was_built_against():
    probe = {
        "frameworks": {"torch": {"version": "2.14.1"}, "tensorflow": {"version": "2.21.0"}},
        "horovod": {"built_against": {"pytorch": "2.14.1", "tensorflow": "2.20.0"}},
    }
    assert build.built_against_mismatch(probe, ["torch"]) is None
    assert build.built_against_mismatch(probe, ["torch", "tensorflow"]) == (
        "tensorflow 2.20.0, but the environment has 2.21.0"
    )


def run_build_script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--python", sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | (env or {}),
    )


def test_print_env_shows_the_variant_and_a_key_that_depends_on_it(tmp_path):
    pytest.importorskip("torch")
    keys = {}
    for gpu in ("none", "cuda"):
        result = run_build_script("--frameworks", "torch", "--print-env", env={"MLCAMPAIGN_HOROVOD_GPU": gpu})
        assert result.returncode == 0, result.stderr
        lines = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line and line[0].isupper())
        assert lines.get("HOROVOD_GPU_OPERATIONS") == ("NCCL" if gpu == "cuda" else None)
        keys[gpu] = lines["MLCAMPAIGN_HOROVOD_KEY"]
    assert keys["none"] != keys["cuda"]
    assert all(key.startswith("0.28.1-") for key in keys.values())


def test_gpu_variant_needs_a_matching_torch_build(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.version.hip is not None:
        pytest.skip("this torch is a ROCm build")
    result = run_build_script("--frameworks", "torch", "--gpu", "rocm", "--cache-dir", str(tmp_path))
    assert result.returncode == 1
    assert "--gpu rocm: torch" in result.stderr and "is not a ROCm build" in result.stderr
    assert not any(tmp_path.iterdir()), "nothing is downloaded or built for a refused variant"


@pytest.mark.parametrize(
    ("mode", "returncode", "message"),
    [("none", 0, "MLCAMPAIGN_HOROVOD=none: not building"), ("sometimes", 1, "expected build, system or none")],
)
def test_horovod_mode(mode, returncode, message, tmp_path):
    result = run_build_script("--cache-dir", str(tmp_path), env={"MLCAMPAIGN_HOROVOD": mode})
    assert result.returncode == returncode
    assert message in result.stdout + result.stderr


# -- the built Horovod under horovodrun ----------------------------------------------------------
EXTENSIONS = {"torch": "mpi_lib_v2", "tensorflow": "mpi_lib"}


def test_system_mode_reports_the_installed_horovod_and_builds_nothing(tmp_path):
    require_horovod("torch")
    result = run_build_script(
        "--frameworks", "torch", "--cache-dir", str(tmp_path), env={"MLCAMPAIGN_HOROVOD": "system"}
    )
    assert result.returncode == 0, result.stderr
    assert "MLCAMPAIGN_HOROVOD=system: using horovod" in result.stdout
    assert "horovod.torch: {'gloo': True" in result.stdout
    assert not any(tmp_path.iterdir())


def require_horovod(framework: str) -> str:
    """horovodrun; skips where Horovod, its ``framework`` extension or Gloo is not built, fails where broken."""
    spec = importlib.util.find_spec("horovod")
    if spec is None:
        pytest.skip(f"horovod is not installed in {sys.executable} (build it: python envs/horovod/build.py)")
    package = Path(spec.origin).parent / framework
    if not list(package.glob(f"{EXTENSIONS[framework]}.*.so")):
        pytest.skip(f"horovod.{framework} was not built into the installed Horovod ({package})")
    if not importlib.import_module(f"horovod.{framework}").gloo_built():
        pytest.skip(f"horovod.{framework} was built without Gloo, which `horovodrun --gloo` needs")
    sibling = Path(sys.executable).with_name("horovodrun")  # else a site's Horovod module puts it on PATH
    launcher = str(sibling) if sibling.exists() else shutil.which("horovodrun")
    assert launcher, f"Horovod is installed in {package.parent} but there is no horovodrun"
    return launcher


def run_ranks(framework: str, case: str, tmp_path: Path, *args: str) -> list[dict[str, np.ndarray]]:
    """Run worker ``case`` on RANKS Gloo ranks through horovodrun; what each rank saved."""
    command = [require_horovod(framework), "-np", str(RANKS), "-H", f"localhost:{RANKS}", "--gloo"]
    command += [sys.executable, __file__, case, str(tmp_path), *args]
    env = os.environ | {"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return [dict(np.load(tmp_path / f"rank{rank}.npz")) for rank in range(RANKS)]


def assert_collectives(ranks: list[dict[str, np.ndarray]]) -> None:
    """Sum, average, fp16-compressed sum and broadcast give the exact expected values on every rank."""
    ones = np.arange(1, 5, dtype=np.float32)
    for saved in ranks:
        assert saved["size"] == RANKS
        np.testing.assert_array_equal(saved["sum"], ones * sum(range(1, RANKS + 1)))
        np.testing.assert_array_equal(saved["average"], ones * sum(range(1, RANKS + 1)) / RANKS)
        np.testing.assert_array_equal(saved["int_sum"], np.arange(5) * RANKS + 10 * sum(range(RANKS)))
        np.testing.assert_array_equal(saved["fp16_sum"], FP16_EXACT * sum(range(1, RANKS + 1)))
        np.testing.assert_array_equal(saved["broadcast"], np.full(3, RANKS - 1, dtype=np.float32))
    assert sorted(int(saved["rank"]) for saved in ranks) == list(range(RANKS))


def assert_trained_alike(ranks: list[dict[str, np.ndarray]], compression: str) -> None:
    """Bit-identical weights on all ranks, moved by training, as averaging the ranks' fp32 gradients by hand gives."""
    weights = sorted(name for name in ranks[0] if name.startswith("weight"))
    assert weights
    for name in weights:
        for saved in ranks[1:]:
            assert saved[name].tobytes() == ranks[0][name].tobytes(), f"{name} differs between ranks"
        trained, reference, initial = ranks[0][name], ranks[0][f"reference_{name}"], ranks[0][f"initial_{name}"]
        if compression == "none":
            np.testing.assert_allclose(trained, reference, rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_allclose(trained, reference, rtol=0, atol=FP16_WEIGHT_TOLERANCE, err_msg=name)
        assert np.abs(trained - initial).max() > 10 * FP16_WEIGHT_TOLERANCE, f"{name} did not train"
    if compression == "fp16":
        rounded = any(ranks[0][name].tobytes() != ranks[0][f"reference_{name}"].tobytes() for name in weights)
        assert rounded, "fp16 compression left every weight bit-identical to fp32 averaging"
    assert not np.array_equal(ranks[0]["initial_before_broadcast"], ranks[1]["initial_before_broadcast"])


def test_torch_collectives(tmp_path):
    assert_collectives(run_ranks("torch", "torch_collectives", tmp_path))


@pytest.mark.parametrize(("api", "compression"), [("optimizer", "none"), ("optimizer", "fp16"), ("grouped", "fp16")])
def test_torch_training(api, compression, tmp_path):
    assert_trained_alike(run_ranks("torch", "torch_training", tmp_path, api, compression), compression)


@pytest.mark.parametrize(("api", "compression"), [("tape", "none"), ("grouped", "fp16")])
def test_keras_training(api, compression, tmp_path):
    ranks = run_ranks("tensorflow", "keras_training", tmp_path, api, compression)
    assert_collectives(ranks)
    assert_trained_alike(ranks, compression)


# -- the workers, run by horovodrun as `python tests/unit/trial/test_horovod.py <case> <output dir> [args]` -----


def rank_batches(rank: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each rank's own STEPS batches (different per rank, so averaging the gradients matters)."""
    rng = np.random.default_rng(1000 + rank)
    return [
        (rng.standard_normal((BATCH, FEATURES), dtype=np.float32), rng.standard_normal((BATCH, OUTPUTS), np.float32))
        for _ in range(STEPS)
    ]


def torch_worker(case: str, out: Path, args: list[str]) -> None:
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.set_num_threads(1)
    rank = hvd.rank()
    saved: dict[str, np.ndarray] = {"rank": np.array(rank), "size": np.array(hvd.size())}
    if case == "torch_collectives":
        ones = torch.arange(1, 5, dtype=torch.float32)
        saved["sum"] = hvd.allreduce(ones * (rank + 1), op=hvd.Sum).numpy()
        saved["average"] = hvd.allreduce(ones * (rank + 1), op=hvd.Average).numpy()
        saved["int_sum"] = hvd.allreduce(torch.arange(5, dtype=torch.int32) + 10 * rank, op=hvd.Sum).numpy()
        fp16 = torch.from_numpy(FP16_EXACT) * (rank + 1)
        saved["fp16_sum"] = hvd.allreduce(fp16, op=hvd.Sum, compression=hvd.Compression.fp16).numpy()
        saved["broadcast"] = hvd.broadcast_(torch.full((3,), float(rank)), root_rank=RANKS - 1).numpy()
        if hvd.allgather_object({"rank": rank}) != [{"rank": r} for r in range(hvd.size())]:
            raise RuntimeError("allgather_object did not return every rank's object in rank order")
    else:
        api, compression_name = args
        compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[compression_name]

        def model_and_optimizer(seed: int):
            torch.manual_seed(seed)
            model = torch.nn.Sequential(
                torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUTPUTS)
            )
            return model, torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)

        def gradients(model, x, y) -> list[torch.Tensor]:
            model.zero_grad()
            torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            return [p.grad.clone() for p in model.parameters()]

        model, optimizer = model_and_optimizer(seed=rank)  # different initial weights per rank until broadcast
        saved["initial_before_broadcast"] = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        reference, reference_optimizer = model_and_optimizer(seed=0)
        reference.load_state_dict(model.state_dict())
        for index, p in enumerate(model.parameters()):
            saved[f"initial_weight{index}"] = p.detach().numpy().copy()
        if api == "optimizer":
            optimizer = hvd.DistributedOptimizer(
                optimizer, named_parameters=model.named_parameters(), compression=compression
            )
        all_batches = [rank_batches(r) for r in range(hvd.size())]
        for step, (x, y) in enumerate(all_batches[rank]):
            if api == "optimizer":
                gradients(model, x, y)
            else:  # as mlcampaign.trial.torch.collectives averages gradients for backend 'horovod'
                grads = gradients(model, x, y)
                reduced = hvd.grouped_allreduce(grads, op=hvd.Average, compression=compression)
                for p, grad in zip(model.parameters(), reduced, strict=True):
                    p.grad.copy_(grad)
            optimizer.step()
            # The same step by hand: every rank's fp32 gradient, averaged.
            per_rank = [gradients(reference, *all_batches[r][step]) for r in range(hvd.size())]
            for p, *grads in zip(reference.parameters(), *per_rank, strict=True):
                p.grad = torch.stack(grads).mean(dim=0)
            reference_optimizer.step()
        for index, (p, q) in enumerate(zip(model.parameters(), reference.parameters(), strict=True)):
            saved[f"weight{index}"] = p.detach().numpy()
            saved[f"reference_weight{index}"] = q.detach().numpy()
    np.savez(out / f"rank{rank}.npz", **saved)
    hvd.shutdown()


def keras_worker(out: Path, args: list[str]) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow as hvd
    import keras

    hvd.init()
    rank = hvd.rank()
    saved: dict[str, np.ndarray] = {"rank": np.array(rank), "size": np.array(hvd.size())}
    ones = tf.range(1, 5, dtype=tf.float32)
    saved["sum"] = hvd.allreduce(ones * (rank + 1), op=hvd.Sum).numpy()
    saved["average"] = hvd.allreduce(ones * (rank + 1), op=hvd.Average).numpy()
    saved["int_sum"] = hvd.allreduce(tf.range(5, dtype=tf.int32) + 10 * rank, op=hvd.Sum).numpy()
    fp16 = tf.constant(FP16_EXACT) * (rank + 1)
    saved["fp16_sum"] = hvd.allreduce(fp16, op=hvd.Sum, compression=hvd.Compression.fp16).numpy()
    saved["broadcast"] = hvd.broadcast(tf.fill((3,), float(rank)), root_rank=RANKS - 1).numpy()

    api, compression_name = args
    compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[compression_name]

    def model_and_optimizer(seed: int):
        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh"), keras.layers.Dense(OUTPUTS)]
        )
        return model, keras.optimizers.SGD(learning_rate=LEARNING_RATE, momentum=MOMENTUM)

    def loss(model, x, y):
        return tf.reduce_mean(tf.square(model(x) - y))

    model, optimizer = model_and_optimizer(seed=rank)  # different initial weights per rank until broadcast
    saved["initial_before_broadcast"] = np.concatenate([w.flatten() for w in model.get_weights()])
    # Keras 3 variables are not tf.Variables, which Horovod 0.28.1's TensorFlow API expects: broadcast_variables fails
    # on them (AttributeError: 'SymbolicTensor' object has no attribute 'assign') and so does DistributedGradientTape
    # ('Variable' object has no attribute 'ref'). Both get the tf.Variables the Keras variables hold.
    hvd.broadcast_variables([variable.value for variable in model.variables], root_rank=0)
    reference, reference_optimizer = model_and_optimizer(seed=0)
    reference.set_weights(model.get_weights())
    for index, w in enumerate(model.get_weights()):
        saved[f"initial_weight{index}"] = w
    all_batches = [rank_batches(r) for r in range(hvd.size())]
    for step, (x, y) in enumerate(all_batches[rank]):
        with tf.GradientTape() as tape:
            value = loss(model, x, y)
        if api == "tape":
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            grads = tape.gradient(value, [variable.value for variable in model.trainable_variables])
        else:  # as mlcampaign.trial.keras.trial averages gradients for backend 'horovod'
            grads = tape.gradient(value, model.trainable_variables)
            grads = hvd.grouped_allreduce(grads, op=hvd.Average, compression=compression)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        per_rank = []
        for r in range(hvd.size()):
            with tf.GradientTape() as tape:
                value = loss(reference, *all_batches[r][step])
            per_rank.append(tape.gradient(value, reference.trainable_variables))
        averaged = [tf.reduce_mean(tf.stack(grads), axis=0) for grads in zip(*per_rank, strict=True)]
        reference_optimizer.apply_gradients(zip(averaged, reference.trainable_variables, strict=True))
    for index, (w, r) in enumerate(zip(model.get_weights(), reference.get_weights(), strict=True)):
        saved[f"weight{index}"] = w
        saved[f"reference_weight{index}"] = r
    np.savez(out / f"rank{rank}.npz", **saved)
    hvd.shutdown()


if __name__ == "__main__":
    worker_case, output_dir, *worker_args = sys.argv[1:]
    if worker_case == "keras_training":
        keras_worker(Path(output_dir), worker_args)
    else:
        torch_worker(worker_case, Path(output_dir), worker_args)
