"""Virtual environments the tests need beside the project's own, built once
and kept where pip keeps its cache, so a second run on the same machine
downloads nothing again (a first run still builds them from nothing).

Each lives in ~/.cache/dvc-dali/<name> (or the directory its variable names),
with a marker holding what it was built from (the pip arguments, the Python
version): a different marker, or none (a build cut short), rebuilds it. One
builder at a time (parallel pytest workers, CI steps, bench) under a lock.
Building needs the package index: where pip cannot reach one, or it has no
build of a pinned package for this Python, the environment is unavailable
(callers skip, saying so); any other failure is an error.

    python3 -m tests.helpers.cached_venv lowest-dvc   # prints its directory
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

from tests.helpers import REPO

CACHE = Path.home() / ".cache" / "dvc-dali"
MARKER = ".dvc-dali-installed"

# What pip says when it cannot reach an index, or the index has no build of a
# pin for this interpreter: the machine's limits, not a broken build.
_UNAVAILABLE = ("Could not find a version that satisfies", "No matching distribution found",
                "Failed to establish a new connection", "Temporary failure in name resolution",
                "Network is unreachable", "Max retries exceeded")


class VenvUnavailable(RuntimeError):
    """The environment cannot be built here: no package index, or no build of a
    pinned package for this Python (skip, do not fail)."""


class VenvInstallError(RuntimeError):
    """Building the environment failed (the message holds pip's output)."""


def location(name: str, variable: str | None = None) -> Path:
    """Where the environment ``name`` lives: $variable if set, else the cache."""
    return Path((variable and os.environ.get(variable)) or CACHE / name)


def python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _stamp(pip_args: list[str]) -> str:
    digest = hashlib.sha256("\n".join(pip_args).encode()).hexdigest()
    return f"{digest} python {sys.version_info[0]}.{sys.version_info[1]}\n"


def ensure(venv: Path, pip_args: list[str]) -> Path:
    """The environment at ``venv`` with ``pip install pip_args`` done in it,
    built now unless a complete one built from the same arguments is there.
    ``pip_args`` are what decides its contents: a requirements file is read
    into them by the caller, so an edit of the file rebuilds."""
    marker, stamp = venv / MARKER, _stamp(pip_args)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text() == stamp and python(venv).is_file():
            return venv
        # No marker, or one for other arguments: a half-made or stale venv, rebuilt.
        shutil.rmtree(venv, ignore_errors=True)
        steps = ([sys.executable, "-m", "venv", str(venv)],
                 [str(python(venv)), "-m", "pip", "install", "-q",
                  "--disable-pip-version-check", *pip_args])
        for cmd in steps:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            if proc.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                said = proc.stdout + proc.stderr
                if any(text in said for text in _UNAVAILABLE):
                    raise VenvUnavailable(
                        f"{venv.name} cannot be built here: pip cannot get "
                        f"{' '.join(pip_args)} (no package index, or no build for Python "
                        f"{sys.version_info[0]}.{sys.version_info[1]}): "
                        f"{(proc.stderr.strip().splitlines() or [''])[-1][:300]}")
                raise VenvInstallError(
                    f"building {venv} failed: {' '.join(cmd)} exited "
                    f"{proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        marker.write_text(stamp)
    return venv


def requirements(path: Path) -> list[str]:
    """A requirements file's lines as pip arguments (comments and blanks left out)."""
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()
            if line.split("#", 1)[0].strip()]


def lowest_dvc_args() -> list[str]:
    """The lowest DVC pyproject.toml allows and everything else the package and
    the example need (not the package itself: tests/lowest_dvc.sh installs
    this tree into the environment on every run, without dependencies), plus
    pytest. DVC before 3.66 fails with pathspec 1.x and does not cap it."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = [d for d in project["dependencies"] if not d.replace(" ", "").startswith("dvc>")]
    return ["dvc==3.54.*", "pathspec<1", *deps, *project["optional-dependencies"]["example"],
            "pytest>=7", "pytest-xdist", "setuptools>=64"]


NAMED = {"lowest-dvc": lowest_dvc_args}

if __name__ == "__main__":
    name = sys.argv[1]
    print(ensure(location(name), NAMED[name]()))

