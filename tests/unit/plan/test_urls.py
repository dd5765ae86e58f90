"""URL passwords in messages: every form a store URL can carry one in is masked, nothing else changes."""

import pytest

from mlcampaign.history.store import StoreError
from mlcampaign.plan.config_files import ConfigError
from mlcampaign.plan.urls import mask_passwords


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://user:hunter2@host:notaport/db", "postgresql://user:***@host:notaport/db"),
        ("'postgresql+psycopg://u:p@ss@db:5432/h'", "'postgresql+psycopg://u:***@db:5432/h'"),
        ("sqlite://someone:hunter2@/results/history.db", "sqlite://someone:***@/results/history.db"),
        ("postgresql://:hunter2@db/h", "postgresql://:***@db/h"),
        ("postgresql://me@db/h?sslmode=require&password=hunter2", "postgresql://me@db/h?sslmode=require&password=***"),
        ("value 'a://x:y@h': 'a://x:y@h' does not match", "value 'a://x:***@h': 'a://x:***@h' does not match"),
        # Without a password: unchanged (a schema pattern that looks like a URL included).
        ("postgresql://mlcampaign@db.example.org:5432/history", "postgresql://mlcampaign@db.example.org:5432/history"),
        ("'^(sqlite:///.+|postgresql://([^:@/]+@)?[^@]+)$'", "'^(sqlite:///.+|postgresql://([^:@/]+@)?[^@]+)$'"),
        ("sqlite:///results/history.db", "sqlite:///results/history.db"),
    ],
)
def test_mask_passwords(text, expected):
    assert mask_passwords(text) == expected


@pytest.mark.parametrize("error_type", [ConfigError, StoreError])
def test_the_errors_that_name_store_urls_mask_them(error_type):
    assert str(error_type("store postgresql://u:hunter2@db/h refused")) == "store postgresql://u:***@db/h refused"
