"""URL passwords in messages: every form a store URL can carry one in is masked, nothing else changes."""

import passwords
import pytest

from mlcampaign.history.store import StoreError
from mlcampaign.plan.config_files import ConfigError, load_schema
from mlcampaign.plan.urls import DEFAULT_STORE_URL, MASK, URLError, mask_passwords, parse_store_url, shown_url


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


# Every form of a password in a store URL: found as the driver finds it (make_url), never shown, always refused.


@pytest.mark.parametrize("url", passwords.FORMS)
def test_a_password_in_any_form_is_shown_masked_and_refused(url):
    shown = shown_url(url)
    assert MASK in shown and not passwords.shown_anywhere([shown]), shown
    with pytest.raises(URLError) as refused:
        parse_store_url(url)
    assert not passwords.shown_anywhere([str(refused.value)]), str(refused.value)
    assert "db.example.org" in str(refused.value) or "results/history.db" in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///results/history.db",
        "sqlite:////srv/a b/history.db",
        "postgresql://mlcampaign@db.example.org:5432/history?sslmode=require",
        "postgresql+psycopg://db/history",
    ],
)
def test_a_url_without_a_secret_is_shown_as_given(url):
    assert shown_url(url) == url
