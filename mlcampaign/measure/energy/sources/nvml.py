"""NVIDIA GPUs through NVML (``nvidia-ml-py``, module ``pynvml``): energy from the total-energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded; Volta and newer), else by integrating
``nvmlDeviceGetPowerUsage`` (mW) samples; power, utilisation (``nvmlDeviceGetUtilizationRates().gpu``, %) and
memory used (``nvmlDeviceGetMemoryInfo().used``, bytes: the whole device, other processes included) at
every sample."""

from __future__ import annotations

import os

from mlcampaign.measure.energy.source import PowerSourceKind, SourceReading, SourceUnavailable


class NvmlSource:
    """NVIDIA GPUs through NVML. ``indices``: NVML (PCI-order) indices; default: all devices, or those in
    ``CUDA_VISIBLE_DEVICES`` (integers as NVML indices — set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for CUDA to
    agree —, ``GPU-<uuid>`` by UUID; MIG instances have no energy reading of their own)."""

    name = "nvml"

    def __init__(self, indices: list[int] | None = None, environ: dict[str, str] | None = None):
        try:
            import pynvml
        except ImportError as error:
            raise SourceUnavailable("nvidia-ml-py (module pynvml) is not installed") from error
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise SourceUnavailable(f"NVML did not initialise: {error}") from error
        try:
            handles = self._handles(indices, environ)
            self._counter = {label: self._has_counter(handle) for label, handle in handles.items()}
            names = {label: pynvml.nvmlDeviceGetName(handle) for label, handle in handles.items()}
            driver = pynvml.nvmlSystemGetDriverVersion()
        except (pynvml.NVMLError, SourceUnavailable):
            pynvml.nvmlShutdown()
            raise
        self._handles_by_label = handles
        self.counter_range_j: dict[str, float] = {}
        counters = [label for label, has in self._counter.items() if has]
        integrated = [label for label, has in self._counter.items() if not has]
        how = []
        if counters:
            how.append(f"total-energy counter (nvmlDeviceGetTotalEnergyConsumption) for {', '.join(counters)}")
        if integrated:
            how.append(f"integrated nvmlDeviceGetPowerUsage samples for {', '.join(integrated)}")
        devices = ", ".join(f"{label} {name}" for label, name in names.items())
        self.description = f"NVML (driver {driver}) on {devices}: {'; '.join(how)}"

    def _handles(self, indices: list[int] | None, environ: dict[str, str] | None) -> dict:
        nvml = self._nvml
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise SourceUnavailable("NVML sees no NVIDIA GPU")
        if indices is None:
            visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
            if visible is None:
                indices = list(range(count))
            else:
                entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
                if any(entry.startswith("MIG-") for entry in entries):
                    raise SourceUnavailable(
                        f"CUDA_VISIBLE_DEVICES={visible} names MIG instances: NVML has no per-instance energy"
                    )
                handles = {}
                for position, entry in enumerate(entries):
                    if entry.startswith("GPU-"):
                        handles[f"gpu{position}"] = nvml.nvmlDeviceGetHandleByUUID(entry)
                    elif entry.isdigit() and int(entry) < count:
                        handles[f"gpu{position}"] = nvml.nvmlDeviceGetHandleByIndex(int(entry))
                    else:
                        break  # CUDA stops enumerating at the first invalid entry
                if not handles:
                    raise SourceUnavailable(f"CUDA_VISIBLE_DEVICES={visible} names no NVML device")
                return handles
        return {f"gpu{index}": nvml.nvmlDeviceGetHandleByIndex(index) for index in indices}

    def _has_counter(self, handle) -> bool:
        try:
            self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except self._nvml.NVMLError_NotSupported:
            return False
        return True

    def read(self) -> SourceReading:
        nvml, reading = self._nvml, SourceReading()
        for label, handle in self._handles_by_label.items():
            if self._counter[label]:
                reading.energy_j[label] = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3  # mJ
            reading.power_w[label] = nvml.nvmlDeviceGetPowerUsage(handle) / 1e3  # mW
            try:
                reading.utilization_pct[label] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                reading.memory_used_bytes[label] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            except nvml.NVMLError_NotSupported:
                pass  # utilisation and memory are extras; energy goes on without them
        return reading

    def close(self) -> None:
        self._nvml.nvmlShutdown()


SOURCE = PowerSourceKind("NVML", NvmlSource, order=10)
