"""The package's layers, from its import statements: no module imports a layer above its own, a benchmark
folder's declaration imports only what planning may read, and planning imports neither torch nor Keras.

The layers follow the data path, bottom first (mlcampaign/__init__.py). Within a layer modules import each
other freely. A lower layer reaches an upper one only by name through a registry (a benchmark's model,
reader, generator and MLPerf keys; a trial's framework; a store's backends), never by an import statement.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "mlcampaign"
LAYERS = ("measure", "plan", "data", "records", "job", "trial", "benchmarks", "analysis", "history", "cli")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """The layer of a module of the package: its first folder, or cli for the package's own modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS[:-1]) else "cli"


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every mlcampaign module the file imports, at any depth of the file (a function's
    own imports too); ``from mlcampaign.x import y`` counts as mlcampaign.x.y where y is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("mlcampaign")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mlcampaign"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (REPO / Path(*candidate.split("."))).with_suffix(".py").is_file() or (
                    REPO / Path(*candidate.split("."))
                ).is_dir()
                found.append((node.lineno, candidate if is_module else node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:
            pytest.fail(f"{path}:{node.lineno}: a relative import (the layer check reads absolute ones)")
    return found


def package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_is_in_a_layer():
    layers = {layer_of(module_name(path)) for path in package_files()}
    assert layers == set(LAYERS)


def test_no_module_imports_a_layer_above_its_own():
    rank = {layer: index for index, layer in enumerate(LAYERS)}
    upward = []
    for path in package_files():
        own = layer_of(module_name(path))
        for line, module in imported_modules(path):
            if module != "mlcampaign" and rank[layer_of(module)] > rank[own]:
                upward.append(f"{path.relative_to(REPO)}:{line}: {own} imports {module} ({layer_of(module)})")
    assert upward == []


def test_a_benchmark_declaration_imports_only_what_planning_reads():
    """The registry imports every folder's __init__.py when a campaign is planned."""
    for path in sorted((PACKAGE / "benchmarks").glob("*/__init__.py")):
        modules = {module for _, module in imported_modules(path)}
        assert modules <= {"mlcampaign.plan.registry", "mlcampaign.benchmarks.climate"}, path


def test_planning_a_campaign_imports_no_training_framework():
    code = (
        "import sys; from pathlib import Path; "
        "from mlcampaign.plan.config import load_campaign; from mlcampaign.plan.config_files import load_yaml; "
        "from mlcampaign.data.cost import staging_resources; "
        "campaign = load_campaign(load_yaml(Path('config/config.yaml')), Path('config')); campaign.trial_matrix(); "
        "[staging_resources(b['dataset'], Path('none'), 1, 10) for b in campaign.benchmarks.values()]; "
        "print(sorted(m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
