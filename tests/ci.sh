#!/usr/bin/env bash
# The test command (README "Set up and run the tests"; .ci/run calls it): on a
# fresh machine, install (g++ for DALI's TF plugin, the package with its test
# and tf extras, the plugin), lint, build the docs site (tests/docs_build.sh),
# then the whole suite, and beside it, at the same time, the tests that touch
# DVC's internals on the lowest DVC allowed (tests/lowest_dvc.sh: another
# interpreter, so another pytest run; the two fill each other's idle ends).
# The suite runs in pytest-xdist workers, a test file per worker at a time
# (module fixtures share one project); the tests marked `serial` (they cannot
# share the machine) run after both, alone. It prints each step's time (the
# lowest DVC's own, beside the suite's) and the 30 slowest tests; its status
# is that of the first step that fails.
# DVC_DALI_TEST_WORKERS: the number of workers (default 4: on 2 cores the
# end-to-end tests mostly wait on their `dvc` and stage processes); the
# lowest DVC gets 2 beside them (DVC_DALI_LOWEST_WORKERS).
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
lowest_dvc() {  # in the background: its output and status kept for after the suite
    local start=$SECONDS rc=0
    DVC_DALI_TEST_WORKERS=${DVC_DALI_LOWEST_WORKERS:-2} bash tests/lowest_dvc.sh \
        >"$reports/lowest.log" 2>&1 || rc=$?
    echo "$rc $((SECONDS - start))" >"$reports/lowest.status"
}
suite() {  # every part runs, and the slowest tests are printed, whichever fails
    local rc=0 start=$SECONDS lowest status seconds serial_files=()
    lowest_dvc &
    lowest=$!
    python3 -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile -m "not serial" \
        --junitxml="$reports/parallel.xml" "$@" || rc=$?
    local parallel=$((SECONDS - start))
    wait "$lowest" || true
    read -r status seconds <"$reports/lowest.status" || { status=1 seconds=0; }
    echo "== lowest DVC (beside the suite)"
    cat "$reports/lowest.log"
    timings+=("$(printf '%-28s %5d s' "  lowest DVC, beside it" "$seconds")")
    [ "$status" -eq 0 ] || rc=$status
    # The serial tests, alone. Without arguments, collected only from the
    # files that mark some (collecting the whole suite again takes longer
    # than they do); exit 5: none of the selection is marked serial.
    if [ $# -gt 0 ]; then
        serial_files=("$@")
    else
        mapfile -t serial_files < <(grep -rl --include='test_*.py' 'mark.serial' tests || true)
    fi
    if [ ${#serial_files[@]} -gt 0 ]; then  # the suite's line then adds both parts
        local serial_start=$SECONDS
        python3 -m pytest -q -p no:cacheprovider -m serial --junitxml="$reports/serial.xml" \
            "${serial_files[@]}" || { local code=$?; [ $code -eq 5 ] || rc=$code; }
        timings+=("$(printf '%-28s %5d s' "  its parallel part" "$parallel")"
                  "$(printf '%-28s %5d s' "  its serial part" $((SECONDS - serial_start)))")
    fi
    python3 -m tests.helpers.slowest 30 "$reports"/*.xml || true
    return $rc
}
step install install
step lint python3 -m ruff check .
step docs bash tests/docs_build.sh
step "suite ($workers workers)" suite "$@"
