"""Schema migrations of the results store, applied in order when a store is opened.

Each migration is a module ``v<NNN>_<what>.py`` with ``VERSION`` (its place in MIGRATIONS, from 1),
``DESCRIPTION`` and ``upgrade(connection)``, which runs inside the store's migration transaction:
SQLite and PostgreSQL both have transactional DDL, so a migration that fails leaves the store at its
previous version. A released migration never changes; a new schema is a new module appended here,
and the store's queries (mlcampaign.history.store) follow the newest one.
"""

from mlcampaign.history.store.migrations import (
    v001_initial,
    v002_superseded_manifests,
    v003_published_results,
    v004_superseded_published_runs,
)

MIGRATIONS = (v001_initial, v002_superseded_manifests, v003_published_results, v004_superseded_published_runs)
