"""Aggregation of a campaign's trial records into tables (rules/analysis.smk).

frame (the planned trials joined with their records), stats (statistics and intervals),
valid_flops (HPC AI500 Valid FLOPS, also a command line), capability, repeatability, ranking,
scaling, tables (all of them, CSV + Parquet + HTML views); synthetic makes schema-valid records
for tests and bench/aggregate_100k.py.
"""
