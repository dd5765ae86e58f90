#!/usr/bin/env bash
# Sets up whatever is missing (a Python >= 3.11 virtual environment in .venv with the pinned
# requirements), then runs either the campaign or the test suite:
#
#   ./run.sh campaign [snakemake options]   # default: snakemake --profile profiles/local
#   ./run.sh test [pytest options]
set -euo pipefail
cd "$(dirname "$0")"

venv="${MLCAMPAIGN_VENV:-.venv}"

find_python() {
    for candidate in python3.11 python3.12 python3.13 python3; do
        if command -v "$candidate" >/dev/null &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            echo "$candidate"
            return
        fi
    done
    echo "run.sh: needs Python >= 3.11 (with venv); none found on PATH" >&2
    exit 1
}

setup() {
    if [[ ! -x "$venv/bin/python" ]]; then
        "$(find_python)" -m venv "$venv"
    fi
    # Reinstall only when the pinned requirements change. The project's executor plugin for the
    # EIDF GPU service is installed editable: Snakemake finds executor plugins as modules named
    # snakemake_executor_plugin_* on sys.path, and its src/ folder is put there.
    local stamp plugin=snakemake-executor-plugin-eidf
    stamp=$(cat requirements.txt requirements-dev.txt "$plugin/pyproject.toml" | sha256sum | cut -d' ' -f1)
    if [[ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$stamp" ]]; then
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -e "./$plugin"
        echo "$stamp" >"$venv/.requirements.sha256"
    fi
    export PATH="$PWD/$venv/bin:$PATH"
}

command="${1:-}"
shift || true
case "$command" in
campaign)
    setup
    exec snakemake --profile profiles/local "$@"
    ;;
test)
    setup
    exec pytest "$@"
    ;;
*)
    echo "usage: ./run.sh campaign [snakemake options] | ./run.sh test [pytest options]" >&2
    exit 2
    ;;
esac
