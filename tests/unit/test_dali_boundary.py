"""DALI behind one door. The rule: in dvc_dali/ (subpackages included), only
the modules in ALLOWED import anything under ``nvidia`` (with an import
statement, or by name through importlib.import_module or __import__) or use
the attributes in DALI_ATTRIBUTES (DALI's private ones, and the iterators'
checkpoints()) on objects other than their own ``self``/``cls``. Every other
module calls functions of those modules instead, so what DALI may change
between releases (its private attributes, its module layout) is met in those
modules alone. TensorFlow, Keras and Lightning each have a door of their
own too (FRAMEWORK_DOORS): only that module imports the framework.

Static (ast): nothing is imported, so it runs without DALI.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dvc_dali"

#: The only modules (paths relative to dvc_dali/) allowed to touch DALI.
ALLOWED = frozenset({
    "dali_state.py",      # pipelines: build, restore, describe, capture, read state bytes
    "dali_iterators.py",  # framework iterators (PyTorch, JAX)
    "dali_dynamic.py",    # dynamic mode's checkpoint.Checkpoint
    "dali_tf.py",         # the TF plugin's DALIDataset and its iterators' state
})

#: Each framework behind its own door too: {top-level module: the modules that may import it}.
FRAMEWORK_DOORS = {
    "tensorflow": frozenset({"dali_tf.py"}),
    "keras": frozenset({"keras_callback.py"}),
    "lightning": frozenset({"lightning_callback.py"}),
}

#: Attributes of DALI objects that only the allowed modules may use: DALI's
#: private ones, and the iterator's checkpoints(). Reached on ``self``/``cls``
#: they are the module's own attributes and are not counted.
DALI_ATTRIBUTES = frozenset({
    "_pipes", "_checkpoint", "_enable_checkpointing", "_built", "_py_graph_built",
    "_build_graph", "_ops", "_callback", "_group", "source_desc", "checkpoints",
})


def _is_nvidia(module: str | None) -> bool:
    return module is not None and (module == "nvidia" or module.startswith("nvidia."))


def _import_by_name(node: ast.Call) -> str | None:
    """The module named in importlib.import_module("...") or __import__("...")."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name in ("import_module", "__import__") and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def violations(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: what' for each DALI import or DALI attribute in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        what = None
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if _is_nvidia(a.name)]
            what = f"imports {', '.join(names)}" if names else None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_nvidia(node.module):
            what = f"imports from {node.module}"
        elif isinstance(node, ast.Call) and _is_nvidia(_import_by_name(node)):
            what = f"imports {_import_by_name(node)} by name"
        elif (isinstance(node, ast.Attribute) and node.attr in DALI_ATTRIBUTES
              and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            what = f"reaches DALI's .{node.attr}"
        if what:
            found.append(f"{filename}:{node.lineno}: {what}")
    return found


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_allowed_modules_exist():
    missing = [name for name in ALLOWED if not (PACKAGE / name).is_file()]
    assert not missing, f"ALLOWED names modules that are gone: {missing}; update the list"


def test_only_the_allowed_modules_touch_dali():
    found = []
    for path in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in ALLOWED:
            found += violations(path.read_text(encoding="utf-8"), f"dvc_dali/{rel}")
    assert not found, ("DALI is reached outside " + ", ".join(sorted(ALLOWED))
                       + ": go through them instead\n  " + "\n  ".join(found))


def _imported_tops(source: str, filename: str) -> dict[str, int]:
    tops = {}
    for node in ast.walk(ast.parse(source, filename)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        for name in names:
            tops.setdefault(name.split(".")[0], node.lineno)
    return tops


def test_tensorflow_and_keras_are_reached_through_their_doors():
    found = []
    for path in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        for top, line in _imported_tops(path.read_text(encoding="utf-8"), rel).items():
            if top in FRAMEWORK_DOORS and rel not in FRAMEWORK_DOORS[top]:
                found.append(f"dvc_dali/{rel}:{line}: imports {top}")
    assert not found, "go through dali_tf.py / keras_callback.py:\n  " + "\n  ".join(found)
    for top, doors in FRAMEWORK_DOORS.items():  # the checker is not blind
        for door in doors:
            assert top in _imported_tops((PACKAGE / door).read_text(encoding="utf-8"), door)


def test_the_allowed_modules_do_touch_dali():
    # Guards the checker itself: were it blind, the test above would pass vacuously.
    for name in ALLOWED:
        assert violations((PACKAGE / name).read_text(encoding="utf-8"), name), name


@pytest.mark.parametrize("source", [
    "import nvidia.dali",
    "import os, nvidia",
    "from nvidia.dali import fn",
    "from nvidia.dali.experimental.dynamic import checkpoint",
    "def f():\n    import nvidia.dali.plugin.pytorch as p",
    "import importlib\nimportlib.import_module('nvidia.dali')",
    "__import__('nvidia.dali')",
    "x = it._pipes",
    "pipe._checkpoint = b''",
    "states = iterator.checkpoints()",
    "if pipe._built: pass",
])
def test_checker_flags(source):
    assert violations(source)


@pytest.mark.parametrize("source", [
    "from . import dali_state",
    "from .dali_state import dali_version",
    "import nvidia_smi_wrapper",
    "from dvc.stage.serialize import to_single_stage_lockfile",
    "self._pipes = {}",
    "cls._built = True",
    "checkpoint = args.checkpoint",
    "from .nvidia import x",
])
def test_checker_passes(source):
    assert not violations(source)
