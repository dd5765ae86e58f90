"""``mlcampaign summary`` and ``mlcampaign compare`` on a results store: the verdicts of the one detection
path, and the exit status a cron job alerts on (0 nothing to report, 1 a regression, 3 failed trials,
4 cells that cannot tell yet)."""

import json

import pytest
from synthetic_records import synthetic_history

from mlcampaign.cli import EXIT_CANNOT_TELL, EXIT_FAILED_TRIALS, EXIT_OK, EXIT_REGRESSION, main, summary_status
from mlcampaign.history.store import RecordFile, open_store


def _stored(tmp_path, manifests, records) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{tmp_path / 'history.db'}"
    with open_store(url, create=True) as store:
        for manifest in manifests:
            run_id = manifest["run_id"]
            files = [
                RecordFile(f"{run_id}/{n}/record.json", r) for n, r in enumerate(records) if r["run"]["id"] == run_id
            ]
            store.ingest(manifest, files)
    return url


def store_of(tmp_path, weeks: int, unreached: bool = False, metrics=("throughput_samples_per_s",), **options) -> str:
    """A SQLite results store holding ``weeks`` weekly runs of one site's two systems, 3 trials a cell, judged on
    ``metrics`` (None: the campaign's default); ``unreached``: no trial reaches its target (epochs to target has
    no value in any run)."""
    manifests, records = synthetic_history(
        {"site": ["steady", "slowed"]}, ["bench"], [("1x1", "fp32")], weeks, trials=(3, 3), **options
    )
    for record in records if unreached else []:
        record["metrics"] |= {"reached_target": False, "epochs_to_target": None}
    for manifest in manifests if metrics else []:
        manifest["campaign_config"]["regression"]["metrics"] = list(metrics)
    return _stored(tmp_path, manifests, records)


def summary(url: str, run_id: str, capsys) -> tuple[int, dict]:
    status = main(["--store", url, "summary", run_id])
    return status, json.loads(capsys.readouterr().out)


def test_a_short_history_exits_4_and_names_the_cells_that_cannot_tell(tmp_path, capsys):
    status, printed = summary(store_of(tmp_path, 2), "site-2026w02", capsys)
    assert status == EXIT_CANNOT_TELL == 4
    assert printed["counts"]["cannot_tell"] == 2 and printed["counts"]["regressions"] == 0
    assert {entry["reason"] for entry in printed["cannot_tell"]} == {"insufficient history"}


def test_a_slowdown_exits_1_judged_on_the_sites_history_up_to_the_run(tmp_path, capsys):
    url = store_of(tmp_path, 8, slowdowns={"slowed": (6, 0.7)})
    status, printed = summary(url, "site-2026w07", capsys)
    assert status == EXIT_REGRESSION
    (change,) = [change for change in printed["changes"] if change["metric"] == "throughput_samples_per_s"]
    assert (change["system"], change["verdict"], change["change_start_run_id"]) == (
        "slowed",
        "regression",
        "site-2026w07",
    )
    # A run's summary does not depend on the runs after it: w06 is judged on w01-w06 alone.
    status, before = summary(url, "site-2026w06", capsys)
    assert before["changes"] == [] and status != EXIT_REGRESSION
    assert main(["--store", url, "compare", "site-2026w03", "site-2026w07"]) == EXIT_OK
    compared = capsys.readouterr().out
    assert "judged on the runs of its site from site-2026w03" in compared
    (line,) = [line for line in compared.splitlines() if line.startswith("slowed")]
    assert "regression" in line and float(line.split("%")[0].split()[-1]) < -20


def test_failed_trials_without_a_regression_exit_3(tmp_path, capsys):
    url = store_of(tmp_path, 2, failure_rate=0.4, seed=4)
    status, printed = summary(url, "site-2026w01", capsys)  # 3 of its 6 trials failed
    assert printed["trials"]["failed"] > 0 and status == EXIT_FAILED_TRIALS


def test_the_exit_status_orders_regressions_failed_trials_and_cells_that_cannot_tell():
    counts = dict.fromkeys(
        ["regressions", "convergence_regressions", "history_regressions", "not_measured", "cannot_tell"], 0
    ) | {"baseline_regressions": None}
    trials = {"failed": 0, "not_run": 0}
    assert summary_status({"counts": counts, "trials": trials}) == EXIT_OK
    assert summary_status({"counts": counts | {"cannot_tell": 3}, "trials": trials}) == EXIT_CANNOT_TELL
    assert summary_status({"counts": counts | {"cannot_tell": 3}, "trials": trials | {"not_run": 1}}) == 3
    for key in (
        "regressions",
        "convergence_regressions",
        "history_regressions",
        "not_measured",
        "baseline_regressions",
    ):
        assert summary_status({"counts": counts | {key: 1, "cannot_tell": 2}, "trials": trials | {"failed": 1}}) == 1


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a warning is then an internal error: exit 2, traceback
@pytest.mark.parametrize("unreached", [False, True], ids=["first run", "a cell without values"])
def test_summary_and_dashboard_of_a_first_run_write_nothing_to_stderr(tmp_path, capsys, unreached):
    """Nothing on stderr that a user cannot act on: numpy's warnings of empty or NaN statistics (a first run,
    a metric without values) are avoided where they arise, not filtered."""
    url = store_of(tmp_path, 1, unreached=unreached, metrics=None)
    assert main(["--store", url, "summary", "site-2026w01"]) == EXIT_CANNOT_TELL
    assert capsys.readouterr().err == ""
    assert main(["--store", url, "dashboard", "--out", str(tmp_path / "site")]) == EXIT_OK
    assert capsys.readouterr().err == ""


def contention(contended: bool, before: float | None = None, after: float | None = None) -> dict:
    """A record's contention block (mlcampaign.measure.contention) saying ``contended``, with the matmul roof
    measured ``before`` and ``after`` the timed training."""
    drop = None if before is None or after is None else max(0.0, 1 - after / before)
    return {
        "window_s": 10.0,
        "usable_cpus": 2,
        "online_cpus": 2,
        "steal_fraction": 0.0,
        "others_cpu_fraction": 0.6 if contended else 0.0,
        "own_cpu_fraction": 0.4,
        "involuntary_switches": 10,
        "involuntary_switches_per_s": 1.0,
        "busiest_threads_involuntary_switches": [],
        "loadavg_1min_start": 3.0 if contended else 0.5,
        "loadavg_1min_end": 3.0 if contended else 0.5,
        "other_runnable_threads_start": None,
        "other_runnable_threads_end": None,
        "matmul_peak_before_flops_per_s": before,
        "matmul_peak_after_flops_per_s": after,
        "matmul_peak_drop_fraction": drop,
        "contended": contended,
        "reasons": ["other processes used the CPUs"] if contended else [],
        "thresholds": {"others_cpu_fraction": 0.25},
    }


def test_a_slowdown_that_the_canaries_saw_is_one_system_change_and_one_they_did_not_a_stack_change(tmp_path, capsys):
    """The "slowed" system's one cell slows by 30 % from w07 with a torch upgrade in its records: with its
    canaries slowed as much, the machine changed (a system change, exit 1); with the canaries steady, the cell
    moved alone with a stack difference (a software-stack change)."""
    from synthetic_records import add_canaries

    for shifted, cause in ((True, "system change"), (False, "software-stack change")):
        manifests, records = synthetic_history(
            {"site": ["steady", "slowed"]},
            ["bench"],
            [("1x1", "fp32")],
            7,  # w07 the latest: the dashboard shows its groups
            trials=(3, 3),
            slowdowns={"slowed": (6, 0.7)},
        )
        for manifest in manifests:
            manifest["campaign_config"]["regression"]["metrics"] = ["throughput_samples_per_s"]
        shifts = {"slowed": ("site-2026w07", 0.7)} if shifted else None
        url = _stored(
            tmp_path / cause.replace(" ", "-"), manifests, add_canaries(records, cv=0.01, machine_shifts=shifts)
        )
        status, printed = summary(url, "site-2026w07", capsys)
        assert status == EXIT_REGRESSION
        (group,) = [group for group in printed["alert_groups"] if group["matters"]]
        assert (group["cause"], group["systems"], group["start_run_id"]) == (cause, ["slowed"], "site-2026w07")
        assert [cell["system"] for cell in group["cells"]] == ["slowed"] and group["cells"][0]["relative_change"] < -0.2
        assert printed["counts"]["alert_groups_that_matter"] == 1
    # The dashboard's overview shows the latest runs' groups, each cell linked to its trend page.
    assert main(["--store", url, "dashboard", "--out", str(tmp_path / "site")]) == EXIT_OK
    overview = (tmp_path / "site" / "index.html").read_text()
    groups = overview[
        overview.index('id="alert-groups"') : overview.index("</table>", overview.index('id="alert-groups"'))
    ]
    assert "software-stack change" in groups and 'href="trends-slowed--bench.html"' in groups


def test_a_run_whose_cell_could_not_be_judged_is_never_exit_0(tmp_path, capsys):
    """The issue's busy machine: every trial of a cell contended (left out) and no canary to judge them against:
    no value, counted as unjudged and listed, exit 4 (not 0); the contention is one group that does not matter."""
    manifests, records = synthetic_history(
        {"site": ["steady", "slowed"]}, ["bench"], [("1x1", "fp32")], 6, trials=(3, 3)
    )
    for manifest in manifests:
        manifest["campaign_config"]["regression"]["metrics"] = ["throughput_samples_per_s"]
    for record in records:
        record["contention"] = contention(
            record["run"]["id"] == "site-2026w06" and record["trial"]["system"] == "slowed"
        )
    status, printed = summary(_stored(tmp_path, manifests, records), "site-2026w06", capsys)
    assert status == EXIT_CANNOT_TELL and printed["counts"]["unjudged"] == 1
    (unjudged,) = printed["unjudged"]
    assert (unjudged["system"], unjudged["verdict"], unjudged["contended"]) == ("slowed", "no value", 3)
    (group,) = printed["alert_groups"]
    assert (group["cause"], group["matters"], group["cells"][0]["judged"]) == ("contention", False, "left out")
