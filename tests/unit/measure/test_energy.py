"""Energy accounting with injected sources (known readings -> known joules), the NVML/amdsmi/RAPL sources on
fake libraries and files, Slurm's ConsumedEnergy from a fake and a real sacct, and this machine."""

import json
import sys
import threading
import time
import types

import pytest

from mlcampaign.measure.energy.monitor import CounterError, EnergyMonitor, interval_energy_j, samples_per_joule
from mlcampaign.measure.energy.source import SourceReading, SourceUnavailable, default_sources
from mlcampaign.measure.energy.sources.amdsmi import AmdSmiSource
from mlcampaign.measure.energy.sources.nvml import NvmlSource
from mlcampaign.measure.energy.sources.rapl import RaplSource


class ScriptedSource:
    """Returns the given readings in turn; an exception in the list is raised instead."""

    def __init__(self, readings, name="fake", counter_range_j=None):
        self.name, self.description = name, f"scripted readings ({name})"
        self.counter_range_j = counter_range_j or {}
        self._readings = iter(readings)
        self.reads, self.closed = 0, False

    def read(self):
        self.reads += 1
        item = next(self._readings)
        if isinstance(item, Exception):
            raise item
        return item

    def close(self):
        self.closed = True


class Clock:
    """Hands out the given times, one per call."""

    def __init__(self, *times):
        self._times = iter(times)

    def __call__(self):
        return next(self._times)


def counter(*joules, device="gpu0"):
    return [SourceReading(energy_j={device: value}) for value in joules]


def power(*watts, device="gpu0"):
    return [SourceReading(power_w={device: value}) for value in watts]


def run_window(monitor, ticks_between):
    """begin, ``ticks_between`` periodic samples, end."""
    monitor.begin("timed")
    for _ in range(ticks_between):
        monitor.sample()
    return monitor.end("timed")


def test_energy_counter_differences_give_the_joules():
    source = ScriptedSource(counter(100.0, 150.0, 250.0, 400.0))
    window = run_window(EnergyMonitor([source], period_s=1.0, clock=Clock(0.0, 1.0, 2.0, 3.0)), 2)
    assert window["not_measured"] is None
    assert (window["duration_s"], window["energy_j"], window["mean_power_w"]) == (3.0, 300.0, 100.0)
    assert window["peak_power_w"] == 150.0  # the 250 -> 400 J second
    (entry,) = window["sources"]
    assert (entry["samples"], entry["energy_j"], entry["peak_power_w"]) == (4, 300.0, 150.0)
    assert "counter difference" in entry["peak_power_basis"]
    assert entry["devices"]["gpu0"]["energy_j"] == 300.0
    json.dumps(window)


def test_power_samples_are_integrated_by_trapezoids_and_the_peak_is_the_highest_reading():
    source = ScriptedSource(power(100.0, 200.0, 200.0, 100.0))
    window = run_window(EnergyMonitor([source], period_s=1.0, clock=Clock(0.0, 1.0, 2.0, 3.0)), 2)
    assert window["energy_j"] == 150.0 + 200.0 + 150.0
    (entry,) = window["sources"]
    assert entry["peak_power_w"] == 200.0 and "instantaneous" in entry["peak_power_basis"]


def test_a_counter_that_wraps_around_is_added_back():
    source = ScriptedSource(
        counter(900.0, 950.0, 20.0, 120.0, device="package-0"), counter_range_j={"package-0": 1000.0}
    )
    window = run_window(EnergyMonitor([source], period_s=1.0, clock=Clock(0.0, 1.0, 2.0, 3.0)), 2)
    assert window["energy_j"] == pytest.approx(50.0 + 70.0 + 100.0)


def test_a_counter_going_back_without_a_range_ends_that_source():
    source = ScriptedSource(counter(900.0, 950.0, 20.0))
    window = run_window(EnergyMonitor([source], period_s=1.0, clock=Clock(0.0, 1.0, 2.0)), 1)
    assert window["energy_j"] is None and window["sources"][0]["energy_j"] is None
    assert "went back from 950 J to 20 J" in window["not_measured"]


def test_a_source_that_raises_mid_trial_ends_only_its_own_measurement():
    failing = ScriptedSource([*counter(0.0, 10.0), RuntimeError("GPU has fallen off the bus")], name="nvml")
    healthy = ScriptedSource(counter(0.0, 5.0, 10.0, 15.0, 20.0, 25.0, device="package-0"), name="rapl")
    monitor = EnergyMonitor([failing, healthy], period_s=1.0, clock=Clock(0.0, 1.0, 2.0, 3.0, 4.0, 5.0))
    monitor.begin("trial")
    monitor.sample()
    monitor.sample()  # nvml raises here, 2 s into the window
    trial = monitor.end("trial")
    assert trial["energy_j"] is None
    assert trial["not_measured"] == (
        "not measured: nvml failed 2 s into the window: RuntimeError: GPU has fallen off the bus"
    )
    nvml, rapl = trial["sources"]
    assert nvml["energy_j"] is None and nvml["not_measured"] == trial["not_measured"]
    assert rapl["not_measured"] is None and rapl["energy_j"] == 15.0
    assert failing.reads == 3  # never read again
    monitor.begin("after")
    after = monitor.end("after")
    assert after["sources"][0]["not_measured"].startswith("not measured: nvml failed before this window: RuntimeError")
    assert failing.reads == 3


def test_no_source_is_not_measured_with_the_reasons_never_zero():
    monitor = EnergyMonitor([], ["NVML: NVML Shared Library Not Found", "RAPL: no RAPL package zones"])
    monitor.start()
    window = run_window(monitor, 1)
    monitor.stop()
    assert window["energy_j"] is None and window["mean_power_w"] is None and window["peak_power_w"] is None
    assert window["not_measured"] == (
        "not measured: no power source readable (NVML: NVML Shared Library Not Found; RAPL: no RAPL package zones)"
    )


def test_a_counter_that_does_not_advance_is_not_a_measured_zero():
    source = ScriptedSource(counter(500.0, 500.0))
    window = run_window(EnergyMonitor([source], period_s=1.0, clock=Clock(0.0, 0.05)), 0)
    assert window["energy_j"] is None
    assert window["not_measured"].startswith("not measured: fake reported no energy over 0.05 s")


def test_overlapping_windows_each_get_their_own_share():
    source = ScriptedSource(counter(0.0, 10.0, 30.0, 60.0, 100.0))
    monitor = EnergyMonitor([source], period_s=1.0, clock=Clock(0.0, 1.0, 2.0, 3.0, 4.0))
    monitor.begin("trial")  # t=0
    monitor.begin("timed")  # t=1
    monitor.sample()  # t=2
    timed = monitor.end("timed")  # t=3
    trial = monitor.end("trial")  # t=4
    assert (timed["duration_s"], timed["energy_j"]) == (2.0, 50.0)
    assert (trial["duration_s"], trial["energy_j"]) == (4.0, 100.0)


def test_window_names_are_checked():
    monitor = EnergyMonitor([ScriptedSource(counter(0.0, 1.0, 2.0))], period_s=1.0, clock=Clock(0.0, 1.0, 2.0))
    monitor.begin("timed")
    with pytest.raises(ValueError, match="'timed' is already open"):
        monitor.begin("timed")
    with pytest.raises(ValueError, match="'whole' is not open"):
        monitor.end("whole")
    with pytest.raises(ValueError, match="period_s must be positive"):
        EnergyMonitor([], period_s=0)


def test_utilisation_and_memory_high_water_mark_per_device():
    readings = [
        SourceReading(power_w={"gpu0": 300.0}, utilization_pct={"gpu0": 50.0}, memory_used_bytes={"gpu0": 10**9}),
        SourceReading(power_w={"gpu0": 300.0}, utilization_pct={"gpu0": 100.0}, memory_used_bytes={"gpu0": 3 * 10**9}),
        SourceReading(power_w={"gpu0": 300.0}, utilization_pct={"gpu0": 75.0}, memory_used_bytes={"gpu0": 2 * 10**9}),
    ]
    window = run_window(EnergyMonitor([ScriptedSource(readings)], period_s=1.0, clock=Clock(0.0, 1.0, 2.0)), 1)
    device = window["sources"][0]["devices"]["gpu0"]
    assert device["utilization_pct_mean"] == 75.0 and device["utilization_pct_max"] == 100.0
    assert device["memory_used_peak_bytes"] == 3 * 10**9
    assert device["energy_j"] == 600.0 and device["peak_power_w"] == 300.0


def test_a_sliver_interval_at_a_window_boundary_does_not_count_towards_the_peak():
    # A window ending 10 ms after a periodic sample: a 10 J counter step there would read as 1000 W.
    source = ScriptedSource(counter(0.0, 100.0, 110.0))
    window = run_window(EnergyMonitor([source], period_s=1.0, clock=Clock(0.0, 1.0, 1.01)), 1)
    assert window["energy_j"] == 110.0
    assert window["peak_power_w"] == 100.0 and window["sources"][0]["peak_power_w"] == 100.0


def test_the_sampling_thread_integrates_a_constant_power_exactly_and_stops():
    source = ScriptedSource(iter(lambda: SourceReading(power_w={"gpu0": 100.0}), None))
    monitor = EnergyMonitor([source], period_s=0.02).start()
    assert monitor.running and any(thread.name == "mlcampaign-energy" for thread in threading.enumerate())
    monitor.begin("timed")
    time.sleep(0.3)
    window = monitor.end("timed")
    monitor.stop()
    assert not monitor.running and source.closed
    assert window["sources"][0]["samples"] >= 3  # the thread sampled between begin and end
    assert window["energy_j"] == pytest.approx(100.0 * window["duration_s"])
    assert window["duration_s"] >= 0.3


def test_interval_energy_needs_every_device_in_both_readings():
    with pytest.raises(CounterError, match="gpu1: energy counter missing"):
        interval_energy_j(
            SourceReading(energy_j={"gpu0": 1.0, "gpu1": 1.0}), SourceReading(energy_j={"gpu0": 2.0}), 1.0, {}
        )
    with pytest.raises(CounterError, match="gpu0: power reading missing"):
        interval_energy_j(SourceReading(power_w={"gpu0": 1.0}), SourceReading(), 1.0, {})


def test_derived_figures():
    assert samples_per_joule(1000, 500.0) == 2.0
    assert samples_per_joule(1000, None) is None and samples_per_joule(1000, 0.0) is None


# ---------------------------------------------------------------- RAPL on a fake powercap tree


def powercap(root, zones):
    for zone, (name, microjoules, range_uj) in zones.items():
        (root / zone).mkdir(parents=True)
        (root / zone / "name").write_text(name + "\n")
        (root / zone / "energy_uj").write_text(f"{microjoules}\n")
        (root / zone / "max_energy_range_uj").write_text(f"{range_uj}\n")
    return root


def test_rapl_reads_packages_and_dram_but_not_their_core_subzones(tmp_path):
    root = powercap(
        tmp_path,
        {
            "intel-rapl:0": ("package-0", 5_000_000, 262_143_328_850),
            "intel-rapl:0:0": ("core", 4_000_000, 262_143_328_850),
            "intel-rapl:0:1": ("dram", 1_000_000, 65_712_999_613),
            "intel-rapl:1": ("package-1", 7_000_000, 262_143_328_850),
        },
    )
    source = RaplSource(root)
    assert source.read().energy_j == {"package-0": 5.0, "package-0/dram": 1.0, "package-1": 7.0}
    assert source.counter_range_j["package-0/dram"] == pytest.approx(65_712.999613)


def test_rapl_accounting_across_a_wrap_of_the_real_files(tmp_path):
    root = powercap(tmp_path, {"intel-rapl:0": ("package-0", 999_000_000, 1_000_000_000)})  # wraps at 1000 J
    monitor = EnergyMonitor([RaplSource(root)], period_s=1.0, clock=Clock(0.0, 1.0, 2.0))
    monitor.begin("timed")
    (root / "intel-rapl:0" / "energy_uj").write_text("1000000\n")  # +2 J through the wrap
    monitor.sample()
    (root / "intel-rapl:0" / "energy_uj").write_text("4000000\n")  # +3 J
    assert monitor.end("timed")["energy_j"] == pytest.approx(5.0)


def test_rapl_unavailable_reasons(tmp_path, monkeypatch):
    with pytest.raises(SourceUnavailable, match="no RAPL package zones"):
        RaplSource(tmp_path)
    root = powercap(tmp_path, {"intel-rapl:0": ("package-0", 1, 2)})
    original = type(root).read_text

    def root_only(path, *args, **kwargs):
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return original(path, *args, **kwargs)

    monkeypatch.setattr(type(root), "read_text", root_only)
    with pytest.raises(SourceUnavailable, match="readable only by root"):
        RaplSource(root)


# ---------------------------------------------------------------- NVML and amdsmi on fake libraries


def fake_pynvml(devices, fail_init=None):
    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def total_energy(handle):
        if handle["energy_mj"] is None:
            raise NVMLError_NotSupported("Not Supported")
        return handle["energy_mj"]

    def init():
        if fail_init:
            raise NVMLError(fail_init)

    module = types.SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_NotSupported=NVMLError_NotSupported,
        nvmlInit=init,
        nvmlShutdown=lambda: module.shutdowns.append(True),
        shutdowns=[],
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda index: devices[index],
        nvmlDeviceGetHandleByUUID=lambda uuid: next(d for d in devices if d["uuid"] == uuid),
        nvmlDeviceGetName=lambda handle: handle["name"],
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlDeviceGetTotalEnergyConsumption=total_energy,
        nvmlDeviceGetPowerUsage=lambda handle: handle["power_mw"],
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=handle["util"], memory=0),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=handle["mem"]),
    )
    return module


def gpu(uuid, energy_mj, power_mw, name="NVIDIA A100-SXM4-40GB"):
    return {"uuid": uuid, "name": name, "energy_mj": energy_mj, "power_mw": power_mw, "util": 90, "mem": 2**30}


def test_nvml_counts_energy_on_gpus_with_a_counter_and_integrates_power_on_the_others(monkeypatch):
    devices = [gpu("GPU-a", 1_000_000, 250_000), gpu("GPU-b", None, 100_000, name="Tesla P100")]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    source = NvmlSource()
    assert "total-energy counter (nvmlDeviceGetTotalEnergyConsumption) for gpu0" in source.description
    assert "integrated nvmlDeviceGetPowerUsage samples for gpu1" in source.description
    monitor = EnergyMonitor([source], period_s=1.0, clock=Clock(0.0, 2.0))
    monitor.begin("timed")
    devices[0]["energy_mj"] += 600_000  # 600 J in 2 s
    window = monitor.end("timed")
    assert window["sources"][0]["devices"]["gpu0"]["energy_j"] == pytest.approx(600.0)
    assert window["sources"][0]["devices"]["gpu1"]["energy_j"] == pytest.approx(200.0)  # 100 W x 2 s
    assert window["energy_j"] == pytest.approx(800.0)
    assert window["sources"][0]["peak_power_w"] == pytest.approx(350.0)  # 250 W + 100 W, instantaneous
    assert window["sources"][0]["devices"]["gpu0"]["memory_used_peak_bytes"] == 2**30


def test_nvml_follows_cuda_visible_devices_and_refuses_mig(monkeypatch):
    devices = [gpu("GPU-a", 0, 1), gpu("GPU-b", 0, 1), gpu("GPU-c", 0, 1)]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices))
    source = NvmlSource(environ={"CUDA_VISIBLE_DEVICES": "2,GPU-a"})
    assert list(source._handles_by_label) == ["gpu0", "gpu1"]
    assert source._handles_by_label["gpu0"] is devices[2] and source._handles_by_label["gpu1"] is devices[0]
    with pytest.raises(SourceUnavailable, match="MIG instances"):
        NvmlSource(environ={"CUDA_VISIBLE_DEVICES": "MIG-0f3c"})
    assert NvmlSource(indices=[1])._handles_by_label == {"gpu1": devices[1]}


def test_nvml_unavailable_reasons(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], fail_init="NVML Shared Library Not Found"))
    with pytest.raises(SourceUnavailable, match="NVML did not initialise: NVML Shared Library Not Found"):
        NvmlSource()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    with pytest.raises(SourceUnavailable, match="NVML sees no NVIDIA GPU"):
        NvmlSource()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(SourceUnavailable, match="nvidia-ml-py"):
        NvmlSource()


def fake_amdsmi(gpus, accumulator_key="energy_accumulator"):
    class AmdSmiException(Exception):
        pass

    return types.SimpleNamespace(
        AmdSmiException=AmdSmiException,
        AmdSmiMemoryType=types.SimpleNamespace(VRAM=0),
        amdsmi_init=lambda: None,
        amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: gpus,
        amdsmi_get_energy_count=lambda h: {accumulator_key: h["ticks"], "counter_resolution": 15.3, "timestamp": 0},
        amdsmi_get_power_info=lambda h: {"current_socket_power": "N/A", "average_socket_power": h["watts"]},
        amdsmi_get_gpu_activity=lambda h: {"gfx_activity": h["activity"], "umc_activity": 0, "mm_activity": "N/A"},
        amdsmi_get_gpu_memory_usage=lambda h, kind: h["vram"],
    )


@pytest.mark.parametrize("accumulator_key", ["energy_accumulator", "power"])
def test_amdsmi_energy_is_the_accumulator_times_its_resolution(monkeypatch, accumulator_key):
    gpus = [{"ticks": 1_000_000, "watts": 300, "activity": 80, "vram": 5 * 2**30}]
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(gpus, accumulator_key))
    source = AmdSmiSource()
    monitor = EnergyMonitor([source], period_s=1.0, clock=Clock(0.0, 1.0))
    monitor.begin("timed")
    gpus[0]["ticks"] += 20_000_000  # x 15.3 µJ = 306 J
    window = monitor.end("timed")
    device = window["sources"][0]["devices"]["gpu0"]
    assert device["energy_j"] == pytest.approx(306.0)
    assert device["peak_power_w"] == 300.0 and device["utilization_pct_max"] == 80.0
    assert device["memory_used_peak_bytes"] == 5 * 2**30


def test_amdsmi_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    with pytest.raises(SourceUnavailable, match="amdsmi is not installed"):
        AmdSmiSource()


# ---------------------------------------------------------------- this machine


def test_this_machine_measures_or_says_why():
    sources, unavailable = default_sources()
    assert len(sources) + len(unavailable) == 3
    monitor = EnergyMonitor(sources, unavailable, period_s=0.1).start()
    try:
        monitor.begin("timed")
        total = sum(i * i for i in range(200_000))  # some work in the window
        window = monitor.end("timed")
    finally:
        monitor.stop()
    assert total > 0
    json.dumps(window)
    if sources:
        assert window["not_measured"] is not None or window["energy_j"] > 0
    else:
        assert window["energy_j"] is None and window["not_measured"].startswith("not measured: no power source")
        for name in ("NVML", "amdsmi", "RAPL"):
            assert f"{name}: " in window["not_measured"]
