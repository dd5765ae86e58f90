#!/usr/bin/env bash
# The prepared GPU check (bench/gpu_check/gpu_check.py), as one command on the device machine:
#   bash bench/gpu_check/run.sh [--wheels DIR] OUTDIR [gpu_check.py options, e.g. --dry-run, --skip 'deepcam:*']
# --wheels DIR installs the carried wheels of DIR (bench/gpu_check/fetch_wheels.sh) into a private
# folder first, as the device README's recipe does: that machine's image lacks them and cannot download.
# PYTHON names the interpreter (default python3, the one that holds torch on the device image).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
if [[ ${1:-} == --wheels ]]; then
  wheels=${2:?--wheels needs a folder of .whl files}
  shift 2
  shopt -s nullglob
  files=("$wheels"/*.whl)
  if (( ${#files[@]} == 0 )); then
    echo "run.sh: no .whl files in $wheels (fetch them with bench/gpu_check/fetch_wheels.sh)" >&2
    exit 2
  fi
  site=${GPU_CHECK_SITE:-/tmp/gpu-check-site}
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${files[@]}"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
out=${1:?usage: bash bench/gpu_check/run.sh [--wheels DIR] OUTDIR [gpu_check.py options]}
shift
PYTHONUNBUFFERED=1 exec "$python" "$here/gpu_check.py" --out "$out" "$@"
