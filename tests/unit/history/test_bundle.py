"""Run bundles: a run directory or a stored run as one file, imported into a store or a results
directory; damaged bundles (wrong checksum, missing or unlisted member, cut at any byte, invalid
record) refused naming the bundle and the member, with the store and results directory unchanged."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
import test_store
from test_store import manifest, synthetic_record

from mlcampaign.history.bundle import (
    BundleError,
    export_run_directory,
    export_store_run,
    import_into_results,
    import_into_store,
    read_bundle,
    read_run_directory,
    trial_directory,
)
from mlcampaign.history.store import RecordError, RecordFile, open_store
from mlcampaign.records.files import content_sha256, write_json_atomic

# The store fixtures: every test that uses a store runs on SQLite and on PostgreSQL.
backend = test_store.backend

RUN = "epcc-2024/runs/2026w48"


def member_of(record: dict, name: str = "record.json") -> str:
    """The bundle member of a file of ``record``'s trial."""
    return f"{RUN}/{trial_directory(record)}/{name}"


def write_run_directory(results: Path, records: list[dict], run_id: str = "2026w48") -> Path:
    """A run's files as the workflow lays them out, and the manifest of the dataset its records name."""
    run_dir = results / "epcc-2024" / "runs" / run_id
    write_json_atomic(manifest(run_id), run_dir / "run.json")
    for record in records:
        trial = run_dir / trial_directory(record)
        write_json_atomic(record, trial / "record.json")
        (trial / "mllog.txt").write_text(f':::MLLOG {{"key": "run_stop", "value": "{record["status"]}"}}\n')
    dataset = records[0]["dataset"]
    write_json_atomic(
        {"manifest_version": 1, "name": dataset["name"], "format": "synthetic", "files": [], "dataset_id": "0" * 16},
        results / "datasets" / dataset["name"] / "manifest.json",
    )
    return run_dir


def files_under(directory: Path) -> dict[str, bytes]:
    return {
        path.relative_to(directory).as_posix(): path.read_bytes() for path in directory.rglob("*") if path.is_file()
    }


def raw_members(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(bundle, "r:gz") as archive:
        return {entry.name: archive.extractfile(entry).read() for entry in archive}


def write_members(bundle: Path, members: dict[str, bytes], *, checksums: bool = False) -> Path:
    """A tar.gz of ``members`` in order; ``checksums``: with SHA256SUMS recomputed to match them."""
    if checksums:
        listed = {name: data for name, data in members.items() if name != "SHA256SUMS"}
        sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in listed.items())
        members = {"SHA256SUMS": sums.encode(), **listed}
    with tarfile.open(bundle, "w:gz") as archive:
        for name, data in members.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            archive.addfile(entry, io.BytesIO(data))
    return bundle


@pytest.fixture
def run_records() -> list[dict]:
    return [synthetic_record(i) for i in range(4)]


@pytest.fixture
def exported(tmp_path, run_records) -> Path:
    """The bundle of a four-trial run directory."""
    return export_run_directory(write_run_directory(tmp_path / "site-a", run_records), tmp_path / "2026w48.tar.gz")


def test_a_run_directory_travels_to_a_store_and_a_results_directory(backend, tmp_path, exported, run_records):
    source = files_under(tmp_path / "site-a")
    bundle = read_bundle(exported)
    assert sorted(bundle.members) == sorted(source)  # run.json, records, MLPerf logs, the dataset manifest
    assert set(raw_members(exported)) == {"SHA256SUMS", "bundle.json", *source}

    with open_store(backend.url) as results:
        first = import_into_store(exported, results)
        assert (first.run_created, first.records_added) == (True, 4)
        assert import_into_store(exported, results).records_added == 0
        assert results.manifest("2026w48") == manifest("2026w48")
        assert results.records(["2026w48"]) == {"2026w48": run_records}

    site_b = tmp_path / "site-b"
    written = import_into_results(exported, site_b)
    marker = f"{RUN}/imported.json"  # the run folder is another site's (mlcampaign.plan.runs.IMPORTED_MARKER)
    assert sorted(path.relative_to(site_b).as_posix() for path in written) == sorted([*source, marker])
    imported = files_under(site_b)
    assert json.loads(imported.pop(marker))["bundle"] == bundle.info
    assert imported == source  # byte for byte
    assert import_into_results(exported, site_b) == []
    assert [file.record for file in read_run_directory(site_b / RUN).records] == run_records


def test_exports_are_reproducible(tmp_path, exported):
    again = export_run_directory(tmp_path / "site-a" / RUN, tmp_path / "again.tar.gz")
    assert again.read_bytes() == exported.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_stored_run_travels_with_every_record_of_a_trial(backend, tmp_path):
    failure = synthetic_record(1, failure_reason="timeout")
    failure["provenance"]["finished_utc"] = "2027-12-01T00:00:00+00:00"  # a node's clock ahead: not the order
    records = [synthetic_record(0), failure, synthetic_record(1)]
    paths = ["r0/record.json", f"r1/superseded/{content_sha256(failure)}.json", "r1/record.json"]
    with open_store(backend.url) as results:
        results.ingest(
            manifest("2026w48"), [RecordFile(path, record) for path, record in zip(paths, records, strict=True)]
        )
        bundle_path = export_store_run(results, "2026w48", tmp_path / "stored.tar.gz")
        stored = results.records(["2026w48"])

    bundle = read_bundle(bundle_path)
    superseded = member_of(failure, f"superseded/{content_sha256(failure)}.json")
    assert sorted(bundle.members) == sorted([f"{RUN}/run.json", member_of(records[0]), member_of(failure), superseded])
    current = {file.path: file.record for file in bundle.records}[f"{bundle_path}:{member_of(failure)}"]
    assert current == records[2]  # the folder's record.json is current

    with open_store(f"sqlite:///{tmp_path}/elsewhere.db") as elsewhere:
        assert import_into_store(bundle_path, elsewhere).records_added == 3
        assert elsewhere.records(["2026w48"]) == stored
    import_into_results(bundle_path, tmp_path / "results")
    run = read_run_directory(tmp_path / "results" / RUN)
    with open_store(f"sqlite:///{tmp_path}/from-directory.db") as from_directory:
        from_directory.ingest(run.manifest, run.records)
        assert from_directory.records(["2026w48"]) == stored


# Damaged bundles: refused naming the bundle and the member; nothing written.


def assert_refused(backend, bundle: Path, tmp_path: Path, error_type, message: str) -> None:
    """Importing ``bundle`` into a store and into a results directory fails with ``message``
    (a prefix), leaving both as they were."""
    with open_store(backend.url) as results:
        results.ingest(manifest("kept"), [])
        before = backend.contents()
        with pytest.raises(error_type) as refused:
            import_into_store(bundle, results)
        assert str(refused.value).startswith(message)
        assert backend.contents() == before
    target = tmp_path / "importing"
    write_json_atomic({"already": "here"}, target / "other.json")
    with pytest.raises(error_type) as refused:
        import_into_results(bundle, target)
    assert str(refused.value).startswith(message)
    assert files_under(target) == {"other.json": (target / "other.json").read_bytes()}


def test_a_bundle_with_a_wrong_checksum_is_refused(backend, tmp_path, exported, run_records):
    members = raw_members(exported)
    member = member_of(run_records[2])
    members[member] = members[member].replace(b'"status": "ok"', b'"status": "failed"')
    damaged = write_members(tmp_path / "damaged.tar.gz", members)
    assert_refused(backend, damaged, tmp_path, BundleError, f"{damaged}: member '{member}' has sha256 ")


def test_a_bundle_missing_a_member_is_refused(backend, tmp_path, exported, run_records):
    members = raw_members(exported)
    member = member_of(run_records[0], "mllog.txt")
    del members[member]
    damaged = write_members(tmp_path / "damaged.tar.gz", members)
    expected = f"{damaged}: member '{member}' is listed in SHA256SUMS but missing from the bundle"
    assert_refused(backend, damaged, tmp_path, BundleError, expected)


def test_a_member_not_in_the_checksum_list_is_refused(backend, tmp_path, exported):
    members = raw_members(exported) | {"datasets/extra/manifest.json": b"{}"}
    damaged = write_members(tmp_path / "damaged.tar.gz", members)
    expected = f"{damaged}: member 'datasets/extra/manifest.json' is not listed in SHA256SUMS"
    assert_refused(backend, damaged, tmp_path, BundleError, expected)


def test_a_bundle_cut_at_any_byte_is_refused(tmp_path, run_records):
    run_dir = write_run_directory(tmp_path / "site-a", run_records[:1])
    data = export_run_directory(run_dir, tmp_path / "small.tar.gz").read_bytes()
    names = list(raw_members(tmp_path / "small.tar.gz"))
    for length in range(len(data)):
        cut = tmp_path / f"cut-{length}.tar.gz"  # a new file each time: rewriting one is slower
        cut.write_bytes(data[:length])
        with pytest.raises(BundleError) as refused:
            read_bundle(cut)
        message = str(refused.value)
        assert message.startswith(f"{cut}: truncated or damaged "), (length, message)
        assert any(f"member '{name}'" in message for name in names) or "before its first member" in message


def test_a_truncated_bundle_leaves_the_store_unchanged(backend, tmp_path, exported):
    data = exported.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    assert_refused(backend, cut, tmp_path, BundleError, f"{cut}: truncated or damaged ")


def test_a_bundle_with_a_record_failing_the_schema_is_refused(backend, tmp_path, exported, run_records):
    members = raw_members(exported)
    member = member_of(run_records[3])
    record = json.loads(members[member])
    record["trial"]["seed"] = -1
    members[member] = json.dumps(record).encode()
    damaged = write_members(tmp_path / "damaged.tar.gz", members, checksums=True)
    expected = f"{damaged}:{member}: the record does not satisfy the record schema at 'trial.seed': -1 is less than"
    assert_refused(backend, damaged, tmp_path, RecordError, expected)


@pytest.mark.parametrize(
    ("member", "expected"),
    [
        ("../outside.json", "member '../outside.json' is not a plain relative path"),
        (f"{RUN}/notes.txt", f"member '{RUN}/notes.txt' is not part of a bundle of run '2026w48'"),
        ("epcc-2024/runs/2026w47/run.json", "member 'epcc-2024/runs/2026w47/run.json' is not part of a bundle"),
        (f"{RUN}/trials/a/b/c/trial0-rep0/superseded/x.json", "is not part of a bundle of run '2026w48'"),
    ],
)
def test_members_a_bundle_cannot_have_are_refused(tmp_path, exported, member, expected):
    damaged = write_members(tmp_path / "damaged.tar.gz", raw_members(exported) | {member: b"{}"}, checksums=True)
    with pytest.raises(BundleError) as refused:
        read_bundle(damaged)
    assert str(refused.value).startswith(f"{damaged}: ") and expected in str(refused.value)


def test_a_record_outside_its_trial_directory_is_refused(tmp_path, exported, run_records):
    members = raw_members(exported)
    trial_0, trial_1 = member_of(run_records[0]), member_of(run_records[1])
    members[trial_0], members[trial_1] = members[trial_1], members[trial_0]
    damaged = write_members(tmp_path / "damaged.tar.gz", members, checksums=True)
    with pytest.raises(BundleError, match=f"member '{trial_0}' is not in its record's trial directory"):
        read_bundle(damaged)


def test_a_bundle_of_a_newer_format_is_refused(tmp_path, exported):
    members = raw_members(exported)
    members["bundle.json"] = json.dumps(json.loads(members["bundle.json"]) | {"bundle_format": 2}).encode()
    damaged = write_members(tmp_path / "damaged.tar.gz", members, checksums=True)
    with pytest.raises(BundleError, match=r"member 'bundle\.json': bundle_format 2; this mlcampaign reads format 1"):
        read_bundle(damaged)


def test_files_that_are_not_bundles_are_refused(tmp_path):
    for name, data in [("empty.tar.gz", b""), ("plain.tar.gz", b"not gzip at all"), ("other.tar.gz", None)]:
        path = tmp_path / name
        if data is None:
            write_members(path, {"hello.txt": b"hi"})
        else:
            path.write_bytes(data)
        with pytest.raises(BundleError, match=f"^{path}: "):
            read_bundle(path)
    with pytest.raises(BundleError, match="cannot be read"):
        read_bundle(tmp_path / "missing.tar.gz")


def test_importing_into_results_never_overwrites_a_different_file(tmp_path, exported, run_records):
    target = tmp_path / "site-b"
    member = member_of(run_records[1])
    write_json_atomic({"a": "different record"}, target / member)
    before = files_under(target)
    with pytest.raises(BundleError) as refused:
        import_into_results(exported, target)
    assert str(refused.value).startswith(f"{exported}: member '{member}' differs from {target / member}")
    assert files_under(target) == before


# Exporting checks the run first.


def test_export_refuses_a_run_whose_dataset_manifest_changed(tmp_path, run_records):
    run_dir = write_run_directory(tmp_path / "site-a", run_records)
    dataset_manifest = tmp_path / "site-a" / "datasets" / "synthetic" / "manifest.json"
    write_json_atomic(json.loads(dataset_manifest.read_text()) | {"dataset_id": "1" * 16}, dataset_manifest)
    with pytest.raises(BundleError, match=f"{dataset_manifest}: dataset id '1111111111111111', but the records"):
        export_run_directory(run_dir, tmp_path / "bundle.tar.gz")
    dataset_manifest.unlink()
    with pytest.raises(BundleError, match=f"{dataset_manifest}: missing; the records of run '2026w48' name dataset"):
        export_run_directory(run_dir, tmp_path / "bundle.tar.gz")
    assert not (tmp_path / "bundle.tar.gz").exists()


def test_export_refuses_a_run_with_an_invalid_record(tmp_path, run_records):
    run_dir = write_run_directory(tmp_path / "site-a", run_records)
    record_path = run_dir / trial_directory(run_records[2]) / "record.json"
    write_json_atomic(run_records[2] | {"status": "maybe"}, record_path)
    with pytest.raises(RecordError, match=f"^{record_path}: the record does not satisfy the record schema at 'status'"):
        export_run_directory(run_dir, tmp_path / "bundle.tar.gz")
    assert not (tmp_path / "bundle.tar.gz").exists()


def test_a_directory_that_is_not_a_run_is_refused(tmp_path, run_records):
    with pytest.raises(BundleError, match="not a run directory"):
        read_run_directory(tmp_path)
    run_dir = write_run_directory(tmp_path / "site-a", run_records)
    moved = run_dir.rename(run_dir.with_name("renamed"))
    with pytest.raises(BundleError, match="run_id '2026w48' is not the directory's name"):
        read_run_directory(moved)


def test_a_bundle_can_be_checked_without_mlcampaign(exported):
    # The bundle is usable without mlcampaign: `tar xzf` and `sha256sum -c SHA256SUMS`.
    members = raw_members(exported)
    assert next(iter(members)) == "SHA256SUMS"
    for line in members["SHA256SUMS"].decode().splitlines():
        digest, name = line.split("  ", 1)
        assert hashlib.sha256(members[name]).hexdigest() == digest
    assert gzip.decompress(exported.read_bytes())  # one complete gzip stream
