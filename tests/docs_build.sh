#!/usr/bin/env bash
# The documentation site (mkdocs.yml, docs/, the docstrings), built as CI
# builds it: the docs extra's packages installed (only they: the package is
# read from this tree), then `mkdocs build --strict` into a temporary
# directory (no site/ in the tree; not -q, which hides the warnings that
# --strict counts). A broken link or anchor, a page missing from the nav, a
# docstring that does not render or a `dvc-dali` subcommand the CLI page
# lacks fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
mapfile -t docs_extra < <(python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"], sep="\n")')
python3 -m pip install -q "${docs_extra[@]}" && NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict -d "$site"
