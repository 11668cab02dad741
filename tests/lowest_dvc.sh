#!/usr/bin/env bash
# The tests that touch DVC's internals, on the lowest DVC pyproject.toml
# allows. The venv with that DVC and every other dependency is built once per
# machine and kept in ~/.cache/dvc-dali/lowest-dvc (tests/helpers/cached_venv.py:
# rebuilt when pyproject.toml's dependencies change); this tree is installed
# into it on every run, without dependencies. DVC_DALI_TEST_WORKERS workers
# (default 3: five modules; tests/ci.sh runs it with 2, beside the suite), a
# file each, as in tests/ci.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(python3 -m tests.helpers.cached_venv lowest-dvc)
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
# PATH first: every `dvc` and stage `python` is the venv's
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    -n "${DVC_DALI_TEST_WORKERS:-3}" --dist loadfile \
    tests/e2e/test_dvc_recorder.py tests/e2e/test_example.py tests/e2e/test_cli.py \
    tests/e2e/test_remote_push.py tests/e2e/test_load.py
