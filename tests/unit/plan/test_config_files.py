"""Config files read within bounds: YAML alias bombs, oversized and deeply nested files refused before any
work that grows with them, files that are not regular files refused without waiting, unknown top-level keys
before the rest of a document, a document of too many values (as Snakemake's --config reads an alias bomb)
before it is walked, numbers that JSON cannot hold; the JSON files of a run read within the same kind of
bounds, never through a link; and schema patterns that match whole strings only (jsonschema searches with
Python's re, whose ``$`` also matches before a final newline)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mlcampaign.cli import EXIT_USAGE, main
from mlcampaign.plan.config_files import (
    MAX_YAML_BYTES,
    MAX_YAML_VALUES,
    SCHEMA_DIR,
    ConfigError,
    load_schema,
    load_yaml,
    read_json_file,
    validate,
)

from conftest import REPO

CONFIG_DIR = REPO / "config"


def list_bomb(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs": each level a list of ``width`` aliases of the level below (width**levels values)."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join([*lines, "campaign: bomb", f"bomb: *l{levels - 1}"]) + "\n"


def mapping_bomb(levels: int = 9, width: int = 9) -> str:
    lines = [f"m0: &m0 {{{', '.join(f'k{j}: lol' for j in range(width))}}}"]
    lines += [f"m{i}: &m{i} {{{', '.join(f'k{j}: *m{i - 1}' for j in range(width))}}}" for i in range(1, levels)]
    return "\n".join([*lines, "campaign: bomb", f"bomb: *m{levels - 1}"]) + "\n"


@pytest.mark.parametrize("bomb", [list_bomb, mapping_bomb])
def test_an_alias_bomb_is_refused_at_once_naming_file_and_line(tmp_path, capsys, bomb):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    assert path.stat().st_size < 1000
    started = time.monotonic()
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(path))}:\d+:\d+: not valid YAML: .* values, aliases expanded"
    ):
        load_yaml(path)
    assert main(["check", str(path), "--config-dir", str(CONFIG_DIR)]) == EXIT_USAGE
    assert f"mlcampaign check: {path}:" in capsys.readouterr().err
    assert time.monotonic() - started < 10


def test_aliases_within_the_bound_are_read_as_before(tmp_path):
    """The project's own files use aliases (config/published/hpcai500.yaml): a small expansion is fine."""
    path = tmp_path / "aliases.yaml"
    path.write_text(list_bomb(levels=3, width=9))  # 9**3 = 729 values
    assert len(load_yaml(path)["bomb"]) == 9
    assert load_yaml(CONFIG_DIR / "published" / "hpcai500.yaml")


def test_a_document_just_past_the_bound_is_refused(tmp_path):
    path = tmp_path / "many.yaml"
    path.write_text("values:\n" + "".join(f"- {i}\n" for i in range(MAX_YAML_VALUES)))
    with pytest.raises(ConfigError, match=f"more than {MAX_YAML_VALUES} values"):
        load_yaml(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: &a [1, *a]\n", "x.yaml:1:4: not valid YAML: an alias refers to the list or mapping that holds it"),
        ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", "x.yaml: not valid YAML: lists or mappings nested too deeply"),
    ],
)
def test_recursive_and_deeply_nested_documents_are_refused(tmp_path, text, expected):
    (tmp_path / "x.yaml").write_text(text)
    with pytest.raises(ConfigError) as error:
        load_yaml(tmp_path / "x.yaml")
    assert expected in str(error.value)


def test_a_file_over_the_size_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "large.yaml"
    path.write_text("campaign: large\ndescription: '" + "x" * MAX_YAML_BYTES + "'\n")
    monkeypatch.setattr(Path, "read_text", lambda *_: pytest.fail("the oversized file was read"))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: \d+ bytes, more than the {MAX_YAML_BYTES}"):
        load_yaml(path)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _link_to_dev_zero(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize(
    ("make", "kind"),
    [(_fifo, "a named pipe"), (_link_to_dev_zero, "a device"), (_folder, "a folder")],
    ids=["named pipe", "link to /dev/zero", "folder"],
)
def test_a_config_file_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path, capsys, make, kind):
    """A named pipe would wait for a writer, /dev/zero never ends: `check` names what the file is, at once."""
    path = make(tmp_path / "campaign.yaml")
    started = time.monotonic()
    assert main(["check", str(path), "--config-dir", str(CONFIG_DIR)]) == EXIT_USAGE
    assert f"mlcampaign check: {path}: not a regular file ({kind}" in capsys.readouterr().err
    assert time.monotonic() - started < 10


def _deep_json(path: Path) -> Path:
    path.write_text("[" * 100_000 + "]" * 100_000)
    return path


def _large_json(path: Path) -> Path:
    path.write_text('{"x": "' + "x" * 2**20 + '"}')
    return path


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (_fifo, "{path}: not a regular file (a named pipe"),
        (_deep_json, "{path}: not JSON this reader takes: nested deeper than Python's recursion limit"),
        (_large_json, "{path}: 1048585 bytes, over the limit of a test (1048576 bytes)"),
        (_link_to_dev_zero, "{path}: a link (to '/dev/zero'); a run's files are read as regular files, never through"),
    ],
    ids=["named pipe", "nested 100 000 deep", "over the size bound", "link to /dev/zero"],
)
def test_a_json_file_is_read_within_bounds_naming_the_file_and_the_bound(tmp_path, make, expected):
    (tmp_path / "run").mkdir()
    path = make(tmp_path / "run" / "summary.json")
    with pytest.raises(ConfigError) as refused:
        read_json_file(path, 2**20, "over the limit of a test (1048576 bytes)", inside=tmp_path)
    assert str(refused.value).startswith(expected.format(path=path)), refused.value


def test_a_folder_of_a_run_that_is_a_link_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "summary.json").write_text("{}")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r1").symlink_to(elsewhere)
    assert read_json_file(tmp_path / "runs" / "r1" / "summary.json", 1000, "over", inside=None) == {}
    with pytest.raises(ConfigError, match=r"runs/r1: a link \(to '.*elsewhere'\)"):
        read_json_file(tmp_path / "runs" / "r1" / "summary.json", 1000, "over", inside=tmp_path / "runs")


def default_config() -> dict:
    return yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())


def test_a_document_of_too_many_values_is_refused_before_it_is_walked():
    """Snakemake's --config reads YAML aliases as shared lists (an alias bomb of a few hundred bytes): a known
    key holding billions of values is refused, naming it, before anything walks them (its values' checks, and
    jsonschema, whose message would print them)."""
    shared: list = ["lol"] * 9
    for _ in range(9):
        shared = [shared] * 9
    started = time.monotonic()
    too_many = f"--config: key 'description': the document holds more than {MAX_YAML_VALUES} values"
    with pytest.raises(ConfigError, match=too_many):
        validate(default_config() | {"description": shared}, "campaign", "c.yaml", lambda _path: "--config")
    recursive: list = []
    recursive.append(recursive)
    with pytest.raises(ConfigError, match="key 'description': the document holds more than"):
        validate(default_config() | {"description": recursive}, "campaign", "c.yaml")
    assert time.monotonic() - started < 5


def test_unknown_top_level_keys_are_refused_before_the_document_is_walked():
    """A value under an unknown key is never read: here one that would take hours to walk."""
    shared: list = ["lol"] * 9
    for _ in range(9):
        shared = [shared] * 9  # 9**10 values through shared lists, as an alias bomb loads
    started = time.monotonic()
    with pytest.raises(ConfigError, match="key 'bomb': unknown key"):
        validate(default_config() | {"bomb": shared}, "campaign", "c.yaml")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_numbers_json_cannot_hold_are_refused_naming_the_key(tmp_path, capsys, value):
    config = default_config()
    config["analysis"] = {"confidence": value}
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(config))  # .nan / .inf
    assert main(["check", str(path), "--config-dir", str(CONFIG_DIR)]) == EXIT_USAGE
    assert f"{path}: key 'analysis.confidence': value {value!r}: not a finite number" in capsys.readouterr().err


# -- patterns ----------------------------------------------------------------------------------------


def schema_patterns(schema, where: str = "") -> list[tuple[str, str]]:
    """(where, pattern) of every ``pattern`` and ``patternProperties`` key in a schema."""
    found = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "pattern" and isinstance(value, str):
                found.append((where, value))
            elif key == "patternProperties":
                found += [(f"{where}.patternProperties", pattern) for pattern in value]
            found += schema_patterns(value, f"{where}.{key}")
    elif isinstance(schema, list):
        for index, item in enumerate(schema):
            found += schema_patterns(item, f"{where}.{index}")
    return found


PATTERNS = [
    (f"{path.name}{where}", pattern)
    for path in sorted(SCHEMA_DIR.glob("*.schema.yaml"))
    for where, pattern in schema_patterns(load_schema(path.name.removesuffix(".schema.yaml")))
]


def test_the_schemas_have_patterns():
    assert len(PATTERNS) >= 15


@pytest.mark.parametrize(("where", "pattern"), PATTERNS, ids=[where for where, _ in PATTERNS])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_schema_pattern_matches_whole_strings_only(where, pattern, data):
    """What jsonschema accepts (re.search) is what the pattern matches as a whole: a name that passes
    never ends in a newline or carries text before or after the part the pattern describes."""
    text = data.draw(st.from_regex(pattern, fullmatch=True))
    for variant in (text, text + "\n", "\n" + text, text + "\nx", "x" + text, text + "x"):
        assert bool(re.search(pattern, variant)) == bool(re.fullmatch(pattern, variant)), (where, variant)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("campaign", "probe-nl\n"),
        ("site", "local\n"),
        ("run", "r1\n"),
        ("history", {"store": "sqlite:///results/history.db\n"}),
    ],
)
def test_a_name_ending_in_a_newline_is_refused_by_check(tmp_path, capsys, key, value):
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(default_config() | {key: value}))
    assert main(["check", str(path), "--config-dir", str(CONFIG_DIR)]) == EXIT_USAGE
    assert f"{path}: key '{key}" in capsys.readouterr().err
