"""The records an aggregation scope reads: every planned trial's (analysis), or those that exist (partial),
where an unreadable record is its trial's failure, saying so, and a trial without one is not run."""

import json

import numpy as np
import pandas as pd
import pytest
import synthetic_records as synthetic

from mlcampaign.records.files import RecordError
from mlcampaign.workflow.scopes import existing_records, records_state, scope_records


@pytest.fixture
def planned(tmp_path):
    """Three planned trials: one with a record, one with a damaged record, one without."""
    rows = [synthetic.plan_row("sys", "bench", "1x1", "fp32", trial) for trial in range(3)]
    directories = [str(tmp_path / f"trial{row['trial']}") for row in rows]
    rng = np.random.default_rng(3)
    (tmp_path / "trial0").mkdir()
    (tmp_path / "trial0" / "record.json").write_text(json.dumps(synthetic.record(rows[0], rng)))
    (tmp_path / "trial1").mkdir()
    (tmp_path / "trial1" / "record.json").write_text("{")
    return pd.DataFrame(rows), directories


def test_the_partial_scope_reads_the_records_that_exist_and_names_the_unreadable(planned):
    plan, directories = planned
    paths = [f"{directory}/record.json" for directory in directories]
    said = []
    scope = scope_records(plan, directories, [], existing_records(paths), said.append)
    assert [record["trial"]["trial"] for record in scope.records] == [0]
    assert len(said) == 1 and said[0].startswith(f"skipped: {paths[1]}: not valid JSON")
    (outcome,) = scope.known_outcomes.to_dict(orient="records")
    assert outcome["trial"] == 1 and outcome["failure_reason"] == "error"
    assert outcome["failure_message"].startswith(f"unreadable record: {paths[1]}")
    assert records_state(paths) != records_state(paths[:1]) and len(records_state(paths)) == 16


def test_the_analysis_scope_reads_every_planned_record_and_stops_at_an_unreadable_one(planned):
    plan, directories = planned
    scope = scope_records(plan, directories, [f"{directories[0]}/record.json"], [], print)
    assert len(scope.records) == 1 and scope.known_outcomes is None
    with pytest.raises(RecordError, match="not valid JSON"):
        scope_records(plan, directories, [f"{directory}/record.json" for directory in directories[:2]], [], print)
