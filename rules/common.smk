import json
import sys

sys.path.insert(0, workflow.basedir)

from snakemake.settings.types import DeploymentMethod

from mlcampaign.config import ConfigError, load_campaign

# Validate the campaign and every system and benchmark file it names before any job is planned.
try:
    CAMPAIGN = load_campaign(
        config,
        config_dir=Path(workflow.basedir) / "config",
        # Profiles set replace-workflow-config: a --configfile replaces config/config.yaml whole.
        source=", ".join(
            map(str, workflow.overwrite_configfiles or workflow.configfiles)
        ),
    )
except ConfigError as error:
    raise WorkflowError(str(error)) from None

TRIALS = CAMPAIGN.trial_matrix()

# Job commands use the interpreter running Snakemake (the project's environment, also on compute
# nodes that share the filesystem), or the rule's own environment when conda deployment is on.
PYTHON = (
    "python"
    if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    else sys.executable
)
RESULTS = f"results/{CAMPAIGN.name}"


wildcard_constraints:
    system="|".join(CAMPAIGN.systems),
    benchmark="|".join(CAMPAIGN.benchmarks),
    cell="|".join(sorted(set(TRIALS.cell))),
    trial=r"\d+",
    replicate=r"\d+",
    dataset="|".join({b["dataset"]["name"] for b in CAMPAIGN.benchmarks.values()}),


def trial_row(wildcards):
    return TRIALS.loc[
        (
            wildcards.system,
            wildcards.benchmark,
            wildcards.cell,
            int(wildcards.trial),
            int(wildcards.replicate),
        )
    ]


def trial_dir(row):
    return f"{RESULTS}/trials/{row.system}/{row.benchmark}/{row.cell}/trial{row.trial}-rep{row.replicate}"


def dataset_of(wildcards):
    return CAMPAIGN.benchmarks[wildcards.benchmark]["dataset"]["name"]


def trial_spec(wildcards):
    """Everything a trial needs, as JSON; a change of it re-runs the trial (params trigger)."""
    row = trial_row(wildcards)
    return json.dumps(
        {
            "campaign": CAMPAIGN.name,
            "deterministic": CAMPAIGN.config["deterministic"],
            "trial": {
                key: (value.item() if hasattr(value, "item") else value)
                for key, value in row.items()
            },
            "system": CAMPAIGN.systems[row.system],
            "benchmark": CAMPAIGN.benchmarks[row.benchmark],
        },
        sort_keys=True,
    )


def all_records():
    return [f"{trial_dir(row)}/record.json" for row in TRIALS.itertuples()]


def campaign_outputs():
    return [f"{RESULTS}/trials.csv"]
