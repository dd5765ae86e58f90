import functools
import inspect
import json
import sys

sys.path.insert(0, workflow.basedir)

from snakemake.common import overwrite_function_params

from mlcampaign.analysis.outputs import FIGURE_TABLES, TABLE_FORMATS, TABLES
from mlcampaign.data.manifest import DATA_DIR, ID_FILE, MANIFEST_FILE, DatasetError
from mlcampaign.job.launch import job_resources, trial_runtime
from mlcampaign.plan.launchers import threads_per_process
from mlcampaign.records.provenance import git_state
from mlcampaign.records.run_manifest import run_manifest
from mlcampaign.workflow import scopes
from mlcampaign.workflow.planning import PlanningError, plan_workflow
from mlcampaign.workflow.stopping import stop_as_ctrl_c

# The plan of this invocation (mlcampaign.workflow.planning): the campaign validated with every system
# and benchmark file it names, this invocation's site and run, and its trials; a campaign that cannot
# run stops Snakemake here, before any job is planned (raised here: Snakemake then shows the message
# without a traceback into the package). The names below are what the rules read.
try:
    PLAN = plan_workflow(workflow, config, logger)
except PlanningError as error:
    raise WorkflowError(str(error)) from None
CAMPAIGN, SITE, RUN = PLAN.campaign, PLAN.site, PLAN.run
# Every trial of the campaign (the run's manifest), which of them are at this site, and those: the jobs.
CAMPAIGN_TRIALS, HERE, TRIALS = PLAN.campaign_trials, PLAN.here, PLAN.trials
DATASETS, TRIAL_ATTEMPTS, WORKFLOW_DIR = PLAN.datasets, PLAN.attempts, PLAN.workflow_dir
RESULTS = str(RUN.directory)


# SIGTERM (kill, timeout, a batch system) ends a local campaign as Ctrl-C does, and a second Ctrl-C ends it
# quietly (mlcampaign.workflow.stopping); set once Snakemake's scheduler has set its own handler.
onstart:
    stop_as_ctrl_c(workflow)


wildcard_constraints:
    system="|".join(CAMPAIGN.systems),
    benchmark="|".join(CAMPAIGN.benchmarks),
    cell="|".join(sorted(set(TRIALS.cell))),
    trial=r"\d+",
    replicate=r"\d+",
    dataset="|".join(DATASETS),


def per_trial(function):
    """A function Snakemake calls for every trial job, its signature read once: Snakemake reads it at
    every call otherwise (inspect.signature), a fifth of planning a 10 000-trial campaign with the
    trial rule's 20 functions. snakemake.common.overwrite_function_params is Snakemake's own override.
    """
    overwrite_function_params(function, inspect.signature(function).parameters)
    return function


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
    return per_trial(
        lambda wildcards: f"results/datasets/{dataset_of(wildcards)}/{name}"
    )


def staging_resources(wildcards, attempt):
    from mlcampaign.data.cost import staging_resources as sized

    return sized(
        DATASETS[wildcards.dataset],
        Path(f"results/datasets/{wildcards.dataset}/source-hashes.json"),
        attempt,
        default_runtime_min=60,
    )


def staging_runtime(wildcards, attempt):
    return staging_resources(wildcards, attempt)["runtime"]


def staging_mem_mb(wildcards, attempt):
    return staging_resources(wildcards, attempt)["mem_mb"]


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


@per_trial
def trial_spec(wildcards):
    """Everything a trial needs, as JSON; a change of it re-runs the trial (params trigger)."""
    return json.dumps(
        CAMPAIGN.trial_spec(trial_values(wildcards), RUN.run_id, SITE), sort_keys=True
    )


@per_trial
def trial_attempt(wildcards):
    """How often the trial has run before in this run (mlcampaign.records.run_manifest.trial_attempts)."""
    return TRIAL_ATTEMPTS.get(trial_dir(wildcards), 0)


def trial_system(wildcards):
    return CAMPAIGN.systems[wildcards.system]


def trial_resource(name, absent=0):
    """A resource of the trial's job (mlcampaign.job.launch.job_resources); ``absent`` where it does not
    apply (None: the job has no such resource)."""
    return per_trial(
        lambda wildcards: _job_resources(trial_key(wildcards)).get(name, absent)
    )


@per_trial
def trial_job_runtime(wildcards, attempt):
    return trial_runtime(trial_system(wildcards), attempt)


@per_trial
def trial_threads(wildcards):
    """The cores the trial occupies on its (first) node: processes per node x threads each."""
    tasks_per_node = trial_values(wildcards)["tasks_per_node"]
    return tasks_per_node * threads_per_process(trial_system(wildcards), tasks_per_node)


@per_trial
def trial_env(wildcards):
    """The conda environment of the trial's framework (envs/torch.yaml, envs/tensorflow.yaml)."""
    return f"../envs/{trial_values(wildcards)['framework']}.yaml"


def all_records():
    return [f"{trial_dir(row)}/record.json" for row in TRIALS.itertuples()]


def campaign_outputs():
    """The default target: the run's trials table and analysis, its records in the results store and
    the campaign's dashboard."""
    return [
        f"{RESULTS}/trials.csv",
        *analysis_outputs("analysis"),
        f"results/{CAMPAIGN.name}/dashboard/index.html",
    ]


# Aggregation and report (rules/analysis.smk, rules/report.smk), per scope: "analysis" reads the
# record of every planned trial, "partial" the records that exist (see rules/analysis.smk).


def table_path(name, fmt, scope="{scope}"):
    return f"{RESULTS}/{scope}/tables/{name}.{fmt}"


def table_files(names, scope="{scope}"):
    """Named outputs ``<table>_<format>`` of the tables ``names``, in every format (as the rule scripts
    read them: mlcampaign.analysis.tables.table_outputs). Like every analysis output they are
    update(): a failed aggregation leaves the previous tables in place."""
    return {
        f"{name}_{fmt}": update(table_path(name, fmt, scope))
        for name in names
        for fmt in TABLE_FORMATS
    }


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
    return scopes.existing_records(
        all_records() if wildcards.scope == "partial" else []
    )


def records_state(wildcards):
    """A digest of the existing records (mlcampaign.workflow.scopes.records_state): a params trigger."""
    return scopes.records_state(all_records() if wildcards.scope == "partial" else [])
