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
