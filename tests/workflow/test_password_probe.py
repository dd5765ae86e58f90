"""The probe of issue #33: every form a password can take in a results store URL (tests/passwords.py), tried
against every command that takes a store (``--store`` and ``MLCAMPAIGN_STORE``), ``--help``, ``check`` of a
campaign file, a real workflow run given the URL by ``--config``, and then every file written (Snakemake's
``.snakemake/log/``, the dashboard's pages): no part of the password appears anywhere, and every command
refuses the URL (exit status 2)."""

from __future__ import annotations

import passwords
import pytest
import yaml
from synthetic_records import synthetic_history

from mlcampaign.cli import main
from mlcampaign.history.store import RecordFile, open_store

from conftest import REPO, run_snakemake

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """A dashboard built from a store of two runs (its URL holds no password)."""
    root = tmp_path_factory.mktemp("dashboard")
    manifests, records = synthetic_history({"site-a": ["alpha-cpu"]}, ["bench0"], [("1x1", "fp32")], 2, seed=5)
    url = f"sqlite:///{root / 'history.db'}"
    with open_store(url) as store:
        for manifest in manifests:
            run_id = manifest["run_id"]
            files = [RecordFile(f"{run_id}/{i}.json", r) for i, r in enumerate(records) if r["run"]["id"] == run_id]
            store.ingest(manifest, files)
    assert main(["--store", url, "dashboard", "--out", str(root / "site")]) == 0
    return root / "site"


def store_commands(tmp_path, dashboard) -> list[list[str]]:
    """Every command that opens the results store."""
    return [
        ["runs", "list"],
        ["runs", "show", "w1"],
        ["runs", "diff", "w1", "w2"],
        ["summary", "w1"],
        ["compare", "w1", "w2"],
        ["ingest", str(tmp_path / "results" / "c" / "runs" / "w1")],
        ["import", str(tmp_path / "w1.tar.gz")],
        ["export", "w1", "--out", str(tmp_path / "w1.tar.gz")],
        ["tables", "c", "--out", str(tmp_path / "tables")],
        ["dashboard", "--out", str(dashboard)],
    ]


@pytest.mark.parametrize("url", passwords.FORMS)
def test_no_form_of_a_store_password_is_ever_shown(url, tmp_path, capsys, monkeypatch, dashboard, default_campaign):
    texts = []
    for command in store_commands(tmp_path, dashboard):
        status = main(["--store", url, *command])
        texts.extend(capsys.readouterr())
        assert status == 2, (command, texts[-1])
    monkeypatch.setenv("MLCAMPAIGN_STORE", url)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert main(["runs", "list"]) == 2
    texts.extend(capsys.readouterr())
    monkeypatch.delenv("MLCAMPAIGN_STORE")

    # A campaign file: the URL as the store, and as text where a mapping belongs (a --config Snakemake read so).
    for history in ({"store": url}, f"{{store: {url}}}"):
        campaign = tmp_path / "campaign.yaml"
        campaign.write_text(yaml.safe_dump(default_campaign | {"history": history}))
        assert main(["check", str(campaign), "--config-dir", str(REPO / "config")]) == 2
        texts.extend(capsys.readouterr())

    # A real workflow run given the URL on the command line; then every file it wrote, and the dashboard's.
    workdir, quoted = tmp_path / "work", url.replace("'", "''")
    workdir.mkdir()
    result = run_snakemake(workdir, campaign, "--cores", "1", "--config", f"history={{store: '{quoted}'}}")
    assert result.returncode != 0 and "key 'history.store': value " in result.stderr, result.stderr[-2000:]
    assert list((workdir / ".snakemake" / "log").glob("*.log"))
    written = [*workdir.rglob("*"), *dashboard.rglob("*")]
    texts += [result.stdout, result.stderr, *(path.read_text(errors="replace") for path in written if path.is_file())]
    assert not passwords.shown_anywhere(texts)
