"""The record schema at ingest speed: compiled only where both validators read it alike."""

from mlcampaign.plan.config_files import load_schema
from mlcampaign.records.schema import uses_shared_keywords


def test_the_record_schema_is_checked_at_compiled_speed_only_where_both_validators_agree():
    assert uses_shared_keywords(load_schema("record"))
    assert uses_shared_keywords({"type": "object", "x-registry": "models", "properties": {"prefixItems": {}}})
    assert not uses_shared_keywords({"type": "array", "prefixItems": [{"type": "string"}]})
    assert not uses_shared_keywords({"properties": {"a": {"oneOf": [{"unevaluatedProperties": False}]}}})
