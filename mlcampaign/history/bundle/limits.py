"""What a bundle may hold (docs/history.md): what reading one costs is bounded by these, whatever the file
says. Exports keep to the same limits, so that every bundle written can be read.
"""

from mlcampaign.plan.runs import MAX_RUN_FILE_BYTES

# A member is at most MAX_MEMBER_BYTES (an MLPerf log of a long training is a few MB; a run's manifest with
# 10 000 planned trials, about 10 MB); the archive, decompressed, at most MAX_BUNDLE_BYTES (with its tar
# headers); tar headers between two members (long names) at most MAX_HEADER_BYTES; members at most
# MAX_MEMBERS (a 30 000-trial run, with its logs and earlier records).
MAX_MEMBER_BYTES = MAX_RUN_FILE_BYTES  # every file of a run travels as a member: planning reads them within it too
MAX_BUNDLE_BYTES = 2**30
MAX_HEADER_BYTES = 2**20
MAX_MEMBERS = 100_000
