#!/usr/bin/env bash
# The test command (README "Set up and run the tests"; .ci/run calls it): on a
# fresh machine, install (g++ for DALI's TF plugin, the package with its test
# and tf extras, the plugin), lint, build the docs site (tests/docs_build.sh),
# the whole suite, then the tests that touch DVC's internals on the lowest DVC
# allowed (tests/lowest_dvc.sh). The suite
# runs in pytest-xdist workers, a test file per worker at a time (module
# fixtures share one project); the tests marked `serial` (they cannot share
# the machine) run after them, alone. It prints each step's time and the 30
# slowest tests; its status is that of the first step that fails.
# DVC_DALI_TEST_WORKERS: the number of workers (default 4: on 2 cores the
# end-to-end tests mostly wait on their `dvc` and stage processes).
set -euo pipefail
cd "$(dirname "$0")/.."
workers=${DVC_DALI_TEST_WORKERS:-4}
reports=$(mktemp -d)
timings=()
# the time of each step that ran, also when one failed
trap 'printf "%s\n" "== time per step" "${timings[@]}" "total $SECONDS s"; rm -rf "$reports"' EXIT
step() {  # step NAME COMMAND...: runs it, and records how long it took
    local name=$1 start=$SECONDS
    shift
    echo "== $name"
    "$@"
    timings+=("$(printf '%-28s %5d s' "$name" $((SECONDS - start)))")
}
install() {
    { command -v g++ >/dev/null || { apt-get update -q && apt-get install -yq g++; }; }
    python3 -m pip install -q -e ".[test,tf]"
    python3 -m pip install -q --no-build-isolation "nvidia-dali-tf-plugin-cuda120==$(python3 -c \
        'from importlib.metadata import version; print(version("nvidia-dali-cuda120"))')"
}
suite() {  # both parts run, and the slowest tests are printed, whichever fails
    local rc=0
    python3 -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile -m "not serial" \
        --junitxml="$reports/parallel.xml" "$@" || rc=$?
    # exit 5: no test of the selection is marked serial
    python3 -m pytest -q -p no:cacheprovider -m serial --junitxml="$reports/serial.xml" "$@" \
        || { local serial=$?; [ $serial -eq 5 ] || rc=$serial; }
    python3 -m tests.helpers.slowest 30 "$reports"/*.xml || true
    return $rc
}
step install install
step lint python3 -m ruff check .
step docs bash tests/docs_build.sh
step "suite ($workers workers)" suite "$@"
step "lowest DVC" bash tests/lowest_dvc.sh
