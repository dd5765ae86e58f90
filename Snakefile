# ML benchmark campaigns on heterogeneous HPC systems.
# Run: snakemake --profile profiles/local   (README.md: other profiles and campaigns)
from snakemake.utils import min_version

min_version("9.0")


# The default campaign, unless campaign files are given with --configfile: those replace it whole.
# (Decided here rather than by --replace-workflow-config because executor plugins pass the
# --configfile list on to the jobs they spawn, but not that flag.)
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/datasets.smk"
include: "rules/trials.smk"
include: "rules/analysis.smk"
include: "rules/report.smk"
include: "rules/regression.smk"
include: "rules/history.smk"


rule all:
    default_target: True
    input:
        campaign_outputs(),
