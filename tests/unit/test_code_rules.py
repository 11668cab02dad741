"""Code rules ruff has no rule for, checked on the package's source."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dvc_dali"
MAX_FUNCTION_LINES = 60


def long_functions(root: Path, limit: int) -> list[str]:
    """'path:line name (N lines)' for every function (methods and nested ones
    included) longer than ``limit`` lines, from its `def` to its last line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # lineno is the `def` line (decorators not counted)
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    rel = path.relative_to(root.parent)
                    found.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_longer_than_the_limit():
    offenders = long_functions(PACKAGE, MAX_FUNCTION_LINES)
    assert not offenders, (f"{len(offenders)} function(s) in dvc_dali/ longer than "
                           f"{MAX_FUNCTION_LINES} lines; split them:\n" + "\n".join(offenders))


def test_the_rule_sees_long_functions(tmp_path):
    """The check itself: a 61-line function is reported, a 60-line one is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("def ok():\n" + "    x = 1\n" * 59
                              + "class C:\n    async def too_long(self):\n"
                              + "        x = 1\n" * 60)
    assert long_functions(pkg, 60) == ["pkg/m.py:62 too_long (61 lines)"]
