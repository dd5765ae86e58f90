"""mlcampaign: the logic of the ML benchmark campaign workflow, one folder per stage of its data path.

Layers, bottom first; a layer imports only layers beneath it (tests/repository/test_layers.py):

- ``measure``: instruments that read the machine (host CPU, software stack, energy, contention, roofline)
  and the FLOP counter of a model;
- ``plan``: config files and schemas, registries (benchmarks, precisions, metrics, failure reasons),
  campaigns and their trial matrix, runs, seeds, batch and learning-rate maths, launcher capabilities,
  results store URLs, campaign files that reproduce published submissions;
- ``data``: staged datasets (manifests, staging, TFRecord codec, what the formats share, staging cost);
- ``records``: trial records (files, the schema at ingest speed, building, provenance), run manifests, and
  in ``mlperf/`` MLPerf logs (the project's, result logs and systems descriptions as mlperf-logging reads
  them, scores, submission folders);
- ``job``: a trial's job (launch commands, deadlines, Slurm accounting, the supervisor, rule logs);
- ``trial``: the framework-neutral trial protocol, distributed set-up, and the torch and Keras runtimes
  (``python -m mlcampaign.trial`` is the per-rank entry point);
- ``benchmarks``: one folder per benchmark (models, readers, generators, MLPerf keys and reproduction, FLOP
  cross-checks);
- ``analysis``: frames, statistics, Valid FLOPS, ranking, scaling, repeatability, capability, plots, report;
- ``history``: the results store, bundles, published MLPerf HPC rounds, merged runs, trends and change
  detection, summary, dashboard;
- ``workflow``: what the Snakemake rules and their scripts run: one invocation's plan (campaign, site, run,
  trials), planning's readiness warnings, the records of an aggregation scope;
- ``cli``: the one command line, ``mlcampaign``.

A lower layer reaches an upper one only by name through a registry (a benchmark's implementations, a
trial's framework, a store's backends, a power source). The package carries its own data (schemas,
captions, dashboard templates), so an installed copy works as a checkout does; rule scripts and compute
nodes may also import it from the workflow's checkout without an install.
"""

__version__ = "0.1.0"
