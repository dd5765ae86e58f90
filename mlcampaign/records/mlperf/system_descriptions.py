"""MLPerf HPC systems descriptions (``<submitter>/systems/<system>.json``) as mlperf-logging checks them:
the fields package_checker requires, a description read and checked as it checks it (its
``system_desc_checker``), and a description in the project's terms. Exporting a submission writes one
(mlcampaign.records.mlperf.submission); importing a round reads them (mlcampaign.history.published_rounds)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mlperf_logging.system_desc_checker import system_desc_checker

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
SYSTEM_NUMBERS = ("number_of_nodes", "accelerators_per_node", "host_processors_per_node")


def read_system_description(path: Path, ruleset: str) -> dict:
    """A systems JSON (``<submitter>/systems/<system>.json``), checked as package_checker checks it
    (system_desc_checker) and with the numbers the summarizer reads; ResultLogError naming what is wrong."""
    if not path.is_file():
        raise ResultLogError(f"{path}: no systems description (every results/<system>/ has systems/<system>.json)")
    try:
        description = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ResultLogError(f"{path}: not JSON ({error})") from None
    if not isinstance(description, dict):
        raise ResultLogError(f"{path}: a systems description is a JSON object, not {type(description).__name__}")
    missing = [field for field in SYSTEM_FIELDS if field not in description]
    if missing:
        raise ResultLogError(f"{path}: lacks the field(s) {', '.join(missing)} (system_desc_checker)")
    messages = _system_checker_messages(path, ruleset)
    if messages:
        raise ResultLogError(f"{path}: fails system_desc_checker: {'; '.join(messages)}")
    for field in SYSTEM_NUMBERS:
        try:
            int(description[field])
        except (TypeError, ValueError):
            raise ResultLogError(f"{path}: key {field!r}: value {description[field]!r} is not a whole number") from None
    return description


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.messages.append(record.getMessage().strip())


def _system_checker_messages(path: Path, ruleset: str) -> list[str]:
    capture = _Messages()
    logging.root.addHandler(capture)
    try:
        valid, *_ = system_desc_checker.check_system_desc(str(path), USAGE, ruleset)
    finally:
        logging.root.removeHandler(capture)
    return [] if valid else capture.messages or ["not valid"]


def system_summary(description: dict) -> dict:
    """A systems JSON in the project's terms: nodes, accelerators per node (0: a CPU-only system, such as
    Fugaku's A64FX, whose accelerator is none), their model, the host CPU and the framework."""
    accelerators = int(description["accelerators_per_node"])
    return {
        "submitter": description["submitter"],
        "division": description["division"],
        "availability": description["status"],
        "system_name": description["system_name"],
        "nodes": int(description["number_of_nodes"]),
        "accelerators_per_node": accelerators,
        "accelerator": description["accelerator_model_name"] if accelerators > 0 else None,
        "host_cpu": description["host_processor_model_name"],
        "host_processors_per_node": int(description["host_processors_per_node"]),
        "host_cores": description["host_processor_core_count"],
        "framework": description["framework"],
    }
