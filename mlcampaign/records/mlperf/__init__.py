"""MLPerf at the records layer, all through mlperf-logging: the logs the trials write and the result logs
and folders mlperf-logging reads.

- ``trial_log``: a trial's own MLPerf log (header, hyperparameters under the rules' keys, events) and its
  compliance check;
- ``result_logs``: a result log as mlperf-logging reads it (lines, compliance, time to train, RCP reading),
  and what the project keeps of one;
- ``system_descriptions``: a submitter's systems JSON, checked as package_checker checks it;
- ``scores``: the summarizer's scores of a folder of logs (olympic average, strong and weak scaling, RCP);
- ``submission``: a campaign run exported as a submission folder (``mlcampaign export-mlperf``).

What is one benchmark's own (its closed-division keys, how a submission's schedule is reproduced) is in its
folder's ``mlperf.py``, named by its registry entry (``mlcampaign.plan.registry.MLPerfRules``). Importing a
published round is mlcampaign.history.published_rounds; the tables beside a campaign's cells,
mlcampaign.analysis.mlperf_results; a campaign reproducing a submission, mlcampaign.plan.reproduce.
"""
