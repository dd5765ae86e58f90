"""bench/gpu_check: its CPU dry mode runs every part through the real trial code (so the GPU check does not rot
where no GPU is), its outputs say what ran, and a missing package or a bad argument stops it with a clear error."""

import csv
import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

GPU_CHECK = REPO / "bench" / "gpu_check"
sys.path[:0] = [str(GPU_CHECK), str(REPO / "bench")]

# GPU paths whose code the dry mode runs on the CPU (the others need CUDA, NVML or an out-of-memory GPU).
RUN_ON_CPU = {
    "now_sync",
    "torch_device_errors",
    "autocast_bf16",
    "grad_scaler_fp16",
    "channels_last",
    "channels_last_3d",
    "nccl_init",
    "ddp_cuda",
    "allreduce_events",
    "nccl_collectives",
    "roofline_cuda",
    "eval_cuda",
}


def gpu_check(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(GPU_CHECK / "run.sh"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | {"PYTHON": sys.executable} | (env or {}),
    )


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check") / "out"
    # The budget guards the lent GPU's minutes; on a busy CI machine the dry run may take longer than
    # that, and no part may be skipped here.
    result = gpu_check(str(out), "--dry-run", "--budget-s", "3600", timeout=3600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return out, result


def test_dry_run_runs_every_part_through_the_trial(dry_run):
    import check_parts

    from mlcampaign.records.files import validate_record

    out, result = dry_run
    assert sorted(path.name for path in out.iterdir()) == ["gpu_paths.csv", "log.txt", "results.json", "summary.csv"]
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "dry"
    parts = {part["part"]: part for part in results["parts"]}
    assert list(parts) == [part.name for part in check_parts.plan("dry")]
    assert {name: part["status"] for name, part in parts.items() if part["status"] != "ok"} == {}
    for name, part in parts.items():
        if "record" in part:
            validate_record(part["record"])
            assert part["record"]["system"]["device"] == "cpu", name
    for compression in check_parts.COMPRESSIONS["dry"]:
        record = parts[f"nccl:{compression}"]["record"]
        assert record["distributed"]["communication"] == "gloo"
        assert record["distributed"]["weights_consistent"] is True
        assert record["metrics"]["allreduce_in_flight_s"] > 0
        assert record["trial"]["compression"] == compression
    assert parts["resnet50:fp16:scaler"]["grad_scaler"]["scale_before"] > 0
    # The dry mode's tiny DeepCAM fits in memory at the whole split as one batch: no failure record.
    assert parts["deepcam:fp32:oom"]["record"]["status"] == "ok"
    assert "Summary" in result.stdout and "GPU-only code paths" in result.stdout
    assert (out / "log.txt").read_text().count("== ") == len(parts)


def test_dry_run_summary_has_every_benchmark_and_precision(dry_run):
    out, _ = dry_run
    rows = list(csv.DictReader((out / "summary.csv").open()))
    plain = {(row["benchmark"], row["precision"]): row for row in rows if row["variant"] == ""}
    assert set(plain) == {
        (key, precision) for key in ("resnet50", "cosmoflow", "deepcam") for precision in ("bf16", "fp32")
    }
    for key, row in plain.items():
        for column in (
            "trial_samples_per_s",
            "loader_samples_per_s",
            "compute_only_samples_per_s",
            "bare_samples_per_s",
            "harness_ratio",
            "train_gflop_per_sample",
            "compute_only_mfu_measured_peak",
        ):
            assert float(row[column]) > 0, (key, column, row[column])
        assert row["trial_status"] == row["compute_status"] == "ok"
        assert row["bound_by"] in ("data loader", "compute")
        # No GPU here: memory and energy are not measured, and say nothing rather than 0.
        assert row["peak_memory_gib"] == row["gpu_j_per_sample"] == ""
    variants = {(row["benchmark"], row["precision"], row["variant"]) for row in rows}
    assert {("resnet50", "bf16", "channels_last"), ("cosmoflow", "bf16", "channels_last")} <= variants
    assert {("resnet50", "fp16", "scaler"), ("resnet50", "bf16", "ddp-none"), ("deepcam", "fp32", "oom")} <= variants


def test_dry_run_lists_every_gpu_path_and_what_ran_on_the_cpu(dry_run):
    import check_parts

    out, _ = dry_run
    rows = {row["path"]: row for row in csv.DictReader((out / "gpu_paths.csv").open())}
    assert list(rows) == [key for key, *_ in check_parts.GPU_PATHS] + [key for key, *_ in check_parts.GAPS]
    assert not [key for key, row in rows.items() if row["executed_on_gpu"] == "yes"]
    for key in RUN_ON_CPU:
        assert rows[key]["executed_on_gpu"].startswith("no: the same code ran on the CPU"), (key, rows[key])
        assert "(cpu)" in rows[key]["evidence"]
    for key in set(rows) - RUN_ON_CPU - {key for key, *_ in check_parts.GAPS}:
        assert rows[key]["executed_on_gpu"] == "no: no part that runs it completed", (key, rows[key])
    for key, *_ in check_parts.GAPS:
        assert rows[key]["executed_on_gpu"] == "no (declared gap)" and rows[key]["evidence"].startswith("not run")


def test_a_missing_package_is_named_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    blocked = (
        "import runpy, sys; sys.modules['google_crc32c'] = None; "
        f"sys.argv = ['gpu_check.py', '--out', {str(out)!r}, '--dry-run']; "
        f"runpy.run_path({str(GPU_CHECK / 'gpu_check.py')!r}, run_name='__main__')"
    )
    result = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "google-crc32c (module google_crc32c)" in result.stderr
    assert "fetch_wheels.sh" in result.stderr
    assert not out.exists()


def test_bad_arguments_stop_with_the_value_named(tmp_path):
    unmatched = gpu_check(str(tmp_path / "a"), "--dry-run", "--skip", "deepcam:bf16:nonesuch", timeout=120)
    assert unmatched.returncode == 2
    assert "--skip 'deepcam:bf16:nonesuch' matches no part" in unmatched.stderr
    used = tmp_path / "used"
    used.mkdir()
    (used / "results.json").write_text("earlier results")
    refused = gpu_check(str(used), "--dry-run", timeout=120)
    assert refused.returncode == 2
    assert f"--out {used} is not an empty folder" in refused.stderr
    assert (used / "results.json").read_text() == "earlier results"
    wheels = gpu_check("--wheels", str(tmp_path / "no-wheels"), str(tmp_path / "b"), "--dry-run", timeout=120)
    assert wheels.returncode == 2 and "no .whl files in" in wheels.stderr


def test_carried_wheels_are_this_projects_versions():
    import gpu_check

    pins = dict(
        line.split("==")
        for line in (GPU_CHECK / "wheels.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    required = set(gpu_check.REQUIRED_MODULES.values())
    assert set(pins) <= required
    for name, version in pins.items():
        assert importlib.metadata.version(name) == version, name
    requirements = (REPO / "requirements.txt").read_text()
    for name, version in pins.items():
        pinned = re.search(rf"^{re.escape(name)}==(\S+)", requirements, re.MULTILINE)
        assert pinned is None or pinned.group(1) == version, name
