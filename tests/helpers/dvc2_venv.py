"""DVC 2.58 in a virtual environment of its own, built once and cached.

Shared by tests/e2e/test_dvc2_compat.py (the `dvc2` fixture) and bench/ (the
side-by-side DVC 2 timings). The pins are tests/dvc2-requirements.txt, in
the repository (without them pip resolves libraries DVC 2.58 cannot import).
The environment is kept in $DVC_DALI_DVC2_VENV, default
~/.cache/dvc-dali/dvc2-venv, and rebuilt when the pins or the Python
version change. Building it needs the package index (PyPI or a mirror pip is
configured for): where pip cannot reach one, or it has no build of a pinned
package for this Python, DVC 2 is unavailable (the tests skip, saying so);
any other failure of the build is an error.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DVC2_REQUIREMENTS = REPO / "tests" / "dvc2-requirements.txt"
VENV = Path(os.environ.get("DVC_DALI_DVC2_VENV")
            or Path.home() / ".cache" / "dvc-dali" / "dvc2-venv")
MARKER = ".dvc-dali-installed"


class Dvc2Unavailable(RuntimeError):
    """DVC 2 cannot be installed here: no package index, or no build of a pinned
    package for this Python (skip, do not fail)."""


# What pip says when it cannot reach an index, or the index has no build of a
# pin for this interpreter: the machine's limits, not a broken build.
_UNAVAILABLE = ("Could not find a version that satisfies", "No matching distribution found",
                "Failed to establish a new connection", "Temporary failure in name resolution",
                "Network is unreachable", "Max retries exceeded")


class Dvc2InstallError(RuntimeError):
    """Building the environment failed (the message holds pip's output)."""


def _install_stamp() -> str:
    digest = hashlib.sha256(DVC2_REQUIREMENTS.read_bytes()).hexdigest()
    return f"{digest} python {sys.version_info[0]}.{sys.version_info[1]}\n"


def python() -> Path:
    """The environment's interpreter (it has DVC 2.58's `dvc.api`)."""
    return VENV / "bin" / "python"


def ensure_dvc2() -> Path:
    """The `dvc` executable of DVC 2.58, installing it on first use."""
    if not DVC2_REQUIREMENTS.is_file():
        raise Dvc2Unavailable(
            f"{DVC2_REQUIREMENTS} is absent: it pins a DVC 2.58 that still installs "
            "(a partial checkout of the repository?)")
    dvc = VENV / "bin" / "dvc"
    marker = VENV / MARKER
    stamp = _install_stamp()
    VENV.parent.mkdir(parents=True, exist_ok=True)
    # One installer at a time (parallel pytest workers, concurrent sessions, bench).
    with open(VENV.parent / f".{VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text() == stamp and dvc.is_file():
            return dvc
        # No marker, or one for other pins: a half-made or stale venv, rebuilt.
        shutil.rmtree(VENV, ignore_errors=True)
        steps = ([sys.executable, "-m", "venv", str(VENV)],
                 [str(python()), "-m", "pip", "install", "-q",
                  "--disable-pip-version-check", "-r", str(DVC2_REQUIREMENTS)])
        for cmd in steps:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                shutil.rmtree(VENV, ignore_errors=True)
                if any(text in proc.stdout + proc.stderr for text in _UNAVAILABLE):
                    raise Dvc2Unavailable(
                        f"DVC 2.58 cannot be installed here: pip cannot get the pinned "
                        f"packages of {DVC2_REQUIREMENTS.name} (no package index, or no "
                        f"build for Python {sys.version_info[0]}.{sys.version_info[1]}): "
                        f"{(proc.stderr.strip().splitlines() or [''])[-1][:300]}")
                raise Dvc2InstallError(
                    f"building the DVC 2 venv failed: {' '.join(cmd)} exited "
                    f"{proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        version = subprocess.run([str(dvc), "--version"], capture_output=True, text=True)
        if not version.stdout.strip().startswith("2.58"):
            raise Dvc2InstallError(f"{dvc} --version says {version.stdout.strip()!r} "
                                   f"(stderr: {version.stderr.strip()[-2000:]}), not 2.58")
        marker.write_text(stamp)
    return dvc
