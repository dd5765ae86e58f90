"""One Snakemake invocation's plan: what rules/common.smk reads, built once per process by ``plan_workflow``.

Planning validates the campaign and every system and benchmark file it names, resolves this invocation's
site and run (mlcampaign.plan.runs) and pins the run for the jobs it spawns, refuses before any trial what
the run's ingest would refuse, lays out the campaign's trials and this site's share of them, and warns
about the cells that cannot yet detect the campaign's target change (mlcampaign.workflow.readiness).
Every refusal is a ``PlanningError`` with the message of the check that refused, which rules/common.smk
raises as Snakemake's WorkflowError (there, so that Snakemake shows the message without a traceback into
the package), stopping Snakemake before it plans any job; the rules only read the ``WorkflowPlan``.

``workflow`` is Snakemake's own object (the Snakefile's ``workflow``): planning reads its campaign files,
--config settings, default resources, global resources and whether this is the main process.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from mlcampaign.history.store import StoreError, StoreUnavailableError, open_store
from mlcampaign.job.launch import LaunchError, slurm_account
from mlcampaign.plan.config import load_campaign, load_published
from mlcampaign.plan.config_files import ConfigError, load_yaml
from mlcampaign.plan.runs import Run, at_site, check_run_start, invocation_site, pin_run, resolve_run
from mlcampaign.records.provenance import WORKFLOW_DIR_VARIABLE
from mlcampaign.records.run_manifest import trial_attempts
from mlcampaign.workflow.readiness import detection_warnings, latest_summary

if TYPE_CHECKING:
    import pandas as pd

    from mlcampaign.plan.campaign import Campaign


class PlanningError(Exception):
    """A campaign this invocation cannot run; the message says what and where (file, key, value)."""


@dataclasses.dataclass(frozen=True)
class WorkflowPlan:
    """What the rules read about this invocation."""

    campaign: Campaign
    site: str
    run: Run
    campaign_trials: pd.DataFrame  # every trial of the campaign: the run's manifest lists them all
    here: pd.Series  # which of campaign_trials run at this site
    trials: pd.DataFrame  # this site's trials: one job each
    datasets: dict[str, dict]  # each dataset the campaign's benchmarks use, by name (staged once, shared)
    attempts: dict[str, int]  # each trial folder's attempt (mlcampaign.records.run_manifest.trial_attempts)
    published: dict | None  # the published study of the campaign (``published``), if it names one
    workflow_dir: Path  # the workflow's checkout


def plan_workflow(workflow, config: dict, logger) -> WorkflowPlan:
    """The plan of this invocation (module docstring); ``logger``: Snakemake's, for what planning says."""
    # The workflow's checkout, for the git commit that every record and the run's manifest name (through
    # the environment, to the jobs and trials it starts).
    workflow_dir = Path(workflow.main_snakefile).resolve().parent
    os.environ[WORKFLOW_DIR_VARIABLE] = str(workflow_dir)
    try:
        campaign, site, run = _campaign_site_and_run(workflow, config, logger)
        # Every trial of the campaign is in the run's manifest; those of this site's systems are jobs.
        campaign_trials = campaign.trial_matrix()
        here = at_site(campaign, campaign_trials, site, campaign.config["other_sites"])
        trials = campaign_trials[here]
        # The budget code of every Slurm system with planned trials: an unset variable stops planning here.
        for system_name in sorted(set(trials.system)):
            slurm_account(campaign.systems[system_name])
    except (ConfigError, LaunchError, StoreError) as error:
        raise PlanningError(str(error)) from None
    # The cells whose trials and history cannot yet detect the campaign's target change
    # (docs/regression.md), from the site's latest run summary, not the results store (once, in the
    # main process).
    if workflow.is_main_process:
        for message in detection_warnings(
            trials.reset_index(drop=True).groupby(["system", "benchmark", "cell"]).size().to_dict(),
            campaign.config["regression"],
            latest_summary(run.directory.parent, site, run.run_id, logger.warning),
            str(run.directory.parent),
        ):
            logger.warning(message)
    _check_trial_slots(workflow)
    return WorkflowPlan(
        campaign=campaign,
        site=site,
        run=run,
        campaign_trials=campaign_trials,
        here=here,
        trials=trials,
        datasets={b["dataset"]["name"]: b["dataset"] for b in campaign.benchmarks.values()},
        # Each trial's attempt: its earlier records, plus one for a failed trial to run again (a param).
        attempts=trial_attempts(run.directory, campaign.config["rerun_failed"]),
        published=_published_study(campaign, workflow),
        workflow_dir=workflow_dir,
    )


def _campaign_site_and_run(workflow, config: dict, logger) -> tuple[Campaign, str, Run]:
    """The validated campaign, this invocation's site and its run, checked against the clocks and the store."""
    # The Snakefile loads config/config.yaml only without --configfile: a campaign file is whole.
    campaign_files = list(map(str, workflow.overwrite_configfiles or workflow.configfiles))
    # Snakemake's own reading keeps the last of two equal keys: read the files again, strictly, so
    # that a key given twice is refused with its file and line.
    for path in campaign_files:
        load_yaml(Path(path))
    campaign = load_campaign(
        config,
        config_dir=Path(workflow.basedir) / "config",
        source=", ".join(campaign_files),
        cli_keys=workflow.config_settings.config.keys(),
    )
    # This invocation's site and run (mlcampaign.plan.runs); the jobs it spawns work on the same run.
    # (No default resources at all under `snakemake --lint`.)
    default_resources = workflow.resource_settings.default_resources
    site = invocation_site(campaign.config, (default_resources.args if default_resources else None) or ())
    run = resolve_run(campaign.name, site, campaign.config.get("run"))
    pin_run(workflow.config_settings, run.run_id)
    # What the run's ingest would refuse, refused before any trial trains: a start the clocks put out
    # of order, a run id the results store holds as another run. By the main process only: its clock
    # starts the run, and a job on a compute node need not reach the store.
    if workflow.is_main_process:
        check_run_start(campaign.name, run)
        try:
            with open_store(campaign.config["history"]["store"], create=False) as store:
                store.check_planned_run(run.run_id, campaign.name, site, run.started_utc, new=run.created)
        # No store yet, or none reachable from here.
        except StoreUnavailableError as error:
            logger.info(f"run {run.run_id}: not checked against the results store ({error}); its ingest checks it")
    return campaign, site, run


def _check_trial_slots(workflow) -> None:
    """Packing (docs/sites.md): a packed allocation runs its trials one after another. Snakemake would lay
    more at once side by side and add up their nodes, tasks, CPUs per task and memory, which is no
    allocation that fits them."""
    slots = workflow.global_resources.get("trial_slots").value
    if slots not in (None, 1):
        raise PlanningError(
            f"--resources trial_slots={slots}: packed trials run "
            "one after another in their allocation; use trial_slots=1 (docs/sites.md, Packing)"
        )


def _published_study(campaign: Campaign, workflow) -> dict | None:
    """The published study a campaign's cells are compared with (config/published/<study>.yaml,
    mlcampaign.analysis.published), if the campaign names one (``published``)."""
    if "published" not in campaign.config:
        return None
    try:
        return load_published(campaign.config["published"]["study"], Path(workflow.basedir) / "config")
    except ConfigError as error:
        raise PlanningError(str(error)) from None
