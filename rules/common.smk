import functools
import hashlib
import json
import os
import shlex
import sys

sys.path.insert(0, workflow.basedir)

from snakemake.settings.types import DeploymentMethod

from mlcampaign.analysis.outputs import FIGURE_TABLES, TABLE_FORMATS, TABLES
from mlcampaign.config import ConfigError, load_campaign, load_published
from mlcampaign.data.manifest import DATA_DIR, ID_FILE, MANIFEST_FILE, DatasetError
from mlcampaign.launch import job_resources, launch_command, trial_runtime

# Validate the campaign and every system and benchmark file it names before any job is planned.
try:
    CAMPAIGN = load_campaign(
        config,
        config_dir=Path(workflow.basedir) / "config",
        # The Snakefile loads config/config.yaml only without --configfile: a campaign file is whole.
        source=", ".join(
            map(str, workflow.overwrite_configfiles or workflow.configfiles)
        ),
    )
except ConfigError as error:
    raise WorkflowError(str(error)) from None

TRIALS = CAMPAIGN.trial_matrix()
# Each dataset the campaign's benchmarks use, by name (staged once, shared by benchmarks).
DATASETS = {b["dataset"]["name"]: b["dataset"] for b in CAMPAIGN.benchmarks.values()}

# Job commands use the interpreter running Snakemake (the project's environment, also on compute
# nodes that share the filesystem), or the rule's own environment when conda deployment is on.
PYTHON = (
    "python"
    if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    else sys.executable
)
RESULTS = f"results/{CAMPAIGN.name}"
# The interpreter and trial script of this checkout reach the trial's shell command as environment
# variables, not params: parameters are what the params trigger compares, and a moved or re-cloned
# checkout must not re-run any trial. Every job process (local, Slurm, Kubernetes) evaluates this
# file again, so each sets its own.
os.environ.update(
    MLCAMPAIGN_PYTHON=PYTHON,
    MLCAMPAIGN_RUN_TRIAL=f"{workflow.basedir}/scripts/run_trial.py",
)


wildcard_constraints:
    system="|".join(CAMPAIGN.systems),
    benchmark="|".join(CAMPAIGN.benchmarks),
    cell="|".join(sorted(set(TRIALS.cell))),
    trial=r"\d+",
    replicate=r"\d+",
    dataset="|".join(DATASETS),


def trial_key(wildcards):
    return (
        wildcards.system,
        wildcards.benchmark,
        wildcards.cell,
        int(wildcards.trial),
        int(wildcards.replicate),
    )


# Every input, param and resource function of a trial job looks its row up: a dict, built once
# (pandas' .loc per job would cost more than Snakemake's planning itself in a 10 000-trial campaign).
TRIAL_ROWS = dict(zip(TRIALS.index, TRIALS.to_dict(orient="records")))


def trial_values(wildcards):
    """The trial's matrix row as a dict of plain Python values."""
    return TRIAL_ROWS[trial_key(wildcards)]


@functools.cache
def _job_resources(key):
    return job_resources(CAMPAIGN.systems[key[0]], TRIAL_ROWS[key])


def trial_dir(row):
    return f"{RESULTS}/trials/{row.system}/{row.benchmark}/{row.cell}/trial{row.trial}-rep{row.replicate}"


def dataset_of(wildcards):
    return CAMPAIGN.benchmarks[wildcards.benchmark]["dataset"]["name"]


def dataset_path(name):
    """A file of the trial's staged dataset (mlcampaign.data.manifest: DATA_DIR, MANIFEST_FILE, ID_FILE)."""
    return lambda wildcards: f"results/datasets/{dataset_of(wildcards)}/{name}"


def stage_params(wildcards):
    """What staging a dataset depends on (params trigger): its config and, for a path source, the
    content hash of the source files (mlcampaign.data.staging.source_digest). A source the planner
    cannot read (unset variable, path only mounted on compute nodes) is staged as configured, and
    its content changes are not detected: the warning says so."""
    dataset = DATASETS[wildcards.dataset]
    digest = None
    if "path" in dataset["source"]:
        # Imported here: staging imports the readers (torch), which generated datasets do not need.
        from mlcampaign.data.staging import source_digest

        try:
            digest = source_digest(
                dataset,
                Path(f"results/datasets/{wildcards.dataset}/source-hashes.json"),
            )
        except DatasetError as error:
            logger.warning(
                f"{error}; content changes of this source are not detected from here"
            )
    return json.dumps({"dataset": dataset, "source_digest": digest}, sort_keys=True)


def trial_spec(wildcards):
    """Everything a trial needs, as JSON; a change of it re-runs the trial (params trigger)."""
    return json.dumps(CAMPAIGN.trial_spec(trial_values(wildcards)), sort_keys=True)


def trial_system(wildcards):
    return CAMPAIGN.systems[wildcards.system]


def trial_resource(name):
    """A resource of the trial's job (mlcampaign.launch.job_resources); 0 where it does not apply."""
    return lambda wildcards: _job_resources(trial_key(wildcards)).get(name, 0)


def trial_threads(wildcards):
    """The cores the trial occupies on its (first) node: processes per node x threads each."""
    return trial_values(wildcards)["tasks_per_node"] * trial_resource("cpus_per_task")(
        wildcards
    )


def trial_env(wildcards):
    """The conda environment of the trial's framework (envs/torch.yaml, envs/tensorflow.yaml)."""
    return f"../envs/{trial_values(wildcards)['framework']}.yaml"


def all_records():
    return [f"{trial_dir(row)}/record.json" for row in TRIALS.itertuples()]


def campaign_outputs():
    return [f"{RESULTS}/trials.csv", *analysis_outputs("analysis")]


# Aggregation and report (rules/analysis.smk, rules/report.smk), per scope: "analysis" reads the
# record of every planned trial, "partial" the records that exist (see rules/analysis.smk).


def table_path(name, fmt, scope="{scope}"):
    return f"{RESULTS}/{scope}/tables/{name}.{fmt}"


def view_path(name, scope="{scope}"):
    return f"{RESULTS}/{scope}/views/{name}.html"


def figure_path(name, scope="{scope}"):
    return f"{RESULTS}/{scope}/figures/{name}.png"


def analysis_outputs(scope):
    """Every table, figure and the HTML report of an aggregation scope, and the comparison with
    the published numbers in a campaign of a published study (rules/analysis.smk)."""
    published = ["published_comparison"] if "published" in CAMPAIGN.config else []
    return (
        [
            table_path(name, fmt, scope)
            for name in [*TABLES, *published]
            for fmt in TABLE_FORMATS
        ]
        + [figure_path(name, scope) for name in [*FIGURE_TABLES, *published]]
        + [f"{RESULTS}/{scope}/report.html"]
    )


def scope_records(wildcards):
    return all_records() if wildcards.scope == "analysis" else []


def existing_records(wildcards):
    """Partial scope: the planned trials' records that exist now."""
    if wildcards.scope != "partial":
        return []
    return [path for path in all_records() if os.path.exists(path)]


def records_state(wildcards):
    """A digest of the existing records' paths and modification times: a new or rewritten record
    re-runs the partial aggregation (params trigger)."""
    state = "\n".join(
        f"{path} {os.path.getmtime(path)}" for path in existing_records(wildcards)
    )
    return hashlib.sha256(state.encode()).hexdigest()[:16]


def report_command():
    """`snakemake` with this run's Snakefile and config, to build the HTML report from a job."""
    settings = workflow.config_settings
    command = [PYTHON, "-m", "snakemake", "--snakefile", workflow.main_snakefile]
    if settings.configfiles:
        command += ["--configfile", *map(str, settings.configfiles)]
    if settings.replace_workflow_config:
        command.append("--replace-workflow-config")
    if settings.config_args:
        command += ["--config", *settings.config_args]
    return shlex.join(command)
