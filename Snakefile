# ML benchmark campaigns on heterogeneous HPC systems.
# Run: snakemake --profile profiles/local   (README.md: other profiles and campaigns)
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/datasets.smk"
include: "rules/trials.smk"
include: "rules/analysis.smk"


rule all:
    default_target: True
    input:
        campaign_outputs(),
