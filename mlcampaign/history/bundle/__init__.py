"""Run bundles: one file that carries a run's results from one site (or store) to another.

    from mlcampaign.history import bundle

    bundle.export_run_directory(Path("results/epcc-2024/runs/2026w48"), Path("2026w48.tar.gz"))
    bundle.export_store_run(store, "2026w48", Path("2026w48.tar.gz"))
    bundle.import_into_store(Path("2026w48.tar.gz"), store)          # -> store.IngestResult
    bundle.import_into_results(Path("2026w48.tar.gz"), Path("results"))   # -> [paths written]
    bundle.read_bundle(Path("2026w48.tar.gz"))                       # -> Bundle, every checksum verified
    bundle.read_run_directory(Path("results/epcc-2024/runs/2026w48"))    # -> RunDirectory (for ingest)
    bundle.ingest_run_directory(Path("results/epcc-2024/runs/2026w48"), store)  # -> store.IngestResult

A bundle is a gzip-compressed tar archive whose members mirror the results directory:

    SHA256SUMS                                  sha256 of every other member (`sha256sum -c` format)
    bundle.json                                 {"bundle_format": 1, "run_id", "campaign", "site", "exported_from"}
    <campaign>/runs/<run_id>/run.json           the run manifest
    <campaign>/runs/<run_id>/trials/<system>/<benchmark>/<cell>/trial<k>-rep<r>/
        record.json                             the trial's current record (its latest)
        superseded/<content sha256>.json        its earlier records (a store keeps them; see below)
        mllog.txt                               its MLPerf log (run-directory exports: a store keeps no logs)
    datasets/<name>/manifest.json               the manifest of each dataset the records name (run directories)

Reading a bundle streams it once, checking as it goes, before anything is used: SHA256SUMS and
bundle.json first (what SHA256SUMS lists bounds the rest: at most MAX_MEMBERS members, each a member of the
run bundle.json names, before any other member is read), then each member's path (listed, once), type
(regular files only), size (limits: MAX_MEMBER_BYTES, and MAX_BUNDLE_BYTES in all) and sha256 while it is
read; then nothing missing, the gzip stream ending with the archive (a file cut at any byte, or with content
after the archive's end, is refused), the run (names, finite numbers, a start; mlcampaign.history.store), the
records (record schema, run, campaign, a system of the run's site, each in its own trial's directory) and the
dataset manifests (each named by the records, with the id they name). Every error is a BundleError (or the
store's ManifestError / RecordError) naming the bundle and the member; nothing is written then. Memory holds
the JSON members only: an import into a results directory unpacks into a temporary folder there, moved into
place once all is verified and checked against the run folders there (``importing``).

A run folder is read without following links: its files must be regular files inside it (a link is
refused, naming it), so that nothing from elsewhere travels in a bundle. Writing a bundle goes through a
temporary file, so a bundle path never holds half a bundle.

The package, one module per concern: ``layout`` (member names and places, BundleError), ``limits`` (what a
bundle may hold), ``members`` (the checks of each member and of what they hold), ``run_directory`` (reading a
run folder, and its ingest), ``export`` (writing a bundle), ``reading`` (reading one) and ``importing`` (into a
store or a results folder).
"""

from __future__ import annotations

from mlcampaign.history.bundle.export import export_run_directory, export_store_run
from mlcampaign.history.bundle.importing import import_into_results, import_into_store
from mlcampaign.history.bundle.layout import BundleError, run_prefix, trial_directory
from mlcampaign.history.bundle.reading import Bundle, read_bundle
from mlcampaign.history.bundle.run_directory import RunDirectory, ingest_run_directory, read_run_directory

__all__ = [
    "Bundle",
    "BundleError",
    "RunDirectory",
    "export_run_directory",
    "export_store_run",
    "import_into_results",
    "import_into_store",
    "ingest_run_directory",
    "read_bundle",
    "read_run_directory",
    "run_prefix",
    "trial_directory",
]
