"""The two most common recipes of config/README.md, followed in a copy of the checkout: a new system
at an existing site is one file, and a new benchmark with an existing model is one file."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SNAKEMAKE, job_counts

pytestmark = pytest.mark.integration

NEW_SYSTEM = {
    "name": "workstation-8core",
    "site": "local",
    "description": "An 8-core workstation of the same site as local-cpu.",
    "executor": "local",
    "launcher": "python",
    "device": "cpu",
    "accelerator": "8-core workstation CPU",
    "nodes_max": 1,
    "cores_per_node": 8,
    "devices_per_node": 1,
    "peak_flops_per_device": {"fp32": 6.0e11},
    "peak_source": "8 cores x 2.35 GHz x 32 FP32 FLOP/cycle (two 256-bit FMA pipes)",
}
NEW_BENCHMARK = {
    "name": "resnet18-width-synthetic",
    "description": "A narrower ResNet-50 on a small synthetic class-folder set.",
    "model": {"name": "resnet50", "options": {"num_classes": 4, "image_size": 16, "width_per_group": 8}},
    "dataset": {
        "name": "synthetic-images-16x4",
        "format": "image_folder",
        "source": {"generator": "synthetic_images", "options": {"num_classes": 4, "image_size": 16}},
    },
    "target": {"metric": "top1", "direction": "higher", "value": 0.8, "source": "test of the recipe"},
    "valid_flops": {"exponent": 10, "source": "test of the recipe"},
    "training": {"epochs_max": 2, "global_batch_size": 8, "optimizer": {"name": "sgd", "lr": 0.05}},
}


def checkout_copy(destination):
    """The checkout's files (tracked and untracked, not ignored), as a fresh clone has them."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return sorted(path.relative_to(destination) for path in destination.rglob("*") if path.is_file())


def test_a_new_system_and_a_new_benchmark_are_one_file_each(tmp_path):
    checkout = tmp_path / "checkout"
    before = checkout_copy(checkout)
    (checkout / "config" / "systems" / "workstation-8core.yaml").write_text(yaml.safe_dump(NEW_SYSTEM))
    (checkout / "config" / "benchmarks" / "resnet18-width-synthetic.yaml").write_text(yaml.safe_dump(NEW_BENCHMARK))
    after = sorted(path.relative_to(checkout) for path in checkout.rglob("*") if path.is_file())
    assert sorted(set(after) - set(before)) == [
        Path("config/benchmarks/resnet18-width-synthetic.yaml"),
        Path("config/systems/workstation-8core.yaml"),
    ]
    campaign = {
        "campaign": "recipes",
        "seed": 5,
        "trials": 2,
        "systems": ["local-cpu", "workstation-8core"],
        "benchmarks": ["resnet50-digits", "resnet18-width-synthetic"],
        "matrix": {"scales": ["1x1", "1x2"], "precisions": ["fp32"]},
    }
    campaign_file = tmp_path / "campaign.yaml"
    campaign_file.write_text(yaml.safe_dump(campaign))
    result = subprocess.run(
        [
            *(SNAKEMAKE, "--snakefile", str(checkout / "Snakefile"), "--directory", str(tmp_path / "work")),
            *("--profile", str(checkout / "profiles" / "local"), "-n", "--configfile", str(campaign_file)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # 2 systems x 2 benchmarks x 2 scales x 2 trials; each benchmark's dataset staged once.
    counts = job_counts(result.stdout)
    assert (counts["trial"], counts["stage_dataset"]) == (16, 2)
    assert "workstation-8core/resnet18-width-synthetic/1x2-fp32/trial1-rep0/record.json" in result.stdout
