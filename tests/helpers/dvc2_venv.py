"""DVC 2.58 in a virtual environment of its own, built once and cached
(tests/helpers/cached_venv.py).

Shared by tests/e2e/test_dvc2_compat.py (the `dvc2` fixture) and bench/ (the
side-by-side DVC 2 timings). The pins are tests/dvc2-requirements.txt, in
the repository (without them pip resolves libraries DVC 2.58 cannot import).
The environment is kept in $DVC_DALI_DVC2_VENV, default
~/.cache/dvc-dali/dvc2-venv, and rebuilt when the pins or the Python
version change. Where pip cannot reach a package index, or it has no build
of a pinned package for this Python, DVC 2 is unavailable (the tests skip,
saying so); any other failure of the build is an error.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers import REPO, cached_venv
from tests.helpers.cached_venv import VenvInstallError as Dvc2InstallError
from tests.helpers.cached_venv import VenvUnavailable as Dvc2Unavailable

__all__ = ["REPO", "Dvc2InstallError", "Dvc2Unavailable", "ensure_dvc2", "python"]

DVC2_REQUIREMENTS = REPO / "tests" / "dvc2-requirements.txt"
VENV = cached_venv.location("dvc2-venv", "DVC_DALI_DVC2_VENV")


def python() -> Path:
    """The environment's interpreter (it has DVC 2.58's `dvc.api`)."""
    return cached_venv.python(VENV)


def ensure_dvc2() -> Path:
    """The `dvc` executable of DVC 2.58, installing it on first use."""
    if not DVC2_REQUIREMENTS.is_file():
        raise Dvc2Unavailable(
            f"{DVC2_REQUIREMENTS} is absent: it pins a DVC 2.58 that still installs "
            "(a partial checkout of the repository?)")
    cached_venv.ensure(VENV, cached_venv.requirements(DVC2_REQUIREMENTS))
    dvc = VENV / "bin" / "dvc"
    version = subprocess.run([str(dvc), "--version"], capture_output=True, text=True)
    if not version.stdout.strip().startswith("2.58"):
        raise Dvc2InstallError(f"{dvc} --version says {version.stdout.strip()!r} "
                               f"(stderr: {version.stderr.strip()[-2000:]}), not 2.58")
    return dvc
