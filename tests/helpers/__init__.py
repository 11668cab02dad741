"""What the tests share: projects, rows, pipelines, processes, and the runner
scripts tests start as processes of their own (by path: ``HELPERS / name``).

Imported as ``from tests.helpers import pipelines``: pytest puts the
repository root on sys.path (``pythonpath`` in pyproject.toml), and every
child process a test starts gets it as PYTHONPATH, so runner scripts import
the same way. Nothing here imports pytest, DALI or DVC on import.
"""

from __future__ import annotations

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
REPO = TESTS.parent


def child_env(extra: dict | None = None, base: dict | None = None,
              this_python: bool = False) -> dict:
    """The environment of a process a test starts: ``base`` (default this
    process's), the repository on PYTHONPATH (dvc_dali and tests importable),
    then ``extra``. ``this_python``: this interpreter's directory first on
    PATH, so `dvc`, and the `python` of a stage's command, are this
    interpreter's."""
    import os
    import sys

    env = dict(os.environ if base is None else base)
    if this_python:
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    env.update(extra or {})
    return env
