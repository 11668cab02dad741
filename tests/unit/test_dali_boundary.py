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
    "dali/dali_state.py",      # pipelines: build, restore, describe, capture, read state bytes
    "dali/dali_iterators.py",  # framework iterators (PyTorch, JAX)
    "dali/dali_dynamic.py",    # dynamic mode's checkpoint.Checkpoint
    "dali/dali_tf.py",         # the TF plugin's DALIDataset and its iterators' state
})

#: Each framework behind its own door too: {top-level module: the modules that may import it}.
FRAMEWORK_DOORS = {
    "tensorflow": frozenset({"dali/dali_tf.py"}),
    "keras": frozenset({"integrations/keras_callback.py"}),
    "lightning": frozenset({"integrations/lightning_callback.py"}),
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


# --------------------------------------------------------------------------
# Layers. The package is layered, lowest first (docs/design/architecture.md
# says why each module sits where it does): a module imports only from its own
# layer or lower ones, type-only imports (under ``if TYPE_CHECKING:``),
# imports inside functions and imports by name included; and no module
# imports itself back through others (no import cycle). The public API,
# dvc_dali/__init__.py, stands above them all: it loads every layer lazily.
# --------------------------------------------------------------------------

#: The layers, lowest first: each is a folder of dvc_dali/, and a module's
#: layer is the folder it is in. Three files stand outside the folders:
#: _version.py (read by the packaging, counted in core), __main__.py
#: (`python -m dvc_dali`, counted in cli) and the public API.
LAYERS = ("core", "format", "reading", "dali", "proof", "recording", "integrations",
          "training", "cli")
#: Above every layer: the public API, which loads them lazily.
API = "__init__.py"
OUTSIDE = {"_version.py": "core", "__main__.py": "cli"}


def layer_name(rel: str) -> str | None:
    """The layer of module ``rel`` (a path relative to dvc_dali/): its
    folder; None for a module in no layer's folder."""
    top = rel.split("/")[0] if "/" in rel else OUTSIDE.get(rel)
    return top if top in LAYERS else None


def _layer_of(graph: dict[str, dict[str, int]]) -> dict[str, int]:
    return {module: LAYERS.index(layer_name(module)) for module in graph
            if module != API and layer_name(module) is not None}


def _module_path(name: str) -> str | None:
    """'dvc_dali.recording.stage' -> 'recording/stage.py' (a package: its
    __init__.py); None outside dvc_dali or for a name that is no module."""
    parts = name.split(".")
    if parts[0] != "dvc_dali":
        return None
    while parts:
        rel = "/".join(parts[1:])
        for candidate in ((rel + ".py") if rel else None, (rel + "/" if rel else "") + API):
            if candidate and (PACKAGE / candidate).is_file():
                return candidate
        parts = parts[:-1]
    return None


def _absolute(node: ast.ImportFrom, rel: str) -> str:
    """The absolute module an ``from ... import`` reads from, in module ``rel``."""
    if node.level == 0:
        return node.module or ""
    package = ["dvc_dali", *rel.split("/")[:-1]]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def internal_imports(source: str, rel: str) -> dict[str, int]:
    """{module path: first line} of the dvc_dali modules ``source`` (module
    ``rel``) imports, in any way: at its top, in a function, under
    TYPE_CHECKING, by name (import_module, __import__)."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source, rel)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, rel)
            names = [f"{base}.{a.name}" for a in node.names]  # a submodule, else base's name
        elif isinstance(node, ast.Call) and _import_by_name(node):
            names = [_import_by_name(node)]
        for name in names:
            path = _module_path(name)
            if path is not None and path != rel:
                found.setdefault(path, node.lineno)
    return found


def _graph() -> dict[str, dict[str, int]]:
    return {p.relative_to(PACKAGE).as_posix(): internal_imports(
        p.read_text(encoding="utf-8"), p.relative_to(PACKAGE).as_posix()) for p in _modules()
        if "templates" not in p.relative_to(PACKAGE).parts}


def upward_imports(graph: dict[str, dict[str, int]], layer_of: dict[str, int]) -> list[str]:
    names = list(LAYERS)
    found = []
    for module, imports in sorted(graph.items()):
        if module == API:
            continue
        for target, line in sorted(imports.items()):
            if target == API or layer_of[target] > layer_of[module]:
                above = "the public API" if target == API else names[layer_of[target]]
                found.append(f"dvc_dali/{module}:{line}: {names[layer_of[module]]} imports "
                             f"{target} ({above})")
    return found


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_is_in_a_layer_folder():
    loose = sorted(m for m in _graph() if m != API and layer_name(m) is None)
    assert not loose, (f"{loose}: put each module in the folder of its layer (lowest first: "
                       + " < ".join(LAYERS) + "; docs/design/architecture.md says which)")
    folders = {p.name for p in PACKAGE.iterdir()
               if p.is_dir() and p.name not in ("templates", "__pycache__")}
    assert folders == set(LAYERS), (f"dvc_dali/'s folders {sorted(folders)} are not the "
                                    f"layers {list(LAYERS)}: add a new one to LAYERS, in order")


def test_no_module_imports_from_a_higher_layer():
    graph = _graph()
    found = upward_imports(graph, _layer_of(graph))
    assert not found, ("a lower layer imports a higher one (lowest first: "
                       + " < ".join(LAYERS) + "):\n  " + "\n  ".join(found))


def test_no_import_cycle():
    found = cycles(_graph())
    assert not found, "import cycles:\n  " + "\n  ".join(" <-> ".join(c) for c in found)


def test_the_layer_checker_is_not_blind():
    # the graph has the edges everyone knows of
    graph = _graph()
    assert ("core/errors.py" in graph["format/store.py"]
            and "format/store.py" in graph["training/checkpointer.py"])
    assert "recording/dvc_door.py" in graph["recording/stage.py"]


@pytest.mark.parametrize("source, rel, target", [
    ("from ..training.checkpointer import Checkpointer", "format/store.py",
     "training/checkpointer.py"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..recording.auto_push "
     "import Pusher", "core/process_state.py", "recording/auto_push.py"),
    ("def f():\n    from ..proof import batch_digests", "recording/pipeline.py",
     "proof/batch_digests.py"),
    ("from ..training.checkpointer import Checkpointer", "recording/pipeline.py",
     "training/checkpointer.py"),
    ("import dvc_dali.cli.main", "core/errors.py", "cli/main.py"),
    ("from dvc_dali.reading import loading", "core/errors.py", "reading/loading.py"),
    ("import importlib\nimportlib.import_module('dvc_dali.cli.main')", "core/errors.py",
     "cli/main.py"),
    ("from .. import recording", "format/store.py", "recording/__init__.py"),
    ("from . import store", "format/arrays.py", "format/store.py"),
])
def test_layer_checker_sees(source, rel, target):
    assert target in internal_imports(source, rel)


def test_a_module_is_in_the_layer_of_its_folder():
    assert layer_name("core/errors.py") == "core" and layer_name("_version.py") == "core"
    assert layer_name("recording/stage.py") == "recording"
    assert layer_name("cli/__main__.py") == "cli"
    assert layer_name("store.py") is None and layer_name("misc/store.py") is None


def test_layer_checker_flags_upward_imports_and_cycles():
    layer_of = {"errors.py": 0, "store.py": 1, "cli.py": 2}
    assert upward_imports({"errors.py": {"cli.py": 3}, "cli.py": {"errors.py": 1}}, layer_of)
    assert not upward_imports({"cli.py": {"store.py": 1, "errors.py": 2}}, layer_of)
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        ["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []
