"""What a CPU host offers: /proc/cpuinfo fixtures of known and unknown CPUs, affinity, cgroup quotas, this machine."""

import dataclasses
import json
import os

import pytest

from mlcampaign.measure.host_cpu import MICROARCHITECTURES, cgroup_cpu_quota, host_cpu, parse_cpuinfo

ZEN4_FLAGS = (
    "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni"
)
SPR_FLAGS = (
    "fpu sse sse2 sse4_2 avx f16c fma avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 "
    "amx_bf16 amx_tile amx_int8 avx_vnni"
)


def cpuinfo(vendor, family, model, name, flags, mhz, cores):
    """/proc/cpuinfo text: ``cores`` is one (physical id, core id) per logical CPU."""
    blocks = []
    for processor, (package, core) in enumerate(cores):
        blocks.append(
            f"processor\t: {processor}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"model name\t: {name}\nstepping\t: 1\ncpu MHz\t\t: {mhz}\nphysical id\t: {package}\n"
            f"core id\t\t: {core}\nflags\t\t: {flags}\n"
        )
    return "\n".join(blocks) + "\n"


# The EPYC (Zen 4) an earlier session ran on: 2 vCPUs at 2.6 GHz, no cpufreq.
ZEN4 = cpuinfo("AuthenticAMD", 25, 17, "AMD EPYC 9R14 96-Core Processor", ZEN4_FLAGS, "2600.000", [(0, 0), (0, 1)])
# Sapphire Rapids, 2 cores with 2 SMT threads each.
SPR = cpuinfo(
    "GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8480+", SPR_FLAGS, "2000.000", [(0, 0), (0, 0), (0, 1), (0, 1)]
)
# What this project's VM shows: a generic name and a model number whose flags do not fit it.
VM = cpuinfo("GenuineIntel", 6, 167, "Intel(R) Xeon(R) Processor", SPR_FLAGS, "2600.000", [(0, 0), (0, 1)])


@pytest.fixture
def no_quota(tmp_path):
    """A cgroup v2 tree without a CPU quota, and an empty sysfs without cpufreq."""
    (tmp_path / "cgroup").mkdir()
    (tmp_path / "cgroup" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "self_cgroup").write_text("0::/\n")
    (tmp_path / "sys_cpu").mkdir()
    return {
        "cgroup_root": tmp_path / "cgroup",
        "proc_self_cgroup": tmp_path / "self_cgroup",
        "sys_cpu": tmp_path / "sys_cpu",
    }


def test_cpuinfo_blocks_are_parsed_per_processor():
    processors = parse_cpuinfo(SPR)
    assert [p["processor"] for p in processors] == ["0", "1", "2", "3"]
    assert processors[0]["model name"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert "amx_bf16" in processors[3]["flags"].split()


def test_zen4_fp32_peak_is_two_256_bit_fma_pipes_and_bf16_is_not_guessed(no_quota):
    cpu = host_cpu(ZEN4, affinity={0, 1}, **no_quota)
    assert cpu.microarchitecture == "AMD Zen 4"
    # 2 cores x 2.6 GHz x 32 FP32 FLOP/cycle: the figure the local-cpu system file had for that machine.
    assert cpu.nominal_peak_flops_per_s["fp32"] == pytest.approx(1.664e11)
    assert "upper bound" in cpu.peak_source["fp32"] and "cpu MHz" in cpu.peak_source["fp32"]
    assert cpu.nominal_peak_flops_per_s["bf16"] is None
    assert cpu.peak_source["bf16"].startswith("not derived:") and "measured matmul roofline" in cpu.peak_source["bf16"]
    assert "avx512_bf16" in cpu.isa_features and "amx_bf16" not in cpu.isa_features


def test_sapphire_rapids_counts_physical_cores_at_the_turbo_ceiling_with_amx_for_bf16(no_quota):
    for cpu_number in range(4):
        cpufreq = no_quota["sys_cpu"] / f"cpu{cpu_number}" / "cpufreq"
        cpufreq.mkdir(parents=True)
        (cpufreq / "cpuinfo_max_freq").write_text("3800000\n")  # kHz
    cpu = host_cpu(SPR, affinity={0, 1, 2, 3}, **no_quota)
    assert cpu.microarchitecture == "Intel Sapphire Rapids / Emerald Rapids"
    assert (cpu.cores, cpu.affinity_cpus, cpu.physical_cores) == (4, 4, 2)
    assert cpu.clock_hz == 3.8e9 and "cpuinfo_max_freq" in cpu.clock_source
    assert cpu.nominal_peak_flops_per_s["fp32"] == pytest.approx(2 * 3.8e9 * 64)
    assert cpu.nominal_peak_flops_per_s["bf16"] == pytest.approx(2 * 3.8e9 * 1024)
    assert "2 physical cores among 4 usable CPUs" in cpu.peak_source["fp32"]
    assert "AMX" in cpu.peak_source["bf16"]


def test_an_unidentifiable_vm_cpu_gets_no_peak_and_says_why(no_quota):
    cpu = host_cpu(VM, affinity={0, 1}, **no_quota)
    assert cpu.model == "Intel(R) Xeon(R) Processor" and cpu.microarchitecture is None
    assert cpu.nominal_peak_flops_per_s == {"fp32": None, "bf16": None}
    for reason in cpu.peak_source.values():
        assert "model 167 (0xa7)" in reason and "measured matmul roofline" in reason


def test_a_known_model_whose_flags_contradict_it_is_not_trusted(no_quota):
    without_avx512 = ZEN4.replace(" avx512f", "")
    cpu = host_cpu(without_avx512, affinity={0, 1}, **no_quota)
    assert cpu.microarchitecture is None and cpu.nominal_peak_flops_per_s["fp32"] is None
    assert "lack avx512f" in cpu.peak_source["fp32"]


def test_only_the_cpus_of_the_affinity_count(no_quota):
    cpu = host_cpu(SPR, affinity={2}, **no_quota)
    assert (cpu.cores, cpu.physical_cores) == (1, 1)
    assert cpu.nominal_peak_flops_per_s["fp32"] == pytest.approx(2.0e9 * 64)


def test_a_cgroup_v2_quota_tighter_up_the_tree_lowers_cores_and_peak(tmp_path):
    job = tmp_path / "cgroup" / "slurm" / "job_1"
    job.mkdir(parents=True)
    (tmp_path / "cgroup" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "cgroup" / "slurm" / "cpu.max").write_text("150000 100000\n")  # 1.5 cores, the tightest
    (job / "cpu.max").write_text("300000 100000\n")
    (tmp_path / "self_cgroup").write_text("0::/slurm/job_1\n")
    (tmp_path / "sys_cpu").mkdir()
    cpu = host_cpu(
        ZEN4,
        affinity={0, 1},
        cgroup_root=tmp_path / "cgroup",
        proc_self_cgroup=tmp_path / "self_cgroup",
        sys_cpu=tmp_path / "sys_cpu",
    )
    assert cpu.cgroup_quota_cores == 1.5 and "slurm/cpu.max" in cpu.cgroup_quota_source
    assert cpu.cores == 1
    assert cpu.nominal_peak_flops_per_s["fp32"] == pytest.approx(1.5 * 2.6e9 * 32)
    assert "1.5 cores of cgroup quota" in cpu.peak_source["fp32"]


def test_a_cgroup_v1_cfs_quota_is_read(tmp_path):
    mount = tmp_path / "cpu,cpuacct" / "job"
    mount.mkdir(parents=True)
    (mount / "cpu.cfs_quota_us").write_text("50000\n")
    (mount / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "self_cgroup").write_text("5:memory:/job\n4:cpu,cpuacct:/job\n")
    assert cgroup_cpu_quota(tmp_path, tmp_path / "self_cgroup")[0] == 0.5


def test_no_quota_and_unreadable_cgroup_files_say_so(tmp_path, no_quota):
    assert cgroup_cpu_quota(no_quota["cgroup_root"], no_quota["proc_self_cgroup"])[0] is None
    quota, why = cgroup_cpu_quota(tmp_path, tmp_path / "missing")
    assert quota is None and "missing" in why


def test_every_table_entry_cites_its_figures():
    for arch in MICROARCHITECTURES:
        assert arch.fp32_basis and arch.bf16_basis
        assert (arch.bf16_flop_per_cycle is None) == ("not taken from a cited vendor source" in arch.bf16_basis)


def test_this_machine():
    cpu = host_cpu()
    json.dumps(dataclasses.asdict(cpu))
    assert cpu.affinity_cpus == len(os.sched_getaffinity(0))
    assert cpu.cores == len(os.sched_getaffinity(0)) or cpu.cgroup_quota_cores < len(os.sched_getaffinity(0))
    assert cpu.model and cpu.isa_features
    for precision, peak in cpu.nominal_peak_flops_per_s.items():
        source = cpu.peak_source[precision]
        assert source.startswith("upper bound") if peak else source.startswith("not derived:")
        assert (peak is None) or cpu.microarchitecture
