import functools
import hashlib
import inspect
import json
import os
import sys

sys.path.insert(0, workflow.basedir)

from snakemake.common import overwrite_function_params

from mlcampaign.analysis.outputs import FIGURE_TABLES, TABLE_FORMATS, TABLES
from mlcampaign.data.manifest import DATA_DIR, ID_FILE, MANIFEST_FILE, DatasetError
from mlcampaign.history.readiness import detection_warnings, latest_summary
from mlcampaign.history.store import (
    StoreError,
    StoreUnavailableError,
    open_store,
)
from mlcampaign.job.launch import (
    LaunchError,
    job_resources,
    slurm_account,
    trial_runtime,
)
from mlcampaign.plan.config import load_campaign, load_published
from mlcampaign.plan.config_files import ConfigError, load_yaml
from mlcampaign.plan.launchers import threads_per_process
from mlcampaign.plan.runs import (
    at_site,
    check_run_start,
    invocation_site,
    pin_run,
    resolve_run,
)
from mlcampaign.plan.urls import URLError, parse_store_url
from mlcampaign.records.provenance import WORKFLOW_DIR_VARIABLE, git_state
from mlcampaign.records.run_manifest import run_manifest, trial_attempts

# The workflow's checkout, for the git commit that every record and the run's manifest name (through
# the environment, to the jobs and trials it starts).
WORKFLOW_DIR = Path(workflow.main_snakefile).resolve().parent
os.environ[WORKFLOW_DIR_VARIABLE] = str(WORKFLOW_DIR)

# Validate the campaign and every system and benchmark file it names before any job is planned.
# The Snakefile loads config/config.yaml only without --configfile: a campaign file is whole.
CAMPAIGN_FILES = list(map(str, workflow.overwrite_configfiles or workflow.configfiles))
try:
    # Snakemake's own reading keeps the last of two equal keys: read the files again, strictly, so
    # that a key given twice is refused with its file and line.
    for path in CAMPAIGN_FILES:
        load_yaml(Path(path))
    CAMPAIGN = load_campaign(
        config,
        config_dir=Path(workflow.basedir) / "config",
        source=", ".join(CAMPAIGN_FILES),
        cli_keys=workflow.config_settings.config.keys(),
    )
    # The results store's URL names a kind of store there is a backend for (the schema checks its form).
    try:
        parse_store_url(CAMPAIGN.config["history"]["store"])
    except URLError as error:
        raise ConfigError(
            f"{', '.join(CAMPAIGN_FILES)}: key 'history.store': {error}"
        ) from None
    # This invocation's site and run (mlcampaign.plan.runs); the jobs it spawns work on the same run.
    # (No default resources at all under `snakemake --lint`.)
    DEFAULT_RESOURCES = workflow.resource_settings.default_resources
    SITE = invocation_site(
        CAMPAIGN.config, (DEFAULT_RESOURCES.args if DEFAULT_RESOURCES else None) or ()
    )
    RUN = resolve_run(CAMPAIGN.name, SITE, CAMPAIGN.config.get("run"))
    pin_run(workflow.config_settings, RUN.run_id)
    # What the run's ingest would refuse, refused before any trial trains: a start the clocks put out
    # of order, a run id the results store holds as another run. By the main process only: its clock
    # starts the run, and a job on a compute node need not reach the store.
    if workflow.is_main_process:
        check_run_start(CAMPAIGN.name, RUN)
        try:
            with open_store(CAMPAIGN.config["history"]["store"], create=False) as store:
                store.check_planned_run(
                    RUN.run_id, CAMPAIGN.name, SITE, RUN.started_utc, new=RUN.created
                )
        # No store yet, or none reachable from here.
        except StoreUnavailableError as error:
            logger.info(
                f"run {RUN.run_id}: not checked against the results store ({error}); its ingest checks it"
            )
    # Every trial of the campaign is in the run's manifest; those of this site's systems are jobs.
    CAMPAIGN_TRIALS = CAMPAIGN.trial_matrix()
    HERE = at_site(CAMPAIGN, CAMPAIGN_TRIALS, SITE, CAMPAIGN.config["other_sites"])
    TRIALS = CAMPAIGN_TRIALS[HERE]
    # The budget code of every Slurm system with planned trials: an unset variable stops planning here.
    for system_name in sorted(set(TRIALS.system)):
        slurm_account(CAMPAIGN.systems[system_name])
except (ConfigError, LaunchError, StoreError) as error:
    raise WorkflowError(str(error)) from None
# The cells whose trials and history cannot yet detect the campaign's target change (docs/regression.md),
# from the site's latest run summary, not the results store (once, in the main process).
if workflow.is_main_process:
    for message in detection_warnings(
        TRIALS.reset_index(drop=True)
        .groupby(["system", "benchmark", "cell"])
        .size()
        .to_dict(),
        CAMPAIGN.config["regression"],
        latest_summary(RUN.directory.parent, SITE, RUN.run_id),
        str(RUN.directory.parent),
    ):
        logger.warning(message)
# Packing (docs/sites.md): a packed allocation runs its trials one after another. Snakemake would lay
# more at once side by side and add up their nodes, tasks, CPUs per task and memory, which is no
# allocation that fits them.
if workflow.global_resources.get("trial_slots").value not in (None, 1):
    raise WorkflowError(
        f"--resources trial_slots={workflow.global_resources.get('trial_slots').value}: packed trials run "
        "one after another in their allocation; use trial_slots=1 (docs/sites.md, Packing)"
    )
RESULTS = str(RUN.directory)
# Each trial's attempt: its earlier records, plus one for a failed trial to run again (a param).
TRIAL_ATTEMPTS = trial_attempts(RUN.directory, CAMPAIGN.config["rerun_failed"])


# Each dataset the campaign's benchmarks use, by name (staged once, shared by benchmarks).
DATASETS = {b["dataset"]["name"]: b["dataset"] for b in CAMPAIGN.benchmarks.values()}


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
