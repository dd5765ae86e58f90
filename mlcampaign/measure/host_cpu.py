"""What a CPU host offers a trial: usable cores, CPU model, ISA features and, where honest, a nominal peak.

Sources (Linux): ``os.sched_getaffinity(0)`` (the CPUs this process may run on), the cgroup CPU quota
(v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, the tightest along the process's
cgroup path), ``/proc/cpuinfo`` (vendor, family, model, model name, flags, physical/core ids, ``cpu MHz``)
and ``/sys/devices/system/cpu/cpu<N>/cpufreq/cpuinfo_max_freq`` (kHz).

Nominal peak FLOP/s = cores x clock (Hz) x FLOP per cycle per core. FLOP/cycle is not in /proc/cpuinfo:
the ISA flags say which instructions exist, not how many FMA pipes execute them (Skylake-SP Xeons have
one or two AVX-512 FMA units depending on the SKU), and a hypervisor may hide the model altogether
("Intel(R) Xeon(R) Processor"). So a peak is derived only for the microarchitectures in ``MICROARCHITECTURES``,
identified by vendor + family + model numbers and checked against the flags they must have; every
figure there cites its source. Everything else gets ``None`` and a reason, and the caller uses the
measured matmul roofline (``mlcampaign.measure.roofline``) and says so.

The figures are upper bounds: "cores" counts distinct physical cores among the usable CPUs (SMT siblings
share the FMA pipes), capped by the cgroup quota; the clock is the highest ``cpuinfo_max_freq`` (the turbo
ceiling) of the usable CPUs, and only where cpufreq is absent (VMs) the kernel's ``cpu MHz``, which is the
base or current clock, so a turbo clock can exceed it — ``peak_source`` says which clock was used.
A measured matmul above the nominal figure therefore means a wrong table entry or a turbo clock the
system does not report.

Limits: x86 only (other vendors get ``None`` and a reason); one socket type per host assumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from pathlib import Path

# Flags worth recording for ML kernels, in /proc/cpuinfo spelling.
ML_ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
)

PROC_CPUINFO = Path("/proc/cpuinfo")
SYS_CPU = Path("/sys/devices/system/cpu")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")

# Per-core fp32 FLOP/cycle of two FMA pipes: pipes x lanes x 2 (a fused multiply-add is 2 FLOP).
_TWO_256BIT_FMA = 2 * 8 * 2
_TWO_512BIT_FMA = 2 * 16 * 2


@dataclasses.dataclass(frozen=True)
class Microarchitecture:
    """Per-core FLOP/cycle of one microarchitecture, with where each figure comes from."""

    name: str
    vendor: str
    family: int
    models: tuple[range, ...]
    required_flags: tuple[str, ...]
    fp32_flop_per_cycle: int
    fp32_basis: str
    bf16_flop_per_cycle: int | None
    bf16_basis: str

    def matches(self, vendor: str, family: int, model: int) -> bool:
        return vendor == self.vendor and family == self.family and any(model in models for models in self.models)


_BF16_ON_FP32_PIPES = (
    "no bf16 arithmetic instruction (no avx512_bf16, no AMX): bf16 is converted and multiplied on the fp32 "
    "FMA pipes, so the fp32 figure bounds it"
)

# Family/model ranges: Linux arch/x86/kernel/cpu/amd.c (bsp_init_amd, the Zen generation switch) and
# arch/x86/include/asm/intel-family.h (INTEL_SKYLAKE_X 0x55, INTEL_ICELAKE_X 0x6A, INTEL_ICELAKE_D 0x6C,
# INTEL_SAPPHIRERAPIDS_X 0x8F, INTEL_EMERALDRAPIDS_X 0xCF).
MICROARCHITECTURES = (
    Microarchitecture(
        name="AMD Zen 2",
        vendor="AuthenticAMD",
        family=0x17,
        models=(range(0x30, 0x50), range(0x60, 0x80), range(0x90, 0x92), range(0xA0, 0xB0)),
        required_flags=("avx2", "fma"),
        # AMD Software Optimization Guide for AMD Family 17h Models 30h and Greater (pub. 56305), floating-point
        # unit: two 256-bit FMA pipes (FP0, FP1).
        fp32_flop_per_cycle=_TWO_256BIT_FMA,
        fp32_basis="two 256-bit FMA pipes (AMD Software Optimization Guide, Family 17h Models 30h+, pub. 56305)",
        bf16_flop_per_cycle=_TWO_256BIT_FMA,
        bf16_basis=_BF16_ON_FP32_PIPES,
    ),
    Microarchitecture(
        name="AMD Zen 3",
        vendor="AuthenticAMD",
        family=0x19,
        models=(range(0x00, 0x10), range(0x20, 0x60)),
        required_flags=("avx2", "fma"),
        # AMD Software Optimization Guide for AMD Family 19h Processors (pub. 56665), floating-point unit:
        # two 256-bit FMA pipes (FP0, FP1), as Zen 2.
        fp32_flop_per_cycle=_TWO_256BIT_FMA,
        fp32_basis="two 256-bit FMA pipes (AMD Software Optimization Guide, Family 19h, pub. 56665)",
        bf16_flop_per_cycle=_TWO_256BIT_FMA,
        bf16_basis=_BF16_ON_FP32_PIPES,
    ),
    Microarchitecture(
        name="AMD Zen 4",
        vendor="AuthenticAMD",
        family=0x19,
        models=(range(0x10, 0x20), range(0x60, 0xB0)),
        required_flags=("avx2", "fma", "avx512f"),
        # AMD Software Optimization Guide for the AMD Zen4 Microarchitecture (pub. 57647), 2.11: FMA/FMUL on
        # pipes FP0 and FP1, 256 bits wide; a 512-bit instruction occupies a pipe for two passes, so AVX-512
        # does not raise the FLOP/cycle over AVX2.
        fp32_flop_per_cycle=_TWO_256BIT_FMA,
        fp32_basis=(
            "two 256-bit FMA pipes, 512-bit instructions in two passes (AMD Software Optimization Guide for "
            "the Zen4 Microarchitecture, pub. 57647, section 2.11)"
        ),
        # AVX512-BF16 (VDPBF16PS) exists, but its throughput is in no source this module cites, so no
        # figure rather than a guess of 2x fp32.
        bf16_flop_per_cycle=None,
        bf16_basis="VDPBF16PS throughput on Zen 4 is not taken from a cited vendor source",
    ),
    Microarchitecture(
        name="Intel Skylake-SP / Cascade Lake / Cooper Lake",
        vendor="GenuineIntel",
        family=6,
        models=(range(0x55, 0x56),),
        required_flags=("avx512f",),
        # Intel ARK "# of AVX-512 FMA Units": 1 or 2 per core depending on the SKU (Platinum and Gold 6xxx: 2;
        # Silver, Bronze and most Gold 5xxx: 1). The count is not visible from Linux, so two units: a bound.
        fp32_flop_per_cycle=_TWO_512BIT_FMA,
        fp32_basis=(
            "upper bound of two 512-bit FMA units per core (Intel ARK '# of AVX-512 FMA Units' is 1 or 2 by SKU; "
            "SKUs with one reach half)"
        ),
        bf16_flop_per_cycle=None,
        bf16_basis="Cooper Lake's VDPBF16PS throughput is not taken from a cited vendor source",
    ),
    Microarchitecture(
        name="Intel Ice Lake-SP",
        vendor="GenuineIntel",
        family=6,
        models=(range(0x6A, 0x6B), range(0x6C, 0x6D)),
        required_flags=("avx512f",),
        # Intel ARK, 3rd Gen Xeon Scalable (Ice Lake): "# of AVX-512 FMA Units" 2.
        fp32_flop_per_cycle=_TWO_512BIT_FMA,
        fp32_basis="two 512-bit FMA units per core (Intel ARK, 3rd Gen Xeon Scalable: '# of AVX-512 FMA Units' 2)",
        bf16_flop_per_cycle=_TWO_512BIT_FMA,
        bf16_basis=_BF16_ON_FP32_PIPES,
    ),
    Microarchitecture(
        name="Intel Sapphire Rapids / Emerald Rapids",
        vendor="GenuineIntel",
        family=6,
        models=(range(0x8F, 0x90), range(0xCF, 0xD0)),
        required_flags=("avx512f", "amx_bf16", "amx_tile"),
        # Intel ARK, 4th/5th Gen Xeon Scalable: "# of AVX-512 FMA Units" 2. AMX: Intel's 4th Gen Xeon AMX
        # material (Intel AMX overview; Architecture Day 2021) gives 1024 BF16 operations per cycle per core:
        # TDPBF16PS on 16x32 by 32x16 tiles is 8192 multiply-adds (16384 FLOP) every 16 cycles.
        fp32_flop_per_cycle=_TWO_512BIT_FMA,
        fp32_basis="two 512-bit FMA units per core (Intel ARK, 4th/5th Gen Xeon Scalable: '# of AVX-512 FMA Units' 2)",
        bf16_flop_per_cycle=1024,
        bf16_basis="AMX TMUL, 1024 BF16 FLOP per cycle per core (Intel, 4th Gen Xeon Scalable AMX overview)",
    ),
)


@dataclasses.dataclass(frozen=True)
class HostCPU:
    """A CPU host as a trial sees it. JSON-serialisable with ``dataclasses.asdict``.

    ``cores``: CPUs this process may use (affinity), lowered to the cgroup quota where that is tighter.
    ``nominal_peak_flops_per_s``: FLOP/s per precision for the whole of ``cores``, or None; ``peak_source``
    says for each precision how it was derived or why not.
    """

    cores: int
    affinity_cpus: int
    cgroup_quota_cores: float | None
    cgroup_quota_source: str
    physical_cores: int | None
    model: str
    vendor: str | None
    family: int | None
    model_number: int | None
    microarchitecture: str | None
    isa_features: list[str]
    clock_hz: float | None
    clock_source: str
    nominal_peak_flops_per_s: dict[str, float | None]
    peak_source: dict[str, str]


def parse_cpuinfo(text: str) -> list[dict[str, str]]:
    """/proc/cpuinfo as one ``{key: value}`` dict per processor block."""
    blocks, current = [], {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
            current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    return [block for block in blocks if "processor" in block]


def _int(value: str | None) -> int | None:
    try:
        return int(value, 0) if value is not None else None
    except ValueError:
        return None


def _cgroup_v2_quota(cgroup_root: Path, path: str) -> tuple[float | None, Path | None]:
    """The tightest ``cpu.max`` on ``path`` and its ancestors, in cores."""
    tightest, where = None, None
    directory = cgroup_root / path.lstrip("/")
    while True:
        try:
            quota, period = (directory / "cpu.max").read_text().split()
        except (OSError, ValueError):
            quota = None
        if quota is not None and quota != "max":
            cores = int(quota) / int(period)
            if tightest is None or cores < tightest:
                tightest, where = cores, directory / "cpu.max"
        if directory == cgroup_root or cgroup_root not in directory.parents:
            break
        directory = directory.parent
    return tightest, where


def _cgroup_v1_quota(mount: Path, path: str) -> tuple[float | None, Path | None]:
    """The tightest ``cpu.cfs_quota_us / cpu.cfs_period_us`` on ``path`` and its ancestors, in cores."""
    tightest, where = None, None
    directory = mount / path.lstrip("/")
    while True:
        try:
            quota = int((directory / "cpu.cfs_quota_us").read_text())
            period = int((directory / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            quota = -1
        if quota > 0:
            cores = quota / period
            if tightest is None or cores < tightest:
                tightest, where = cores, directory / "cpu.cfs_quota_us"
        if directory == mount or mount not in directory.parents:
            break
        directory = directory.parent
    return tightest, where


def cgroup_cpu_quota(
    cgroup_root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> tuple[float | None, str]:
    """(quota in cores or None, how it was found). A container often mounts its own cgroup as the root, so
    a path from /proc/self/cgroup that does not exist under the mount falls back to the mount itself."""
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError as error:
        return None, f"no quota read: {proc_self_cgroup}: {error.strerror}"
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            candidates = [(cgroup_root, path), (cgroup_root, "/")]
            reader = _cgroup_v2_quota
        elif "cpu" in controllers.split(","):
            mount = next(
                (cgroup_root / name for name in (controllers, "cpu,cpuacct", "cpu") if (cgroup_root / name).is_dir()),
                None,
            )
            if mount is None:
                continue
            candidates = [(mount, path), (mount, "/")]
            reader = _cgroup_v1_quota
        else:
            continue
        for root, candidate in candidates:
            if (root / candidate.lstrip("/")).is_dir():
                cores, where = reader(root, candidate)
                if cores is not None:
                    return cores, f"cgroup quota {cores:g} cores ({where})"
                return None, f"no cgroup CPU quota on {root / candidate.lstrip('/')} or its ancestors"
    return None, f"no cgroup CPU controller for this process in {proc_self_cgroup}"


def _max_clock_hz(cpus: list[int], processors: list[dict[str, str]], sys_cpu: Path) -> tuple[float | None, str]:
    khz = []
    for cpu in cpus:
        with contextlib.suppress(OSError, ValueError):
            khz.append(int((sys_cpu / f"cpu{cpu}" / "cpufreq" / "cpuinfo_max_freq").read_text()))
    if khz:
        return max(khz) * 1e3, f"max cpufreq cpuinfo_max_freq {max(khz) / 1e3:g} MHz (turbo ceiling)"
    mhz = [float(p["cpu MHz"]) for p in processors if _int(p.get("processor")) in cpus and "cpu MHz" in p]
    if mhz:
        return max(mhz) * 1e6, (
            f"/proc/cpuinfo 'cpu MHz' {max(mhz):g} (no cpufreq in {sys_cpu}: the base or current clock, "
            "which a turbo clock can exceed)"
        )
    return None, f"no clock: neither {sys_cpu}/cpu*/cpufreq/cpuinfo_max_freq nor 'cpu MHz' in /proc/cpuinfo"


def identify(
    vendor: str | None, family: int | None, model: int | None, flags: set[str]
) -> tuple[Microarchitecture | None, str]:
    """The table entry for this CPU, or None and why not."""
    if vendor is None or family is None or model is None:
        return None, "/proc/cpuinfo gives no x86 vendor, family and model numbers"
    described = f"{vendor} family {family} (0x{family:x}) model {model} (0x{model:x})"
    entry = next((arch for arch in MICROARCHITECTURES if arch.matches(vendor, family, model)), None)
    if entry is None:
        return None, (
            f"{described} is not among the microarchitectures with documented FMA/AMX widths in "
            "mlcampaign.measure.host_cpu.MICROARCHITECTURES (a hypervisor may also report a generic model)"
        )
    missing = [flag for flag in entry.required_flags if flag not in flags]
    if missing:
        return (
            None,
            f"{described} would be {entry.name}, but its flags lack {', '.join(missing)}: the numbers are not trusted",
        )
    return entry, f"{described}: {entry.name}"


def host_cpu(
    cpuinfo_text: str | None = None,
    affinity: set[int] | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    proc_self_cgroup: Path = PROC_SELF_CGROUP,
    sys_cpu: Path = SYS_CPU,
) -> HostCPU:
    """Describe this host's CPU (every argument defaults to the real machine; tests pass fixtures)."""
    cpuinfo_text = PROC_CPUINFO.read_text() if cpuinfo_text is None else cpuinfo_text
    affinity = os.sched_getaffinity(0) if affinity is None else affinity
    processors = parse_cpuinfo(cpuinfo_text)
    usable = [p for p in processors if _int(p.get("processor")) in affinity] or processors
    first = usable[0] if usable else {}
    flags = set(first.get("flags", "").split())
    vendor = first.get("vendor_id")
    family, model_number = _int(first.get("cpu family")), _int(first.get("model"))
    model = first.get("model name", "unknown (no 'model name' in /proc/cpuinfo)")

    quota, quota_source = cgroup_cpu_quota(cgroup_root, proc_self_cgroup)
    cores = len(affinity)
    if quota is not None and quota < cores:
        cores = max(1, math.floor(quota))
    core_ids = {(p.get("physical id"), p.get("core id")) for p in usable}
    physical_cores = len(core_ids) if usable and all(None not in ids for ids in core_ids) else None

    clock_hz, clock_source = _max_clock_hz(sorted(affinity), processors, sys_cpu)
    arch, identified = identify(vendor, family, model_number, flags)
    peaks, sources = {}, {}
    for precision in ("fp32", "bf16"):
        peaks[precision], sources[precision] = _nominal_peak(
            precision, arch, identified, clock_hz, clock_source, physical_cores, len(affinity), quota
        )
    return HostCPU(
        cores=cores,
        affinity_cpus=len(affinity),
        cgroup_quota_cores=quota,
        cgroup_quota_source=quota_source,
        physical_cores=physical_cores,
        model=model,
        vendor=vendor,
        family=family,
        model_number=model_number,
        microarchitecture=arch.name if arch else None,
        isa_features=[flag for flag in ML_ISA_FLAGS if flag in flags],
        clock_hz=clock_hz,
        clock_source=clock_source,
        nominal_peak_flops_per_s=peaks,
        peak_source=sources,
    )


def _nominal_peak(
    precision: str,
    arch: Microarchitecture | None,
    identified: str,
    clock_hz: float | None,
    clock_source: str,
    physical_cores: int | None,
    affinity_cpus: int,
    quota: float | None,
) -> tuple[float | None, str]:
    fallback = "; use the measured matmul roofline"
    if arch is None:
        return None, f"not derived: {identified}{fallback}"
    flop_per_cycle = arch.fp32_flop_per_cycle if precision == "fp32" else arch.bf16_flop_per_cycle
    basis = arch.fp32_basis if precision == "fp32" else arch.bf16_basis
    if flop_per_cycle is None:
        return None, f"not derived: {identified}: {basis}{fallback}"
    if clock_hz is None:
        return None, f"not derived: {clock_source}{fallback}"
    if physical_cores is None:
        cores, cores_text = affinity_cpus, f"{affinity_cpus} usable CPUs (no core ids in /proc/cpuinfo: SMT unknown)"
    else:
        cores, cores_text = physical_cores, f"{physical_cores} physical cores among {affinity_cpus} usable CPUs"
    if quota is not None and quota < cores:
        cores, cores_text = quota, f"{quota:g} cores of cgroup quota ({cores_text})"
    peak = cores * clock_hz * flop_per_cycle
    return peak, (
        f"upper bound {peak:.4g} FLOP/s = {cores_text} x {clock_hz / 1e9:g} GHz ({clock_source}) x "
        f"{flop_per_cycle} {precision} FLOP/cycle/core, {identified}: {basis}"
    )
