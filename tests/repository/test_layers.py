"""The package's layers, from its import statements: no module imports a layer above its own, a benchmark
folder's declaration imports only what planning may read, and planning imports neither torch nor Keras.
Above the package, the workflow's rules (rules/*.smk, the Snakefile) and rule scripts (scripts/*.py) hold
no logic of their own: the rules declare jobs from one plan (mlcampaign.workflow.planning), the scripts pass
their inputs to the package.

The layers follow the data path, bottom first (mlcampaign/__init__.py). Within a layer modules import each
other freely. A lower layer reaches an upper one only by name through a registry (a benchmark's model,
reader, generator and MLPerf keys; a trial's framework; a store's backends; a power source), never by an
import statement.
"""

import ast
import io
import subprocess
import sys
import types
from pathlib import Path

import pytest
from snakemake.parser import parse

from conftest import REPO

PACKAGE = REPO / "mlcampaign"
LAYERS = (
    "measure",
    "plan",
    "data",
    "records",
    "job",
    "trial",
    "benchmarks",
    "analysis",
    "history",
    "workflow",
    "cli",
)
RULE_FILES = [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]
# A rule script is glue: its lines of code (not blank, not a comment; the docstring counts) at most this.
SCRIPT_LINES = 30
# What the rule files may run outside their rules' own bodies: calls at module level (outside rules,
# directives and function definitions; in all rule files together), and statements in each function the
# rules call for their jobs (input, param and resource functions; docstring excluded) and in all together.
# Before planning moved into mlcampaign.workflow.planning (#30), rules/common.smk alone ran 47 calls, a try
# block of 50 lines and two ifs with loops at module level.
MODULE_CALLS = 12
FUNCTION_STATEMENTS = 8
ALL_FUNCTION_STATEMENTS = 45


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


def test_every_rule_script_is_glue():
    """Each script under scripts/ passes its rule's inputs, params and outputs to the package: at most
    SCRIPT_LINES lines of code (lines that are neither blank nor comments)."""
    long = {}
    for path in sorted((REPO / "scripts").glob("*.py")):
        code = [line for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if len(code) > SCRIPT_LINES:
            long[path.name] = len(code)
    assert long == {}, f"rule scripts over {SCRIPT_LINES} lines of code: move their logic into the package"


class _RuleFile:
    """A rule file as Snakemake's own parser hands it to Python (a rule becomes a decorated function
    ``__rule_<name>``; a directive such as ``localrules:`` a call of a ``workflow`` method)."""

    def __init__(self, path: Path):
        self.path = path

    def get_path_or_uri(self, secret_free=True) -> str:
        return str(self.path)


def compiled_rules(path: Path) -> ast.Module:
    text = path.read_text()
    workflow = types.SimpleNamespace(sourcecache=types.SimpleNamespace(open=lambda source: io.StringIO(text)))
    return ast.parse(parse(_RuleFile(path), workflow, {})[0])


def _is_rule(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and node.name.startswith("__rule_")


def _is_directive(node: ast.stmt) -> bool:
    call = node.value if isinstance(node, ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "workflow"
    )


def _calls(node: ast.AST) -> int:
    return sum(isinstance(child, ast.Call) for child in ast.walk(node))


def _only_turns_an_error_into_another(node: ast.Try) -> bool:
    """A try around one statement whose handlers only raise (the plan's refusal as Snakemake's WorkflowError)."""
    return (
        len(node.body) == 1
        and not node.orelse
        and not node.finalbody
        and all(len(handler.body) == 1 and isinstance(handler.body[0], ast.Raise) for handler in node.handlers)
    )


def test_the_rules_declare_jobs_and_plan_nothing():
    """At module level, the rule files run no loop or with, a try only to turn one statement's error into
    Snakemake's, and an if only to choose which rules and directives there are; the rest is a few calls (the
    plan is one) and names for the rules to read. The functions they define for their jobs are a few
    statements each: planning logic cannot move into them either."""
    control, module_calls, statements = [], {}, {}

    def module_level(path: Path, body: list[ast.stmt]) -> None:
        for node in body:
            where = f"{path.relative_to(REPO)}: {type(node).__name__.lower()} (compiled line {node.lineno})"
            if isinstance(node, ast.Try) and _only_turns_an_error_into_another(node):
                module_calls[path.name] = module_calls.get(path.name, 0) + _calls(node)
            elif isinstance(node, ast.For | ast.While | ast.Try | ast.With | ast.Match):
                control.append(where)
            elif isinstance(node, ast.If):
                if not all(_is_rule(child) or _is_directive(child) for child in node.body + node.orelse):
                    control.append(f"{where}: holds more than rules and directives")
                module_calls[path.name] = module_calls.get(path.name, 0) + _calls(node.test)
            elif isinstance(node, ast.FunctionDef) and not _is_rule(node):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                statements[f"{path.name}: {node.name}"] = sum(
                    isinstance(child, ast.stmt) for statement in body for child in ast.walk(statement)
                )
            elif not (isinstance(node, ast.Import | ast.ImportFrom) or _is_rule(node) or _is_directive(node)):
                module_calls[path.name] = module_calls.get(path.name, 0) + _calls(node)

    for path in RULE_FILES:
        module_level(path, compiled_rules(path).body)
    assert control == [], "planning belongs in mlcampaign.workflow.planning, not in the rule files"
    assert sum(module_calls.values()) <= MODULE_CALLS, module_calls
    assert {name: count for name, count in statements.items() if count > FUNCTION_STATEMENTS} == {}
    assert sum(statements.values()) <= ALL_FUNCTION_STATEMENTS, statements
