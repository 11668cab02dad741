"""User state as arrays plus a JSON tree, without pickle.

A value saved with a checkpoint may be an array (NumPy, CuPy, a torch
tensor) or a nest of dicts, lists and tuples holding arrays and plain
scalars: a model's ``state_dict()``, an optimizer's (whose keys are ints).
It is split into host arrays, each written as ``.npy``, and a JSON tree
that records the structure, key types and each leaf's kind, so it comes
back as it went in. torch is imported only when a torch leaf is read.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

_KEY_TYPES = {"str": str, "int": int}


def _torch_leaf(value) -> tuple[np.ndarray, dict[str, Any]]:
    tensor = value.detach()
    device = str(tensor.device)
    tensor = tensor.cpu().contiguous()
    dtype = str(tensor.dtype).removeprefix("torch.")
    try:
        host = tensor.numpy()
        view = None
    except TypeError:  # bfloat16, float8: no NumPy dtype; keep the bits
        view = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}[tensor.element_size()]
        host = tensor.view(getattr(__import__("torch"), view)).numpy()
    return host, {"kind": "torch", "torch_dtype": dtype, "torch_view": view, "device": device}


def _leaf(path: str, value: Any) -> tuple[np.ndarray, dict[str, Any]] | None:
    module = type(value).__module__
    if module.startswith("cupy"):
        return value.get(), {"kind": "cupy", "device": "gpu"}
    if module.startswith("torch") and hasattr(value, "detach"):
        return _torch_leaf(value)
    if isinstance(value, (np.ndarray, np.generic)):
        host = np.asarray(value)
        if host.dtype.hasobject:
            raise TypeError(f"array {path!r}: dtype {host.dtype} holds Python objects, which "
                            "would need pickle; store numbers, or put small values in metadata")
        return host, {"kind": "numpy", "device": "cpu"}
    if module.startswith("jax") and hasattr(value, "__array__"):
        return np.asarray(value), {"kind": "jax", "device": "cpu"}
    return None


def flatten(name: str, value: Any, add_array: Callable[[np.ndarray, dict], int]) -> Any:
    """The JSON tree of ``value``; arrays go to ``add_array``, which returns an index."""
    leaf = _leaf(name, value)
    if leaf is not None:
        return {"array": add_array(*leaf)}
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if type(key) not in (str, int):
                raise TypeError(f"{name!r}: key {key!r} is a {type(key).__name__}; only str "
                                "and int keys can be saved without pickle")
            items.append([key, type(key).__name__, flatten(f"{name}/{key}", item, add_array)])
        return {"dict": items}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [flatten(f"{name}/{i}", v, add_array)
                                        for i, v in enumerate(value)]}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"{name!r}: a {type(value).__name__} cannot be saved without pickle; "
                    "save arrays, tensors, numbers, strings, and dicts/lists of them")


def _restore_leaf(host: np.ndarray, info: dict[str, Any], cupy) -> Any:
    kind = info.get("kind")
    if kind == "torch":
        import torch

        tensor = torch.from_numpy(np.array(host))
        if info.get("torch_view"):
            tensor = tensor.view(getattr(torch, info["torch_dtype"]))
        return tensor
    if kind == "cupy" and cupy is not None:
        return cupy.asarray(host)
    if kind == "jax":
        import jax.numpy as jnp

        return jnp.asarray(host)
    return host


def unflatten(tree: Any, leaves: list[np.ndarray], infos: list[dict], cupy=None,
              where: str = "") -> Any:
    """Rebuild a value from its JSON tree (never evaluating anything in it)."""
    if not isinstance(tree, dict) or len(tree) != 1:
        raise ValueError(f"{where}: not a value tree")
    (kind, body), = tree.items()
    if kind == "array":
        if not isinstance(body, int) or not 0 <= body < len(leaves):
            raise ValueError(f"{where}: array index {body!r} out of range")
        return _restore_leaf(leaves[body], infos[body], cupy)
    if kind == "dict":
        out = {}
        for key, key_type, item in body:
            out[_KEY_TYPES[key_type](key)] = unflatten(item, leaves, infos, cupy, where)
        return out
    if kind in ("list", "tuple"):
        items = [unflatten(item, leaves, infos, cupy, where) for item in body]
        return items if kind == "list" else tuple(items)
    if kind == "float":
        return float(body) if body in ("nan", "inf", "-inf") else _bad(where, body)
    if kind == "value":
        return body
    return _bad(where, kind)


def _bad(where: str, what: Any):
    raise ValueError(f"{where}: unknown entry {what!r}")


def snapshot(value: Any) -> Any:
    """A private copy of ``value`` (arrays copied where they live, on the GPU
    for GPU arrays), so training may go on while a background save writes it."""
    module = type(value).__module__
    if isinstance(value, np.ndarray) or module.startswith("cupy"):
        return value.copy()
    if module.startswith("torch") and hasattr(value, "detach"):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(v) for v in value)
    return value  # scalars, NumPy scalars and JAX arrays are immutable
