"""Config files and their JSON schemas: strict YAML reading, validation with defaults, registry enums.

Every YAML file the project reads (schemas, campaigns, systems, benchmarks, published studies) goes
through ``load_yaml``, which refuses what PyYAML silently accepts: a key given twice in one mapping
(the second would win), an empty file and a top level that is not a mapping; and, before any work
that grows with them, a file that is not a regular file (a named pipe would wait for a writer,
/dev/zero never ends), a file of more than ``MAX_YAML_BYTES``, a document of more than
``MAX_YAML_VALUES`` values once its aliases are expanded (a 700-byte "alias bomb" expands to
hundreds of millions: every reader of the data would walk them all), a recursive alias and nesting
deeper than Python's recursion allows. Its errors name the file and the line. ``validate`` refuses
unknown top-level keys first, then a document of more than ``MAX_YAML_VALUES`` values (Snakemake reads
``--config`` values as YAML, aliases as shared lists), then keys that are not strings and numbers that
are not finite (YAML's .nan and .inf, which JSON has not), then reports every schema problem of a
document at once, each with the file, the key path and the value, and fills in the schema's defaults
(as snakemake.utils.validate does). ``read_regular_file`` and ``read_json_file`` read any file so, within
a bound of its size (the files of a run folder: mlcampaign.plan.runs.read_run_json).

Schemas name registries instead of repeating them: a property with ``x-registry: <name>`` gets
``enum`` = the names of that registry (``registries``: mlcampaign.plan.registry, the metrics table and the
launchers), a mapping with ``x-registry-keys: {registry: <name>, value: <schema>}`` one property per name,
and the record's ``metrics`` and ``canaries`` blocks (``x-metrics``, ``x-canaries``) are generated from
mlcampaign.plan.metrics and mlcampaign.plan.canaries, so a model, format, generator, metric, canary or launcher is
declared in one place. A default that code uses too is declared in
code, and a property with ``x-default: <name>`` gets it (``CODE_DEFAULTS``). A number with ``x-unit: <unit>``
gets the
``minimum`` and ``maximum`` of that unit (mlcampaign.plan.metrics.UNIT_BOUNDS): a negative time or
1e308 samples per second is no measurement. A text with ``x-name: true`` is a name (mlcampaign.plan.names): it
gets the names' pattern (unless it has a stricter one of its own) and their maximum length.

Every ``pattern`` matches the whole string: JSON Schema's ``$`` is the end of the text, Python's
(which jsonschema uses) also matches before a final newline, so patterns end in ``$(?!\n)``
(``campaign: "name\n"`` would otherwise name a folder with a newline).
"""

from __future__ import annotations

import copy
import errno
import functools
import itertools
import os
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from mlcampaign.plan import registry
from mlcampaign.plan.canaries import record_canaries_schema
from mlcampaign.plan.launchers import LAUNCHERS, NO_LAUNCHER
from mlcampaign.plan.metrics import COMPARABLE_METRICS, UNIT_BOUNDS, record_metrics_schema
from mlcampaign.plan.names import MAX_NAME_LENGTH, NAME_PATTERN
from mlcampaign.plan.numbers import loads_json, non_finite_numbers
from mlcampaign.plan.urls import DEFAULT_STORE_URL, mask_passwords, shown_url

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
# Defaults declared in code (x-default in a schema): the command line uses them too.
CODE_DEFAULTS = {"store_url": DEFAULT_STORE_URL}


@functools.cache
def registries() -> dict[str, tuple[str, ...]]:
    """Registry name (x-registry in a schema) -> the names an enum of it allows."""
    models = registry.models()
    return {
        "models": tuple(models),
        "data_formats": tuple(registry.data_formats()),
        "generators": tuple(registry.generators()),
        "quality_metrics": tuple(dict.fromkeys(m for model in models.values() for m in model.quality_metrics)),
        "precisions": tuple(registry.PRECISIONS),
        "compressions": registry.COMPRESSIONS,
        "comparable_metrics": tuple(COMPARABLE_METRICS),
        "failure_reasons": tuple(registry.FAILURE_REASONS),
        "launchers": (*LAUNCHERS, NO_LAUNCHER),
    }


class ConfigError(ValueError):
    """A config file does not satisfy its schema or refers to something that does not exist."""

    def __init__(self, message: str) -> None:
        # A value named in the message may be a store URL with a password (history.store): never shown.
        super().__init__(mask_passwords(message))


_NOT_REGULAR = {
    stat.S_IFIFO: "a named pipe, which would wait for a writer",
    stat.S_IFCHR: "a device, which may never end, as /dev/zero",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
}


def read_regular_file(path: Path, max_bytes: int, over: str, inside: Path | None = None) -> bytes:
    """The content of ``path`` if it is a regular file of at most ``max_bytes``; ConfigError naming the file
    otherwise (``over`` words the bound: "over the limit of a bundle member (N bytes)"). Opened without
    waiting (a named pipe is refused, not read) and read no further than the bound (nor is a device, a file
    that grows meanwhile or one of /proc's, which say they are empty). ``inside``: a folder ``path`` lies in,
    below which no link is followed (a run's files: nothing outside the run is read, even if its folders
    change meanwhile). A missing file raises FileNotFoundError: its callers say what it means."""
    path = Path(path)
    descriptor = _open_regular(path, inside)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            kind = _NOT_REGULAR.get(stat.S_IFMT(status.st_mode), "not a file to read")
            raise ConfigError(f"{path}: not a regular file ({kind}); only regular files are read")
        if status.st_size > max_bytes:
            raise ConfigError(f"{path}: {status.st_size} bytes, {over}")
        with open(descriptor, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ConfigError(f"{path}: more than {max_bytes} bytes, {over}")
        return data
    finally:
        os.close(descriptor)


def _open_regular(path: Path, inside: Path | None) -> int:
    """``path`` opened for reading without waiting, below ``inside`` one folder at a time without following a
    link (read_regular_file)."""
    if inside is None:
        try:
            return os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise
        except OSError as error:
            raise ConfigError(f"{path}: cannot be read: {error.strerror}") from None
    inside = Path(inside)
    parts = path.relative_to(inside).parts
    try:
        descriptor = os.open(inside, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise ConfigError(f"{path}: cannot be read: {inside}: {error.strerror}") from None
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        # O_NONBLOCK: opening a named pipe must not wait for a writer (read_regular_file refuses it).
        flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_NONBLOCK if last else os.O_DIRECTORY)
        try:
            opened = os.open(part, flags, dir_fd=descriptor)
        except OSError as error:
            reached = inside.joinpath(*parts[: depth + 1])
            if error.errno in (errno.ELOOP, errno.ENOTDIR) and reached.is_symlink():
                raise ConfigError(
                    f"{reached}: a link (to {os.readlink(reached)!r}); a run's files are read as regular files, "
                    "never through a link, so that nothing from elsewhere is taken for the run's"
                ) from None
            if isinstance(error, FileNotFoundError):
                raise
            raise ConfigError(f"{path}: cannot be read: {error.strerror}") from None
        finally:
            os.close(descriptor)
        descriptor = opened
    return descriptor


def read_json_file(path: Path, max_bytes: int, over: str, inside: Path | None = None) -> Any:
    """The JSON document in ``path``, read as read_regular_file reads it; ConfigError naming the file for one
    that is not JSON, or is nested deeper than Python's recursion limit (a 100 000-deep document is a few
    hundred kB)."""
    data = read_regular_file(path, max_bytes, over, inside)
    try:
        return loads_json(data)
    except ValueError as error:
        raise ConfigError(f"{path}: not JSON: {error}") from None
    except RecursionError:
        raise ConfigError(
            f"{path}: not JSON this reader takes: nested deeper than Python's recursion limit "
            f"({sys.getrecursionlimit()})"
        ) from None


# A config file is written by hand: the largest here is 6 kB. PyYAML reads under a megabyte a second.
MAX_YAML_BYTES = 1024 * 1024
# Values (scalars, lists, mappings) of one document with its aliases expanded: a campaign has hundreds.
MAX_YAML_VALUES = 100_000


def _expanded_values(root: yaml.Node) -> int:
    """How many values the document of ``root`` holds with every alias expanded (an aliased node counts
    each time it is reached). ComposerError at the node whose values pass MAX_YAML_VALUES, or at an
    alias to the node that holds it (a recursive document)."""
    counted: dict[int, int] = {}
    open_nodes: set[int] = set()

    def count(node: yaml.Node) -> int:
        if id(node) in counted:
            return counted[id(node)]
        if id(node) in open_nodes:
            raise yaml.composer.ComposerError(
                None,
                None,
                "an alias refers to the list or mapping that holds it (a recursive document)",
                node.start_mark,
            )
        open_nodes.add(id(node))
        children = (
            [child for pair in node.value for child in pair] if isinstance(node, yaml.MappingNode)
            else node.value if isinstance(node, yaml.SequenceNode)
            else []
        )  # fmt: skip
        total = 1
        for child in children:
            total += count(child)
            if total > MAX_YAML_VALUES:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"this value holds more than {MAX_YAML_VALUES} values, aliases expanded (a config file "
                    "holds hundreds; aliases that repeat each other, an alias bomb, can hold billions)",
                    node.start_mark,
                )
        open_nodes.discard(id(node))
        counted[id(node)] = total
        return total

    return count(root)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key that appears twice in one mapping, and a document that its
    aliases expand beyond MAX_YAML_VALUES values (checked on the composed nodes, before any is built)."""

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _expanded_values(node)
        return node

    def construct_mapping(self, node, deep=False):
        first_line = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first_line.get(key)
            except TypeError:  # an unhashable key (a YAML mapping or list as key): PyYAML reports it below
                break
            if seen is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in one mapping (first on line {seen})",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


_TOO_LARGE = (
    f"more than the {MAX_YAML_BYTES} a config file may have (config files are written by hand; is this the right file?)"
)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text as data; ConfigError naming ``source`` and the line of a syntax error, a duplicate key,
    or aliases that expand too far; ConfigError for text over MAX_YAML_BYTES or nested too deeply."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{source}: {len(text.encode())} bytes, {_TOO_LARGE}")
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except RecursionError:
        raise ConfigError(f"{source}: not valid YAML: lists or mappings nested too deeply") from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = error.problem or error.context or str(error)
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML: {error}") from None


def load_yaml(path: Path) -> dict:
    """A YAML file whose top level is a mapping; ConfigError naming the file (and line) otherwise."""
    path = Path(path)
    try:
        text = read_regular_file(path, MAX_YAML_BYTES, _TOO_LARGE).decode()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: cannot be read: {error}") from None
    data = parse_yaml(text, str(path))
    if data is None:
        raise ConfigError(f"{path}: the file is empty (expected a mapping of keys to values)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _expand(schema: Any) -> Any:
    """``schema`` with ``enum`` set wherever a subschema names a registry (``x-registry``), ``default``
    wherever it names a default of code (``x-default``), and the record's metrics and canaries blocks generated
    from their tables (``x-metrics``, ``x-canaries``)."""
    if isinstance(schema, dict):
        filled = {key: _expand(value) for key, value in schema.items()}
        if "x-registry" in filled:
            filled["enum"] = list(registries()[filled["x-registry"]])
        if "x-registry-keys" in filled:
            keys = filled["x-registry-keys"]
            filled["properties"] = {name: keys["value"] for name in registries()[keys["registry"]]}
        if "x-default" in filled:
            filled["default"] = CODE_DEFAULTS[filled["x-default"]]
        if "x-metrics" in filled:
            filled |= _expand(record_metrics_schema())
        if "x-canaries" in filled:
            filled |= _expand(record_canaries_schema())
        if filled.get("x-unit") in UNIT_BOUNDS:
            filled["minimum"], filled["maximum"] = UNIT_BOUNDS[filled["x-unit"]]
        if filled.get("x-name"):
            filled.setdefault("pattern", NAME_PATTERN)
            filled["maxLength"] = MAX_NAME_LENGTH
        return filled
    if isinstance(schema, list):
        return [_expand(item) for item in schema]
    return schema


@functools.cache
def _schema(name: str) -> dict:
    return _expand(load_yaml(SCHEMA_DIR / f"{name}.schema.yaml"))


def load_schema(name: str) -> dict:
    """``mlcampaign/plan/schemas/<name>.schema.yaml`` with its registry enums (a copy: callers may change it)."""
    return copy.deepcopy(_schema(name))


def schema_default(name: str, *keys: str):
    """The default that schema ``name`` declares for the property at ``keys`` (e.g. "regression", "metrics"):
    the one declaration of a default, for code that reads configs validated before the key existed."""
    schema = _schema(name)
    for key in keys:
        schema = schema["properties"][key]
    return copy.deepcopy(schema["default"])


def _is_integer(_checker, instance) -> bool:
    """JSON Schema's integer admits 7.0; a config's integers must be written as integers (a seed of 7.0
    would derive other trial seeds than 7, and 1.0 trials cannot be counted)."""
    return isinstance(instance, int) and not isinstance(instance, bool)


_Draft = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


def _extend_with_defaults(validator_class):
    """A validator that fills in ``default`` values while it validates (as snakemake.utils.validate does)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema:
                    instance.setdefault(name, copy.deepcopy(subschema["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_DefaultingValidator = _extend_with_defaults(_Draft)


@functools.cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    """A (non-defaulting) validator of schema ``name``, built once per process."""
    return _Draft(_schema(name))


def _key_path(path) -> str:
    return ".".join(str(part) for part in path) or "<top level>"


def _non_string_keys(instance: Any, path: tuple = ()) -> Iterator[tuple]:
    """Paths to mapping keys that are not strings: YAML reads `1: x` as an integer key, but a config
    is a JSON document (schemas, trial specs), and such keys fail deep inside instead of here."""
    if isinstance(instance, Mapping):
        for key, value in instance.items():
            yield from _non_string_keys(value, (*path, key)) if isinstance(key, str) else [(*path, key)]
    elif isinstance(instance, list):
        for index, value in enumerate(instance):
            yield from _non_string_keys(value, (*path, index))


def _key_past_the_bound(instance: Any) -> str | None:
    """The top-level key of ``instance`` at which its values pass MAX_YAML_VALUES, or None: every list,
    mapping, key and scalar counts, and a list or mapping each time it is reached (Snakemake's --config reads
    YAML aliases as shared lists: a few hundred bytes hold billions). Counted without recursion and no further
    than the bound, so a recursive document stops too."""
    if not isinstance(instance, Mapping):
        return None
    counted = 0
    for key, value in instance.items():
        pending = [iter((value,))]
        while pending:
            item = next(pending[-1], pending)
            if item is pending:  # that list or mapping is done
                pending.pop()
                continue
            counted += 1
            if counted > MAX_YAML_VALUES:
                return str(key)
            if isinstance(item, Mapping):
                pending.append(itertools.chain.from_iterable(item.items()))
            elif isinstance(item, list):
                pending.append(iter(item))
    return None


def _unknown_top_level_keys(instance: Any, schema: dict) -> list[str]:
    if not isinstance(instance, Mapping) or schema.get("additionalProperties") is not False:
        return []
    return sorted(str(key) for key in instance if key not in schema.get("properties", {}))


def _problems(error: jsonschema.ValidationError, source_of: Callable[[list], str]) -> list[str]:
    """The lines of one schema error, naming the key itself where a key is unknown or missing (instead of
    the mapping that holds it, which at the top level would print the whole config), and saying what
    a subschema wants in words where it says so (``x-error``)."""
    path = list(error.absolute_path)
    source = source_of(path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(str(key) for key in error.instance if key not in allowed)
        return [
            f"  {source}: key '{_key_path([*path, key])}': unknown key (allowed here: {', '.join(allowed)})"
            for key in unknown
        ]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        return [f"  {source}: key '{_key_path([*path, name])}': missing (required)" for name in missing]
    text = repr(error.instance)
    if isinstance(error.instance, dict) and len(text) > 120:
        text = f"a mapping with keys {sorted(map(str, error.instance))}"
    # A composition (oneOf, anyOf) fails with a message about subschemas; a schema can say it in words.
    worded = error.validator in ("oneOf", "anyOf") and isinstance(error.schema, dict) and "x-error" in error.schema
    message = error.schema["x-error"] if worded else error.message
    if isinstance(error.instance, str) and "://" in error.instance:
        # A store URL, perhaps inside a --config value Snakemake read as text: its password is never shown.
        text, message = repr(shown_url(error.instance)), message.replace(text, repr(shown_url(error.instance)))
    if error.validator == "type" and "boolean" in error.validator_value and error.instance in ("true", "false"):
        message += " (snakemake --config reads only True and False as booleans)"
    return [f"  {source}: key '{_key_path(path)}': value {text}: {message}"]


def validate(instance: Any, schema_name: str, source: str, source_of: Callable[[list], str] | None = None) -> Any:
    """Validate ``instance`` (filling defaults in place) or raise ConfigError listing every problem.

    ``source`` names where the document comes from; ``source_of`` (key path -> text), where its keys
    may come from several places (campaign files and --config)."""
    source_of = source_of or (lambda _path: source)
    # Unknown top-level keys first: what they hold may be large, and nothing else need read it.
    schema = _schema(schema_name)
    unknown = _unknown_top_level_keys(instance, schema)
    if unknown:
        allowed = ", ".join(sorted(schema["properties"]))
        lines = [f"  {source_of([key])}: key '{key}': unknown key (allowed here: {allowed})" for key in unknown]
        raise ConfigError(f"invalid {schema_name} configuration ({len(lines)} problem(s)):\n" + "\n".join(lines))
    # Then the document's size, before anything walks it (its values, and jsonschema's messages, which print them).
    too_many = _key_past_the_bound(instance)
    if too_many is not None:
        raise ConfigError(
            f"invalid {schema_name} configuration (1 problem(s)):\n  {source_of([too_many])}: key '{too_many}': "
            f"the document holds more than {MAX_YAML_VALUES} values, aliases expanded (a config holds hundreds; "
            "aliases that repeat each other, an alias bomb, can hold billions)"
        )
    bad_keys = list(_non_string_keys(instance))
    if bad_keys:
        lines = [
            f"  {source_of(list(path))}: key '{'.'.join(map(str, path))}': value {path[-1]!r}: keys must be strings "
            "(quote it)"
            for path in bad_keys
        ]
        raise ConfigError(f"invalid {schema_name} configuration ({len(lines)} problem(s)):\n" + "\n".join(lines))
    not_finite = list(non_finite_numbers(instance))
    if not_finite:
        lines = [
            f"  {source_of(list(path))}: key '{_key_path(path)}': value {value!r}: not a finite number"
            for path, value in not_finite
        ]
        raise ConfigError(f"invalid {schema_name} configuration ({len(lines)} problem(s)):\n" + "\n".join(lines))
    errors = sorted(
        _DefaultingValidator(schema).iter_errors(instance),
        key=lambda e: list(map(str, e.absolute_path)),
    )
    if errors:
        lines = [line for error in errors for line in _problems(error, source_of)]
        raise ConfigError(f"invalid {schema_name} configuration ({len(lines)} problem(s)):\n" + "\n".join(lines))
    return instance
