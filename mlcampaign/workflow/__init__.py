"""The workflow layer: what the Snakemake rules (rules/*.smk) and their scripts (scripts/*.py) run, so that
the rules only declare jobs and the scripts only pass their inputs on.

- ``planning``: one invocation's plan (campaign, site, run, its trials and datasets), built once by
  rules/common.smk, with every check that refuses a campaign before any job;
- ``readiness``: planning's warning about the cells that cannot yet detect the target change;
- ``scopes``: the records an aggregation scope reads (every planned trial's, or those that exist);
- ``packing``: what a packed allocation (a Snakemake job group) that failed keeps, for the executor plugins.

It sits on top of the history layer, whose results store and run summaries planning reads.
"""
