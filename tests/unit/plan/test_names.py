"""Names (mlcampaign.plan.names): one rule for campaigns, runs, sites, systems, benchmarks and cells, wherever
they are read; look-alikes, markup, path parts, control characters and names too long for a file name refused."""

import unicodedata

import pytest

from mlcampaign.plan.config_files import ConfigError, validator
from mlcampaign.plan.names import MAX_NAME_LENGTH, InvalidNameError, check_name, name_problem
from mlcampaign.plan.runs import invocation_site

NOT_NAMES = [
    unicodedata.normalize("NFC", "café"),
    unicodedata.normalize("NFD", "café"),
    "\u0430rcher2",  # a Cyrillic a first
    "<b>site</b>",
    "a/b",
    "..",
    ".hidden",
    "-rf",
    "tab\there",
    "line\n",
    "nul\x00",
    "spa ce",
    "",
    "x" * (MAX_NAME_LENGTH + 1),
    None,
    7,
]


@pytest.mark.parametrize("value", NOT_NAMES)
def test_what_is_not_a_name_is_refused_naming_where_and_why(value):
    with pytest.raises(InvalidNameError) as refused:
        check_name(value, "run.json: key 'site'")
    message = str(refused.value)
    assert message.startswith("run.json: key 'site': value ") and "is not a name: " in message
    assert len(message) < 400  # a long value is cut


@pytest.mark.parametrize("value", ["archer2", "local-cpu", "2026w48", "1x4-bf16-grad_fp16", "a.b_c-d", "x" * 100])
def test_names_pass_unchanged(value):
    assert check_name(value, "here") == value


def test_look_alikes_cannot_both_be_names():
    composed, decomposed = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    assert composed != decomposed and name_problem(composed) and name_problem(decomposed)
    assert "U+00E9" in name_problem(composed) and "U+0301" in name_problem(decomposed)


def test_every_path_component_made_of_names_fits_a_file_name():
    """The longest: a dashboard trend page, trends-<system>--<benchmark>.html (NAME_MAX is 255 bytes)."""
    longest = "x" * MAX_NAME_LENGTH
    assert len(f"trends-{longest}--{longest}.html".encode()) <= 255


@pytest.mark.parametrize(
    ("schema", "path"),
    [("campaign", ["campaign"]), ("campaign", ["site"]), ("campaign", ["run"]), ("system", ["site"])],
)
def test_the_schemas_hold_names_to_the_same_rule(schema, path):
    document = {path[0]: "x" * (MAX_NAME_LENGTH + 1)}
    errors = [error for error in validator(schema).iter_errors(document) if list(error.absolute_path) == path]
    assert errors and "is too long" in errors[0].message


def test_the_profile_s_site_is_a_name():
    assert invocation_site({}, ["site=archer2"]) == "archer2"
    with pytest.raises(ConfigError, match=r"the profile's default-resources: site: value '\.\./up' is not a name"):
        invocation_site({}, ["site=../up"])
