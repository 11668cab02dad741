"""The Design page "How it is built" (docs/design/architecture.md) names
every module of dvc_dali/ in its map, so the map stays complete: a new
module fails here until it has its line."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dvc_dali"
PAGE = ROOT / "docs" / "design" / "architecture.md"


def _map() -> str:
    """The indented block of the page that names checkpointer.py: the map."""
    text = PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"(?:^ {4}.*\n)+", text, flags=re.MULTILINE)
    return next(b for b in blocks if "checkpointer.py" in b)


def _modules() -> list[str]:
    """Every module under dvc_dali/ as a path relative to it (not the
    templates, which `dvc-dali init` copies into a project)."""
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                  if "templates" not in p.relative_to(PACKAGE).parts)


def test_map_names_every_module():
    block = _map()
    missing = [m for m in _modules()
               if not re.search(rf"(?<![\w/.]){re.escape(m)}(?!\w)", block)]
    assert not missing, (f"{PAGE.relative_to(ROOT)}: the module map names no {missing}; "
                         "add one line each (path, then what it holds)")


def test_map_names_no_module_that_is_gone():
    named = set(re.findall(r"(?<![\w/.])((?:recording/)?\w+\.py)\b", _map()))
    gone = sorted(named - set(_modules()))
    assert not gone, f"{PAGE.relative_to(ROOT)}: the module map names {gone}, not in dvc_dali/"
