"""AMD GPUs through ``amdsmi`` (shipped with ROCm): the energy accumulator times its resolution (µJ), socket
power (W), ``gfx_activity`` (%), VRAM used (bytes)."""

from __future__ import annotations

from mlcampaign.measure.energy.source import PowerSourceKind, SourceReading, SourceUnavailable


class AmdSmiSource:
    """AMD GPUs through amdsmi (ROCm's Python bindings). ``indices``: positions in amdsmi's handle list."""

    name = "amdsmi"

    def __init__(self, indices: list[int] | None = None):
        try:
            import amdsmi
        except ImportError as error:
            raise SourceUnavailable("amdsmi is not installed (it ships with ROCm)") from error
        self._amdsmi = amdsmi
        try:
            amdsmi.amdsmi_init()
        except amdsmi.AmdSmiException as error:
            raise SourceUnavailable(f"amdsmi did not initialise: {error}") from error
        try:
            handles = amdsmi.amdsmi_get_processor_handles()
            if not handles:
                raise SourceUnavailable("amdsmi sees no AMD GPU")
            chosen = range(len(handles)) if indices is None else indices
            self._handles_by_label = {f"gpu{index}": handles[index] for index in chosen}
            for handle in self._handles_by_label.values():
                self._energy_j(handle)  # fails here, not mid-trial, where the GPU has no energy counter
        except (amdsmi.AmdSmiException, SourceUnavailable):
            amdsmi.amdsmi_shut_down()
            raise
        self.counter_range_j: dict[str, float] = {}
        devices = ", ".join(self._handles_by_label)
        self.description = f"amdsmi energy accumulator x counter_resolution (amdsmi_get_energy_count) on {devices}"

    def _energy_j(self, handle) -> float:
        count = self._amdsmi.amdsmi_get_energy_count(handle)
        # ROCm 6.2+ names the accumulator "energy_accumulator"; earlier releases called it "power".
        accumulator = count["energy_accumulator"] if "energy_accumulator" in count else count["power"]
        return accumulator * count["counter_resolution"] / 1e6  # counter_resolution: µJ per count

    def read(self) -> SourceReading:
        amdsmi, reading = self._amdsmi, SourceReading()
        for label, handle in self._handles_by_label.items():
            reading.energy_j[label] = self._energy_j(handle)
            try:
                power = amdsmi.amdsmi_get_power_info(handle)
                watts = next(
                    (
                        power[key]
                        for key in ("socket_power", "current_socket_power", "average_socket_power")
                        if isinstance(power.get(key), int | float)
                    ),
                    None,
                )
                if watts is not None:
                    reading.power_w[label] = float(watts)
                activity = amdsmi.amdsmi_get_gpu_activity(handle).get("gfx_activity")
                if isinstance(activity, int | float):
                    reading.utilization_pct[label] = float(activity)
                reading.memory_used_bytes[label] = int(
                    amdsmi.amdsmi_get_gpu_memory_usage(handle, amdsmi.AmdSmiMemoryType.VRAM)
                )
            except amdsmi.AmdSmiException:
                pass  # power, activity and memory are extras; energy goes on without them
        return reading

    def close(self) -> None:
        self._amdsmi.amdsmi_shut_down()


SOURCE = PowerSourceKind("amdsmi", AmdSmiSource, order=20)
