"""The results store's refusals: each message names the store (its URL, never with a password), the run, file
or key it concerns."""

from __future__ import annotations

from mlcampaign.plan.urls import mask_passwords


class StoreError(RuntimeError):
    """The results store refused an operation; the message says which store, run, file or key."""

    def __init__(self, message: str) -> None:
        # Messages name the store by its URL, as given (a URL with a password is refused, and named).
        super().__init__(mask_passwords(message))


class StoreURLError(StoreError):
    """A store URL is malformed, of an unsupported kind, or embeds a password (mlcampaign.plan.urls.URLError,
    raised again by open_store)."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached or opened (no server, wrong port, missing directory, no store)."""


class SchemaVersionError(StoreError):
    """The store's schema is newer than this code knows; the store is left untouched."""


class ManifestError(StoreError):
    """A run manifest lacks what the store needs to file the run (run id, campaign, site, start time)."""


class RunConflictError(StoreError):
    """A run id is already stored with a different manifest."""


class RecordError(StoreError):
    """A record fails the record schema or belongs to another run."""


class UnknownRunError(StoreError):
    """A run id asked for is not in the store."""


class SupersedeError(StoreError):
    """An ingest would replace a stored run's manifest, or give trials the store has records of a new
    record, and was not asked to (an import without ``--supersede``)."""


class DamagedStoreError(StoreError):
    """A row of the store is not what was ingested (a truncated or edited record or manifest)."""


class PublishedRunConflictError(StoreError):
    """A published run (round, submitter, system) is already stored with other content."""
