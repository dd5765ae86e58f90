"""The kinds of results store, one module each (mlcampaign.history.store.backend)."""
