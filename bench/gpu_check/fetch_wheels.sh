#!/usr/bin/env bash
# Download the wheels of bench/gpu_check/wheels.txt for the device machine's image (CPython 3.12,
# x86-64 manylinux) into DIR (default .whl at the repository root, which must be git-ignored:
# `echo /.whl/ >> .git/info/exclude`). --no-deps: wheels.txt names every package the image lacks.
#   bash bench/gpu_check/fetch_wheels.sh [DIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$repo/.whl}
mapfile -t packages < <(grep -v -e '^#' -e '^$' "$repo/bench/gpu_check/wheels.txt")
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" "${packages[@]}"
ls -l "$dest"
