"""MLPerf HPC systems descriptions (``<submitter>/systems/<system>.json``) as mlperf-logging checks them:
the fields package_checker requires, a description read and checked as it checks it (its
``system_desc_checker``), and a description in the project's terms. Exporting a submission writes one
(mlcampaign.records.mlperf.submission); importing a round reads them (mlcampaign.history.published_rounds)."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from mlperf_logging.system_desc_checker import system_desc_checker

from mlcampaign.plan.numbers import loads_json
from mlcampaign.records.mlperf.result_logs import USAGE, ResultLogError

# system_desc_checker.check_system_desc's required fields (all present; "" is accepted for any). The
# summarizer also reads numbers from number_of_nodes, host_processors_per_node and accelerators_per_node.
SYSTEM_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes", "host_processors_per_node",
    "host_processor_model_name", "host_processor_core_count", "host_processor_vcpu_count",
    "host_processor_frequency", "host_processor_caches", "host_processor_interconnect", "host_memory_capacity",
    "host_storage_type", "host_storage_capacity", "host_networking", "host_networking_topology",
    "host_memory_configuration", "accelerators_per_node", "accelerator_model_name",
    "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
    "accelerator_memory_configuration", "accelerator_memory_capacity", "accelerator_interconnect",
    "accelerator_interconnect_topology", "cooling", "hw_notes", "framework", "other_software_stack",
    "operating_system", "sw_notes",
)  # fmt: skip
# Counts the summarizer reads as numbers (int()): each a whole number, as a JSON number or a string of digits.
SYSTEM_NUMBERS = ("number_of_nodes", "accelerators_per_node", "host_processors_per_node")
# What a systems description's accelerator model is where a node has none (Fugaku's A64FX: "N/A").
NO_ACCELERATOR = frozenset({"", "n/a", "na", "none", "-"})
# The value types the published rounds use: a JSON string or number for every field (v1.0 and v2.0 rounds write
# counts as numbers, v3.0 as strings), and an object for the software stack too.
_OBJECT_FIELDS = frozenset({"other_software_stack"})


def read_system_description(path: Path, ruleset: str) -> dict:
    """A systems JSON (``<submitter>/systems/<system>.json``), checked as package_checker checks it
    (system_desc_checker), its fields typed as the published rounds type them and its counts whole: nodes and
    host processors per node at least 1, accelerators per node at least 1, or 0 where the accelerator model
    is none. ResultLogError naming the file, the field and the value of what is wrong."""
    if not path.is_file():
        raise ResultLogError(f"{path}: no systems description (every results/<system>/ has systems/<system>.json)")
    try:
        description = loads_json(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ResultLogError(f"{path}: not JSON ({error})") from None
    if not isinstance(description, dict):
        raise ResultLogError(f"{path}: a systems description is a JSON object, not {type(description).__name__}")
    missing = [field for field in SYSTEM_FIELDS if field not in description]
    if missing:
        raise ResultLogError(f"{path}: lacks the field(s) {', '.join(missing)} (system_desc_checker)")
    for field in SYSTEM_FIELDS:
        _check_type(path, field, description[field])
    for field in SYSTEM_NUMBERS:
        _check_count(path, field, description[field], description["accelerator_model_name"])
    messages = _system_checker_messages(description, ruleset)
    if messages:
        raise ResultLogError(f"{path}: fails system_desc_checker: {'; '.join(messages)}")
    return description


def _check_type(path: Path, field: str, value) -> None:
    allowed = (str, int, float, dict) if field in _OBJECT_FIELDS else (str, int, float)
    if isinstance(value, bool) or not isinstance(value, allowed):
        kinds = "a string, a number or an object" if field in _OBJECT_FIELDS else "a string or a number"
        raise ResultLogError(f"{path}: field {field!r}: value {value!r} is not {kinds} (a {_json_type(value)})")


def _json_type(value) -> str:
    names = {bool: "boolean", type(None): "null", list: "list", dict: "object", str: "string"}
    return names.get(type(value), "number")


def count_value(value) -> int | None:
    """A count of a systems description as a whole number (4, "4", 4.0), or None where it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    text = str(value).strip()
    return int(text) if text.lstrip("-").isdigit() else None


def _check_count(path: Path, field: str, value, accelerator_model) -> None:
    count = count_value(value)
    if count is None:
        raise ResultLogError(f"{path}: field {field!r}: value {value!r} is not a whole number")
    no_accelerator = str(accelerator_model).strip().lower() in NO_ACCELERATOR
    if field == "accelerators_per_node" and count == 0 and no_accelerator:
        return
    if count < 1:
        why = (
            f"a node of accelerator model {accelerator_model!r} has at least one (0 only where the model is N/A)"
            if field == "accelerators_per_node"
            else "a system has at least one"
        )
        raise ResultLogError(f"{path}: field {field!r}: value {value!r} is not a positive count: {why}")


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.messages.append(record.getMessage().strip())


def _system_checker_messages(description: dict, ruleset: str) -> list[str]:
    """system_desc_checker's verdict on the description. It joins some fields as text, so it is given them as
    text (a count written as a JSON number, as older rounds write it, would stop it with a TypeError)."""
    capture = _Messages()
    as_text = {key: value if isinstance(value, str | dict) else str(value) for key, value in description.items()}
    with tempfile.TemporaryDirectory(prefix="mlcampaign-system-") as folder:
        copy = Path(folder) / "system.json"
        copy.write_text(json.dumps(as_text), encoding="utf-8")
        logging.root.addHandler(capture)
        try:
            valid, *_ = system_desc_checker.check_system_desc(str(copy), USAGE, ruleset)
        finally:
            logging.root.removeHandler(capture)
    return [] if valid else capture.messages or ["not valid"]


def system_summary(description: dict) -> dict:
    """A systems JSON in the project's terms: nodes, accelerators per node (0: a CPU-only system, such as
    Fugaku's A64FX, whose accelerator is none), their model, the host CPU and the framework."""
    accelerators = count_value(description["accelerators_per_node"])
    return {
        "submitter": description["submitter"],
        "division": description["division"],
        "availability": description["status"],
        "system_name": description["system_name"],
        "nodes": count_value(description["number_of_nodes"]),
        "accelerators_per_node": accelerators,
        "accelerator": description["accelerator_model_name"] if accelerators > 0 else None,
        "host_cpu": description["host_processor_model_name"],
        "host_processors_per_node": count_value(description["host_processors_per_node"]),
        "host_cores": description["host_processor_core_count"],
        "framework": description["framework"],
    }
