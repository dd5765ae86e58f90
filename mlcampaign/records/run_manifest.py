"""A run's manifest (``run.json``: the campaign's config, its systems' and benchmarks' configs, and the whole
campaign's plan with ``at_site`` for the trials of this site), written into the run's folder
(mlcampaign.plan.runs), and how often each trial of the run ran before. The results store and the merged,
multi-site analysis read the manifest (mlcampaign.history). ``results/<campaign>/latest`` links to the run
last worked on.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from mlcampaign.measure.software_stack import packages_sha256, python_packages
from mlcampaign.plan.config_files import ConfigError
from mlcampaign.plan.runs import LATEST_LINK, MANIFEST_FILE, Run, read_run_json
from mlcampaign.records.files import SUPERSEDED_DIR, write_json_atomic


def write_manifest(run_dir: Path, manifest: dict) -> None:
    """Write the run's manifest (``run_manifest``) into its folder, and point
    ``results/<campaign>/latest`` at the run."""
    run_dir = Path(run_dir)
    write_json_atomic(manifest, run_dir / MANIFEST_FILE)
    link = run_dir.parent.parent / LATEST_LINK
    target = Path("runs") / run_dir.name
    if not link.is_symlink() or Path(os.readlink(link)) != target:
        temporary = link.with_name(f".{LATEST_LINK}.{os.getpid()}")
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(target)
        os.replace(temporary, link)


def json_rows(frame: pd.DataFrame) -> list[dict]:
    """The rows of ``frame`` as JSON objects, a missing value as null: pandas' string columns hold a
    missing value as NaN, which is not JSON (the store refuses it)."""
    return frame.astype(object).where(frame.notna(), None).to_dict(orient="records")


def run_manifest(run: Run, campaign, trials: pd.DataFrame, here: pd.Series, workflow_commit: str | None) -> dict:
    """A run's manifest: its id, site and start, the campaign's config, its systems' and benchmarks'
    configs, every trial the campaign plans (``at_site``: this site runs it) and the pairs it does
    not plan; and the Python packages of the environment that planned it (``software``: the trials'
    software stacks in their records carry the hash of their own list, equal where it is this one)."""
    plan = trials.reset_index(drop=True).assign(at_site=here.to_numpy())
    packages = python_packages()
    return {
        "run_id": run.run_id,
        "site": run.site,
        "started_utc": run.started_utc,
        "campaign": campaign.name,
        "campaign_config": campaign.described_config,
        "systems": campaign.systems,
        "benchmarks": campaign.benchmarks,
        "plan": json_rows(plan),
        "unplanned": json_rows(campaign.unplanned_cells()),
        "workflow_commit": workflow_commit,
        "software": {"python_packages": packages, "python_packages_sha256": packages_sha256(packages)},
    }


def trial_attempts(run_dir: Path, rerun_failed: bool) -> dict[str, int]:
    """Each trial folder of the run (relative to the working directory) -> its attempt: how many earlier
    records it has (mlcampaign.records.files.SUPERSEDED_DIR), plus one for a failed trial when failed trials
    are to run again. The trial rule takes it as a param, so that a change of it (only) re-runs the
    trial, and the count is the same afterwards: a re-run does not repeat."""
    attempts = {
        str(folder.parent): sum(1 for _ in folder.iterdir())
        for folder in Path(run_dir).glob(f"trials/*/*/*/*/{SUPERSEDED_DIR}")
    }
    if rerun_failed:
        for path in Path(run_dir).glob("trials/*/*/*/*/record.json"):
            try:
                failed = read_run_json(path, run_dir)["status"] == "failed"
            except (OSError, ConfigError, KeyError, TypeError):
                failed = True  # an unreadable record is no outcome either
            if failed:
                attempts[str(path.parent)] = attempts.get(str(path.parent), 0) + 1
    return attempts
