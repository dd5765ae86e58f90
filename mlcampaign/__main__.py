"""``python -m mlcampaign``: the command line of the project's results (mlcampaign.cli)."""

import sys

from mlcampaign.cli import main

sys.exit(main())
