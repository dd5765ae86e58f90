"""Staging: source (a generator or a path on the system's filesystem) -> verified files + manifest.

Files are written to a temporary sibling directory and renamed into place only once the
manifest is complete, so an interrupted staging never leaves a directory that looks finished.
"""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

from mlcampaign.data.generators import GENERATORS
from mlcampaign.data.manifest import DatasetError, build_manifest, verify, write_manifest


def stage(dataset: dict, data_dir: Path, manifest_path: Path) -> dict:
    """Stage ``dataset`` (a benchmark config's ``dataset`` block) into ``data_dir``; return its manifest."""
    data_dir, manifest_path = Path(data_dir), Path(manifest_path)
    source = dataset["source"]
    tmp_dir = data_dir.with_name(data_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    started = time.time()
    if "generator" in source:
        GENERATORS[source["generator"]](tmp_dir, **source.get("options", {}))
        manifest = build_manifest(tmp_dir, dataset["name"], dataset["format"])
    else:
        origin = Path(source["path"])
        if not origin.is_dir():
            raise DatasetError(f"dataset '{dataset['name']}': source path {origin} is not a directory")
        manifest = build_manifest(origin, dataset["name"], dataset["format"])
        shutil.copytree(origin, tmp_dir)
        verify(tmp_dir, manifest)
    manifest["source"] = source
    manifest["staging"] = {"seconds": time.time() - started, "host": socket.gethostname()}
    shutil.rmtree(data_dir, ignore_errors=True)
    tmp_dir.rename(data_dir)
    tmp_manifest = manifest_path.with_name(manifest_path.name + ".tmp")
    write_manifest(manifest, tmp_manifest)
    tmp_manifest.rename(manifest_path)
    return manifest
