#!/usr/bin/env bash
# The tests that touch DVC's internals, on the lowest DVC pyproject.toml
# allows, in a clean venv outside the repository (removed on exit). DVC
# before 3.66 fails with pathspec 1.x and does not cap it itself.
set -euo pipefail
cd "$(dirname "$0")/.."
lowest=$(mktemp -d)
trap 'rm -rf "$lowest"' EXIT
python3 -m venv "$lowest/venv"
"$lowest/venv/bin/python" -m pip install -q "dvc==3.54.*" "pathspec<1" -e ".[example]" "pytest>=7"
# PATH first: every `dvc` and stage `python` is the venv's
PATH="$lowest/venv/bin:$PATH" "$lowest/venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/e2e/test_dvc_recorder.py tests/e2e/test_example.py tests/e2e/test_cli.py \
    tests/e2e/test_remote_push.py tests/e2e/test_load.py
