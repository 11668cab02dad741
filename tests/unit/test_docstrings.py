"""Every public name has a docstring complete enough to be the reference.

docs/reference/api.md is generated from these docstrings (mkdocstrings), so
a public name without one, or a parameter its docstring's ``Args:`` section
does not name, is a hole in the reference: it fails here. Public: the names
of ``dvc_dali.__all__``, the public methods and properties of its classes,
and the callbacks ``Checkpointer.keras_callback`` and
``Checkpointer.lightning_callback`` return (read from their source, so this
test imports neither Keras nor Lightning).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import dvc_dali

PACKAGE = Path(dvc_dali.__file__).parent
CALLBACK_MODULES = ["integrations/keras_callback.py", "integrations/lightning_callback.py"]
SECTION = re.compile(r"^\s*(Args|Returns|Raises|Attributes|Warns|Yields|Examples?):\s*$")


def documented_args(doc: str) -> set[str]:
    """The names the ``Args:`` section of a Google-style docstring lists."""
    names: set[str] = set()
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "Args:":
            indent = None  # the items' own indentation: deeper lines continue an item
            for item in lines[i + 1:]:
                if SECTION.match(item):
                    break
                if not item.strip():
                    continue
                depth = len(item) - len(item.lstrip())
                indent = depth if indent is None else indent
                found = re.match(r"^\s+\**(\w+)(?: \([^)]*\))?:", item)
                if found and depth == indent:
                    names.add(found.group(1))
    return names


def _public_names() -> list[str]:
    return [n for n in dvc_dali.__all__ if n != "__version__"]


def _own_members(cls: type) -> list[tuple[str, object]]:
    """A class's public methods and properties, defined on it (not inherited)."""
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            found.append((name, value.fget))
        elif inspect.isfunction(value):
            found.append((name, value))
    return found


def _params(func) -> list[str]:
    return [p.name for p in inspect.signature(func).parameters.values()
            if p.name not in ("self", "cls")]


@pytest.mark.parametrize("name", _public_names())
def test_public_name_has_a_docstring(name):
    obj = getattr(dvc_dali, name)
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    assert doc and doc.strip(), f"dvc_dali.{name} has no docstring"


@pytest.mark.parametrize("name", _public_names())
def test_public_methods_have_docstrings(name):
    obj = getattr(dvc_dali, name)
    if not inspect.isclass(obj):
        return
    missing = [m for m, f in _own_members(obj) if not (f.__doc__ or "").strip()]
    assert not missing, f"dvc_dali.{name}: no docstring on {missing}"


@pytest.mark.parametrize("name", _public_names())
def test_every_parameter_is_documented(name):
    obj = getattr(dvc_dali, name)
    callables = []
    if inspect.isfunction(obj):
        callables.append((name, obj, obj.__doc__))
    elif inspect.isclass(obj) and "__init__" in vars(obj) and not issubclass(obj, Exception):
        if not getattr(obj, "__dataclass_fields__", None):
            callables.append((name, obj.__init__, obj.__doc__))  # Args in the class docstring
    if inspect.isclass(obj):
        callables += [(f"{name}.{m}", f, f.__doc__) for m, f in _own_members(obj)
                      if not isinstance(vars(obj)[m], property)]
    for label, func, doc in callables:
        missing = [p for p in _params(func) if p not in documented_args(doc or "")]
        assert not missing, f"dvc_dali.{label}: its docstring's Args: does not name {missing}"


def test_dataclass_fields_are_documented():
    for name in _public_names():
        fields = getattr(getattr(dvc_dali, name), "__dataclass_fields__", None)
        if fields:
            doc = getattr(dvc_dali, name).__doc__
            missing = [f for f in fields if not re.search(rf"^\s+{f}(?: \(.*\))?:", doc, re.M)]
            assert not missing, f"dvc_dali.{name}: its Attributes: do not name {missing}"


@pytest.mark.parametrize("module", CALLBACK_MODULES)
def test_callback_classes_are_documented(module):
    tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
    problems = []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef) or cls.name.startswith("_"):
            continue
        if not ast.get_docstring(cls):
            problems.append(f"{cls.name}: no docstring")
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_"):
                continue
            doc = ast.get_docstring(fn)
            if not doc:
                problems.append(f"{cls.name}.{fn.name}: no docstring")
            elif "Args:" in doc:
                params = [a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg != "self"]
                params += [a.arg for a in (fn.args.vararg, fn.args.kwarg) if a]
                missing = [p for p in params if p not in documented_args(doc)]
                if missing:
                    problems.append(f"{cls.name}.{fn.name}: Args: does not name {missing}")
    assert not problems, f"dvc_dali/{module}: {problems}"


def test_the_api_page_renders_every_public_name():
    page = (PACKAGE.parent / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    rendered = set(re.findall(r"^::: dvc_dali\.(\w+)$", page, re.M))
    missing = [n for n in _public_names() if n not in rendered]
    assert not missing, f"docs/reference/api.md: no `::: dvc_dali.<name>` for {missing}"
