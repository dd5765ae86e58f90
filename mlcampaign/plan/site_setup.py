"""A system's site set-up checked before any job is planned: what its schema cannot see (Slurm options the
executor plugin sets itself, settings of another executor, GPU-only settings on a CPU system, container
settings a pod cannot honour). docs/sites.md describes the set-up keys; mlcampaign.job.launch applies them.
"""

from __future__ import annotations

import re

# sbatch options the Slurm executor plugin sets itself (snakemake_executor_plugin_slurm.validation,
# which refuses them in slurm_extra), and the system or campaign key that says them here.
_PLUGIN_OPTION_KEYS = {
    "account": "slurm.account or slurm.account_variable",
    "partition": "slurm.partition",
    "quality of service": "slurm.qos",
    "node constraints": "slurm.constraint",
    "memory": "slurm.memory_per_node_mb (or memory_per_node_mb)",
    "memory per CPU": "slurm.memory_per_node_mb (or memory_per_node_mb)",
    "runtime/time limit": "trial_time_limit_minutes",
    "generic resources (GRES)": "slurm.gpu_option",
    "GPU allocation": "slurm.gpu_option",
}


def check_site_setup(system: dict) -> list[tuple[str, object, str]]:
    """The problems of a system's site set-up that its schema cannot see, as (key, value, reason):
    sbatch flags the Slurm executor plugin refuses (it sets those options itself), Slurm settings on a
    system that does not run through Slurm, GPU-only Slurm settings on a CPU system, container settings
    that a pod cannot honour."""
    problems = []
    slurm = system.get("slurm", {})
    if slurm and system["executor"] != "slurm":
        problems.append(("slurm", sorted(slurm), f"executor '{system['executor']}' does not submit through Slurm"))
    if slurm.get("sbatch_flags"):
        from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options

        forbidden = get_forbidden_slurm_options().items()
        for index, flag in enumerate(slurm["sbatch_flags"]):
            for pattern, option in forbidden:
                # The plugin matches its patterns against the joined flags, so a flag alone ends in a space.
                if re.search(pattern, f"{flag} "):
                    where = _PLUGIN_OPTION_KEYS.get(option, "the campaign's scales and the system's layout")
                    problems.append(
                        (
                            f"slurm.sbatch_flags.{index}",
                            flag,
                            f"sbatch's {option} is set by the Slurm executor plugin, which refuses it here; "
                            f"say it with {where}",
                        )
                    )
                    break
    if system["device"] == "cpu":
        for key, value in (("tasks_in_sbatch", False), ("gpu_option", "gres")):
            if slurm.get(key) == value:
                problems.append(
                    (f"slurm.{key}", value, "applies to GPU systems only (the Slurm plugin names CPU jobs' tasks)")
                )
    container = system.get("container", {})
    if system["executor"] == "kubernetes":
        for key in ("runtime", "bind", "options", "python"):
            if key in container:
                problems.append(
                    (
                        f"container.{key}",
                        container[key],
                        "a Kubernetes trial runs as the image's pod (no exec); its mounts come from the profile",
                    )
                )
    return problems
