"""Runs: one execution of a campaign at one site at one time, with an id, a folder and a manifest.

Every output of a run lives under ``results/<campaign>/runs/<run id>/`` (its trials' records and
MLPerf logs, its tables, figures and report), so a campaign is measured again — every week, after
an upgrade — without renaming it, and every run's results stay. Inside a run, Snakemake re-runs
what is stale as always: content decides, and a finished run plans nothing.

Which run a ``snakemake`` invocation works on (``resolve_run``):

- ``--config run=<id>``: that run (created if it does not exist yet);
- ``--config run=new``: a new run, with the id ``<site>-<UTC time>`` (e.g. ``archer2-20261201T093000Z``);
- neither: the latest run of the campaign at this site, or a new one if there is none.

The site is the profile's (``default-resources: site=<name>`` in profiles/<site>/config.yaml), or
``--config site=<name>``, or ``local``. A run's manifest (``run.json``, mlcampaign.records.run_manifest)
is what the results store and the merged, multi-site analysis read (mlcampaign.history).

Runs are ordered by their start: the previous run of a site is the one a regression check compares
with, the latest one the tables and dashboard show. A clock set wrong breaks that order, so before
any trial trains (``check_run_start``) a run that starts in the future (by more than
``CLOCK_TOLERANCE``) is refused, and so is a new run that would start before the site's previous run
(this machine's clock is behind, or that run's start is in the future); the results store refuses
and warns likewise at ingest (mlcampaign.history.store).

A run folder that an import of a bundle wrote (``mlcampaign import --results``) holds ``IMPORTED_MARKER``: it
is another site's run (or a store's), whatever site its manifest names, so it is never this site's latest
run, and naming it (``--config run=``) is refused; the ingest of such a folder never supersedes what the store
holds (mlcampaign.history.bundle).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlcampaign.plan.config_files import ConfigError, read_json_file
from mlcampaign.plan.names import InvalidNameError, check_name, name_problem, shown

if TYPE_CHECKING:
    import pandas as pd


def utc_now() -> str:
    """The time stamp of runs and records: UTC, ISO 8601, to the second."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


# How far the clocks of two machines (the one that starts a run, the one that ingests it) may differ
# before a start after "now" is a clock set wrong: NTP keeps them within a second.
CLOCK_TOLERANCE = datetime.timedelta(minutes=10)


NEW_RUN = "new"
MANIFEST_FILE = "run.json"
# Written first into a run folder that an import of a bundle creates (mlcampaign.history.bundle): a run of
# another site, or of a store, never one this site's workflow continues or ingests as its own.
IMPORTED_MARKER = "imported.json"
LATEST_LINK = "latest"
DEFAULT_SITE = "local"


@dataclasses.dataclass(frozen=True)
class Run:
    run_id: str
    site: str
    directory: Path  # results/<campaign>/runs/<run id>, relative to the working directory
    started_utc: str  # when the run was created
    created: bool  # this invocation creates it


def invocation_site(config: dict, default_resources: Iterable[str]) -> str:
    """The site of this invocation: ``--config site=``, else the profile's ``site`` default resource
    (``default_resources`` as Snakemake keeps them, ``name=value`` texts), else ``local``."""
    if config.get("site"):
        return config["site"]
    for text in default_resources:
        name, _, value = text.partition("=")
        if name.strip() == "site":
            try:
                return check_name(value.strip().strip("'\""), "the profile's default-resources: site")
            except InvalidNameError as error:
                raise ConfigError(str(error)) from None
    return DEFAULT_SITE


def at_site(campaign, trials: pd.DataFrame, site: str, other_sites: str) -> pd.Series:
    """Which of the campaign's planned ``trials`` run at ``site`` (their system's ``site``). Trials
    of other sites' systems are refused (ConfigError naming them and the ways out) unless
    ``other_sites`` is ``skip``, or none is at this site."""
    sites = trials["system"].map({name: system.get("site") for name, system in campaign.systems.items()})
    here = sites == site
    elsewhere = sorted(set(zip(trials.loc[~here, "system"], sites[~here], strict=True)))
    if elsewhere and (other_sites != "skip" or not here.any()):
        named = ", ".join(f"{system} (site {system_site})" for system, system_site in elsewhere)
        reach = "none of its systems is" if not here.any() else "these are not"
        raise ConfigError(
            f"campaign {campaign.name}: this run is at site '{site}' (the profile's default-resources site, "
            f"or --config site=), and {reach} at this site: {named}. Run each system at its own site with its "
            "profile, or plan this site's systems only: --config other_sites=skip (the others show as "
            "'not run at this site') or --config 'systems=[...]'"
        )
    return here


def runs_dir(campaign: str) -> Path:
    return Path("results") / campaign / "runs"


# The most a file of a run folder may hold when read (its manifest, its summary, a record, an MLPerf log): a run's
# files travel in its bundle, whose members are bounded by it (mlcampaign.history.bundle.limits, which says why).
MAX_RUN_FILE_BYTES = 64 * 2**20


def read_run_json(path: Path, runs: Path) -> Any:
    """The JSON document of a run's file ``path`` (below ``runs``, a campaign's runs folder or a run's own
    folder), read within bounds (mlcampaign.plan.config_files.read_json_file: a regular file of at most
    MAX_RUN_FILE_BYTES, never through a link below ``runs``); FileNotFoundError if there is none."""
    over = f"over the limit of a run's file ({MAX_RUN_FILE_BYTES} bytes)"
    return read_json_file(path, MAX_RUN_FILE_BYTES, over, runs)


def read_manifest(directory: Path) -> dict | None:
    """The run manifest in ``directory`` (a folder of a campaign's runs folder), or None if the run has none
    yet; ConfigError naming the file for one that is not a run's manifest (planning reads its site and start)."""
    path = Path(directory) / MANIFEST_FILE
    try:
        manifest = read_run_json(path, Path(directory).parent)
    except FileNotFoundError:
        return None
    except ConfigError as error:
        raise ConfigError(
            f"{error} (a run's manifest; move the damaged run folder away, or restore its run.json, to plan this "
            "campaign)"
        ) from None
    if not isinstance(manifest, dict):
        raise ConfigError(f"{path}: not a run manifest (not a JSON object)")
    for key in ("site", "started_utc"):
        if not isinstance(manifest.get(key), str) or not manifest[key]:
            raise ConfigError(
                f"{path}: not a run manifest: key '{key}': value {manifest.get(key)!r} is not text; move the "
                "damaged run folder away (or restore its run.json) to plan this campaign"
            )
    return manifest


def derived_run_id(site: str, now: datetime.datetime | None = None) -> str:
    """A new run's id: the site and the UTC time."""
    now = now or datetime.datetime.now(datetime.UTC)
    return f"{site}-{now:%Y%m%dT%H%M%SZ}"


def imported(directory: Path) -> bool:
    """Whether a run folder was written by an import of a bundle (``IMPORTED_MARKER``), not by this site."""
    return (Path(directory) / IMPORTED_MARKER).exists()


def latest_run(campaign: str, site: str) -> Path | None:
    """The folder of the campaign's most recently started run at ``site``, if any (an imported run is never
    this site's, whatever site its manifest names)."""
    candidates = []
    for directory in runs_dir(campaign).glob("*"):
        manifest = read_manifest(directory) if directory.is_dir() and not imported(directory) else None
        if manifest is not None and manifest["site"] == site:
            candidates.append((manifest["started_utc"], directory.name, directory))
    return max(candidates)[2] if candidates else None


def resolve_run(campaign: str, site: str, requested: str | None) -> Run:
    """The run this invocation works on (module docstring). Snakemake's main process resolves it and
    passes the run's id to the jobs it spawns (``pin_run``), so a job never resolves ``new`` again."""
    problem = name_problem(requested) if requested not in (None, NEW_RUN) else None
    if problem is not None:
        raise ConfigError(
            f"--config run: value {shown(requested)} is not a run id: {problem} (or '{NEW_RUN}' for a new run)"
        )
    latest = latest_run(campaign, site) if requested is None else None
    if requested == NEW_RUN or (requested is None and latest is None):
        run_id = derived_run_id(site)
        problem = name_problem(run_id)
        if problem is not None:
            raise ConfigError(f"a new run's id {shown(run_id)} is no name: {problem}; name the run (--config run=<id>)")
    else:
        run_id = latest.name if requested is None else requested
    directory = runs_dir(campaign) / run_id
    if imported(directory):
        raise ConfigError(
            f"--config run: value '{run_id}': run {run_id} of campaign {campaign} was imported from a bundle "
            f"({directory / IMPORTED_MARKER}): it is another site's run, or a store's, which this site neither "
            "continues nor ingests as its own; name another run"
        )
    manifest = read_manifest(directory)
    if manifest is not None and manifest["site"] != site:
        raise ConfigError(
            f"--config run: value '{run_id}': run {run_id} of campaign {campaign} is site '{manifest['site']}''s "
            f"({directory / MANIFEST_FILE}), not this site's '{site}'; name another run"
        )
    started = manifest["started_utc"] if manifest is not None else utc_now()
    return Run(run_id, site, directory, started, created=manifest is None)


def _instant(text: str, where: str) -> datetime.datetime:
    try:
        instant = datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: key 'started_utc': value {text!r} is not an ISO 8601 time") from None
    return instant if instant.tzinfo else instant.replace(tzinfo=datetime.UTC)


def check_run_start(campaign: str, run: Run, now: datetime.datetime | None = None) -> None:
    """Refuse (ConfigError) a run that starts in the future of this machine's clock, or a new run that
    would start before the latest run of the campaign at its site (module docstring): either clock is
    wrong, and the trends, regression checks and "latest" tables would order the runs wrongly."""
    now = now or datetime.datetime.now(datetime.UTC)
    where = run.directory / MANIFEST_FILE
    started = _instant(run.started_utc, str(where))
    if started > now + CLOCK_TOLERANCE:
        raise ConfigError(
            f"{where}: key 'started_utc': value '{run.started_utc}' is after this machine's clock "
            f"({now.isoformat(timespec='seconds')}): the clock of the machine that started run {run.run_id} was "
            "ahead, or this one's is behind. Correct the clock (NTP); a run whose start is wrong cannot be "
            "ingested: move its folder out of the campaign's runs/ and start a new run"
        )
    if not run.created:
        return
    previous = latest_run(campaign, run.site)
    if previous is None:
        return
    manifest = read_manifest(previous)
    if _instant(manifest["started_utc"], str(previous / MANIFEST_FILE)) > started:
        raise ConfigError(
            f"--config run: a new run {run.run_id} would start at {run.started_utc} (this machine's clock), before "
            f"run {previous.name} of campaign {campaign} at site {run.site}, which started "
            f"{manifest['started_utc']} ({previous / MANIFEST_FILE}): this machine's clock is behind, or that run's "
            "start is in the future. Runs are ordered by their start (previous run, regression checks, latest "
            "tables): correct the clock (NTP), or move a run whose start is wrong out of the campaign's runs/"
        )


def pin_run(config_settings, run_id: str) -> None:
    """Make the jobs that Snakemake spawns (on Slurm, Kubernetes: they read the Snakefile again) work on
    run ``run_id``: their ``--config`` arguments name it."""
    arguments = [argument for argument in config_settings.config_args or [] if not argument.startswith("run=")]
    config_settings.config_args = [*arguments, f"run={run_id}"]
