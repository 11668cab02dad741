"""Nested mappings as one level of joined keys: ``{"train": {"lr": 0.1}}`` ->
``{"train.lr": 0.1}``, as `-S train.lr=...` names a param. The one helper for
params (run_start, row_queries), DVCLive metrics (row_queries, joined by
"/") and pipeline descriptions (dali_state). Pure.

(A checkpoint's array values are split by arrays.flatten, another idea:
leaves to files and a JSON tree.)
"""

from __future__ import annotations

from typing import Any, Callable, Optional


def flat_keys(node: object, prefix: str = "", sep: str = ".", *,
              empty_as_leaf: bool = True,
              keep: Optional[Callable[[object, Any], bool]] = None) -> dict[str, Any]:
    """Every leaf of ``node`` under its keys joined by ``sep`` (and prefixed by
    ``prefix``); a ``node`` that is not a mapping has none. An empty mapping is
    a leaf of its own (a param set to ``{}``), or nothing with
    ``empty_as_leaf=False`` (a description compares only what it holds).
    ``keep(key, value)``: only the leaves it accepts (``key`` its own, not
    joined)."""
    flat: dict[str, Any] = {}
    for key, value in (node.items() if isinstance(node, dict) else ()):
        if isinstance(value, dict) and (value or not empty_as_leaf):
            flat.update(flat_keys(value, f"{prefix}{key}{sep}", sep,
                                  empty_as_leaf=empty_as_leaf, keep=keep))
        elif keep is None or keep(key, value):
            flat[f"{prefix}{key}"] = value
    return flat
