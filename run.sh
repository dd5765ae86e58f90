#!/usr/bin/env bash
# Sets up whatever is missing (a Python >= 3.11 virtual environment in .venv with the pinned
# requirements), then runs either the campaign or the test suite:
#
#   ./run.sh campaign [snakemake options]   # default: snakemake --profile profiles/local
#   ./run.sh test [pytest options]
#
# `test` also installs what the tests run for real, where it is missing: Debian's PostgreSQL server
# (the results store), chromium and chromedriver (the dashboard's browser test), a C++ toolchain and
# CMake, with which envs/horovod/build.py builds Horovod into the environment (cached; set
# MLCAMPAIGN_HOROVOD=none to skip it, =system to use an installed one). The single-node Slurm is
# started by its tests (../shared/tools/slurm-localhost). System packages need root; without it the
# tests that need them say so and are skipped.
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
    local stamp eidf=snakemake-executor-plugin-eidf slurm_sites=snakemake-executor-plugin-slurm-sites
    stamp=$(cat requirements.txt requirements-dev.txt requirements-nodeps.txt pyproject.toml "$eidf/pyproject.toml" \
        "$slurm_sites/pyproject.toml" | sha256sum | cut -d' ' -f1)
    if [[ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$stamp" ]]; then
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt \
            -e . -e "./$eidf" -e "./$slurm_sites"
        # Packages whose declared pins conflict with the project's (the file says why): without their deps.
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-nodeps.txt
        echo "$stamp" >"$venv/.requirements.sha256"
    fi
    export PATH="$PWD/$venv/bin:$PATH"
}

test_packages=(postgresql chromium chromium-driver g++ cmake patch)

system_packages() {
    local missing=() package
    for package in "${test_packages[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "run.sh: not installed: ${missing[*]} (apt-get install as root); the tests that need them are skipped" >&2
        return 0
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

horovod() {
    case "${MLCAMPAIGN_HOROVOD:-build}" in
    none | system) ;;
    *)
        # As root (CI) a failed build stops here; a user without a compiler gets the Horovod tests skipped.
        "$venv/bin/python" envs/horovod/build.py --python "$venv/bin/python" || [[ $(id -u) -ne 0 ]] ||
            exit 1
        ;;
    esac
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
    system_packages
    horovod
    exec pytest "$@"
    ;;
*)
    echo "usage: ./run.sh campaign [snakemake options] | ./run.sh test [pytest options]" >&2
    exit 2
    ;;
esac
