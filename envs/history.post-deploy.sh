#!/usr/bin/env bash
# Snakemake runs this in envs/history.yaml's environment once it is created (--use-conda): the packages of
# requirements-nodeps.txt, without their declared dependencies, whose pins conflict with the environment's
# (the file says why). A copy of the script runs, not this file: the pins are written here, and
# tests/repository/test_envs.py checks them against requirements-nodeps.txt.
set -euo pipefail
python -m pip install --no-deps apache-otava==0.8.0
