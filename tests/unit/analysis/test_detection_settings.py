"""The detectors' verdicts and reasons (mlcampaign.analysis.detection.settings), documented."""

from mlcampaign.analysis import detection, regression
from mlcampaign.cli import EXIT_CANNOT_TELL, EXIT_FAILED_TRIALS, EXIT_REGRESSION

from conftest import REPO


def test_every_verdict_reason_and_exit_status_is_documented():
    documented = (REPO / "docs" / "regression.md").read_text()
    for name in [*detection.VERDICTS, *detection.REASONS, *regression.VERDICTS]:
        assert f"`{name}`" in documented, name
    for status in (EXIT_REGRESSION, EXIT_FAILED_TRIALS, EXIT_CANNOT_TELL):
        assert f" {status} " in documented.split("**Exit status of `mlcampaign summary`**")[1].split("\n\n")[0]
