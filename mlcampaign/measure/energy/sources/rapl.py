"""CPU packages (and their DRAM zones) through Linux powercap, ``/sys/class/powercap/intel-rapl:<n>[:<m>]/energy_uj``
(µJ; AMD CPUs too), wrapping at ``max_energy_range_uj``. Since 2020 kernels make ``energy_uj`` readable only
by root. The packages are shared by the ranks of a node: a node's first process measures them
(mlcampaign.measure.instruments)."""

from __future__ import annotations

from pathlib import Path

from mlcampaign.measure.energy.source import PowerSourceKind, SourceReading, SourceUnavailable

POWERCAP_ROOT = Path("/sys/class/powercap")


class RaplSource:
    """CPU package (and DRAM) energy counters of Linux powercap. Core/uncore subzones are part of their
    package and left out, so the zones' sum counts nothing twice."""

    name = "rapl"

    def __init__(self, root: Path = POWERCAP_ROOT):
        self._files: dict[str, Path] = {}
        self.counter_range_j: dict[str, float] = {}
        zones = sorted(root.glob("intel-rapl:*")) if root.is_dir() else []
        for zone in zones:
            depth = zone.name.count(":")
            try:
                name = (zone / "name").read_text().strip()
            except OSError:
                continue
            if depth == 1:
                label = name
            elif depth == 2 and name == "dram":
                package_name = root / zone.name.rsplit(":", 1)[0] / "name"
                label = f"{package_name.read_text().strip() if package_name.is_file() else zone.name}/dram"
            else:
                continue
            try:
                int((zone / "energy_uj").read_text())
                self.counter_range_j[label] = int((zone / "max_energy_range_uj").read_text()) / 1e6
            except PermissionError as error:
                raise SourceUnavailable(f"{zone / 'energy_uj'} is readable only by root") from error
            except (OSError, ValueError) as error:
                raise SourceUnavailable(f"{zone}: {error}") from error
            self._files[label] = zone / "energy_uj"
        if not self._files:
            raise SourceUnavailable(f"no RAPL package zones under {root}")
        self.description = f"Linux powercap RAPL energy_uj counters of {', '.join(self._files)}"

    def read(self) -> SourceReading:
        return SourceReading(energy_j={label: int(path.read_text()) / 1e6 for label, path in self._files.items()})

    def close(self) -> None:
        pass


# Every core of the node's packages, whichever GPUs this process measures.
SOURCE = PowerSourceKind("RAPL", lambda gpu_indices: RaplSource(), order=30)
