"""URL passwords in messages: every form a store URL can carry one in is masked, nothing else changes."""

import pytest

from mlcampaign.history.store import StoreError
from mlcampaign.plan.config_files import ConfigError, load_schema
from mlcampaign.plan.urls import DEFAULT_STORE_URL, URLError, mask_passwords, parse_store_url


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


@pytest.mark.parametrize("error_type", [ConfigError, StoreError, URLError])
def test_the_errors_that_name_store_urls_mask_them(error_type):
    assert str(error_type("store postgresql://u:hunter2@db/h refused")) == "store postgresql://u:***@db/h refused"


def test_parsing_refuses_a_store_url_with_a_password_at_the_plan_level_without_showing_it():
    # open_store raises it again as a StoreURLError (tests/unit/history/test_store.py: every refusal).
    with pytest.raises(URLError, match=r"^store URL 'postgresql://me:\*\*\*@host/db' embeds a password"):
        parse_store_url("postgresql://me:hunter2@host/db")


def test_the_default_store_is_declared_once():
    assert parse_store_url(DEFAULT_STORE_URL).database == "results/history.db"
    store = load_schema("campaign")["properties"]["history"]["properties"]["store"]
    assert store["default"] == DEFAULT_STORE_URL
