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
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from ..core.arguments import kind_of
from ..core.errors import ArgumentTypeError

_KEY_TYPES = {"str": str, "int": int}
# Nesting deeper than this is refused when saving and when reading: each
# level costs a few frames of recursion and three levels of manifest JSON.
MAX_TREE_DEPTH = 64


def _torch_leaf(value) -> tuple[np.ndarray, dict[str, Any]]:
    tensor = value.detach()
    device = str(tensor.device)
    # a conjugate or negative view's values, not its lazy flag (its bits are the base's)
    tensor = tensor.resolve_conj().resolve_neg().cpu().contiguous()
    dtype = str(tensor.dtype).removeprefix("torch.")
    try:
        host = tensor.numpy()
        view = None
    except TypeError:  # bfloat16, float8: no NumPy dtype; keep the bits
        view = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}[tensor.element_size()]
        host = tensor.view(getattr(__import__("torch"), view)).numpy()
    info = {"kind": "torch", "torch_dtype": dtype, "torch_view": view, "device": device}
    return host, {**info, **_trained(value)}


def _is_parameter(value: Any) -> bool:
    """A torch ``nn.Parameter``, told by its class's name (torch is imported
    only when a torch leaf is read)."""
    return type(value).__name__ == "Parameter"


def _trained(value: Any) -> dict[str, Any]:
    """How a tensor is trained, kept so it comes back trained: a learned
    value kept in ``arrays`` (``nn.Parameter``, ``requires_grad``) came back
    a plain tensor, which a resumed optimizer never updates (its grad stays
    None). Nothing for a state_dict's tensors: they are detached."""
    if _is_parameter(value):
        return {"parameter": True, "requires_grad": bool(value.requires_grad)}
    return {"requires_grad": True} if value.requires_grad else {}


def _refuse_torch(path: str, value: Any) -> None:
    """What a tensor's bytes alone would not bring back, refused naming it
    (at the call, asynchronous saves too; they were torch's tracebacks, or
    a quantized tensor came back one no torch call reads): a quantized
    tensor's scale and zero point, a sparse or nested tensor's layout; and
    an expanded view of a few bytes that would be written as gigabytes."""
    if getattr(value, "is_quantized", False):
        raise ArgumentTypeError(f"array {path!r}: a quantized tensor ({value.dtype}) would "
                                "come back without its scale and zero point; save "
                                "value.dequantize(), or value.int_repr() with value.q_scale() "
                                "and value.q_zero_point()")
    if getattr(value, "is_nested", False):
        raise ArgumentTypeError(f"array {path!r}: a nested tensor would not come back as "
                                "one; save list(value.unbind())")
    layout = str(getattr(value, "layout", "torch.strided"))
    if layout != "torch.strided":
        raise ArgumentTypeError(f"array {path!r}: a {layout.removeprefix('torch.')} tensor "
                                "would not come back as one; save value.to_dense(), or its "
                                "indices and values")
    size = value.element_size()
    _refuse_repeating(path, value.numel() * size, size, tuple(value.shape),
                      [s * size for s in value.stride()], "an expanded",
                      "the tensor it views, or value.clone() if the whole is meant")


def _refuse_jax(path: str, value: Any) -> None:
    """A typed PRNG key (``jax.random.key``) has no bytes NumPy can hold."""
    if "key<" in str(getattr(value, "dtype", "")):
        raise ArgumentTypeError(f"array {path!r}: a typed PRNG key ({value.dtype}); save "
                                "jax.random.key_data(key), and jax.random.wrap_key_data() it "
                                "back")


def _leaf(path: str, value: Any, read: bool = True) -> tuple[Any, dict[str, Any]] | None:
    """An array's host copy and how it comes back; None: not an array.
    ``read`` false: the value itself, nothing copied off its device (only
    NumPy's refusals are checked)."""
    module = type(value).__module__
    if module.startswith("cupy"):
        return (value.get() if read else value), {"kind": "cupy", "device": "gpu"}
    if module.startswith("torch") and hasattr(value, "detach"):
        _refuse_torch(path, value)
        return _torch_leaf(value) if read else (value, {})
    if isinstance(value, (np.ndarray, np.generic)):
        _refuse_array_subclass(path, value)
        host = np.asarray(value)
        if host.dtype.hasobject:
            raise ArgumentTypeError(f"array {path!r}: dtype {host.dtype} holds Python objects, "
                                    "which would need pickle; store numbers, or put small "
                                    "values in metadata")
        if host.dtype.itemsize == 0:  # the reader refuses these: no way to check a size
            raise ArgumentTypeError(f"array {path!r}: dtype {host.dtype} has zero-size elements")
        _refuse_expanding_view(path, host)
        host, info = _extension(host)
        info.update(kind="numpy", device="cpu")
        if isinstance(value, np.generic):  # np.float64(1.5) comes back a scalar, not 0-d
            info["scalar"] = True
        return host, info
    if module.startswith("jax") and hasattr(value, "__array__"):
        _refuse_jax(path, value)
        if not read:
            return value, {}
        host, info = _extension(np.asarray(value))
        return host, {**info, "kind": "jax", "device": "cpu"}
    return None


def _extension(host: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """An array of an ml_dtypes dtype (bfloat16, float8, int4: JAX's and
    Keras's low precisions) as its bits and the dtype's name: NumPy's dtype
    string for them ('<V2', '<f1') rebuilds no such dtype (they came back as
    raw bytes, or could not be read at all)."""
    if not _of_ml_dtypes(host.dtype):
        return host, {}
    return host.view(f"u{host.dtype.itemsize}"), {"ml_dtype": host.dtype.name}


def _of_ml_dtypes(dtype: np.dtype) -> bool:
    return dtype.fields is None and dtype.type.__module__.split(".")[0] == "ml_dtypes"


def _ml_dtype(info: dict[str, Any], host: np.ndarray) -> np.dtype | None:
    """The ml_dtypes dtype a leaf was saved as (``_extension``), or None;
    ValueError unless the saved bits fit it."""
    name = info.get("ml_dtype")
    if name is None:
        return None
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"ml_dtype {str(name)[:40]!r} is not a dtype name")
    try:
        import ml_dtypes
    except ImportError:
        raise ValueError(f"the array was saved as ml_dtypes.{name}; install ml_dtypes (pip "
                         "install ml-dtypes) to read it") from None
    found = getattr(ml_dtypes, name, None)
    dtype = np.dtype(found) if isinstance(found, type) and issubclass(found, np.generic) \
        else None
    if dtype is None or not _of_ml_dtypes(dtype):
        raise ValueError(f"ml_dtype {name!r} is not a dtype of the installed ml_dtypes "
                         f"{getattr(ml_dtypes, '__version__', '')} (a newer one may have it)")
    if host.dtype != np.dtype(f"u{dtype.itemsize}"):
        raise ValueError(f"ml_dtype {name} has {dtype.itemsize}-byte elements, the saved "
                         f"array is {host.dtype}")
    return dtype


def _refuse_array_subclass(path: str, value: Any) -> None:
    """An ndarray subclass would come back a plain ndarray: a masked array
    without its mask (its masked values as data), a matrix as an array.
    Refused now, naming the array; a memmap's values are its data, kept."""
    if isinstance(value, np.ma.MaskedArray):
        raise ArgumentTypeError(f"array {path!r}: a masked array would come back without its "
                                "mask; save its data and np.ma.getmaskarray(value) as two "
                                "arrays")
    if isinstance(value, np.ndarray) and type(value) not in (np.ndarray, np.memmap):
        raise ArgumentTypeError(f"array {path!r}: a {type(value).__name__} (an ndarray "
                                "subclass) would come back as a plain ndarray; save "
                                "np.asarray(value)")


_EXPANDS_ABOVE = 1 << 30  # bytes written beyond those a view spans in memory


def _refuse_expanding_view(path: str, host: np.ndarray) -> None:
    """A broadcast view (np.broadcast_to: strides of 0) is written whole: one
    of a few bytes may stand for terabytes, which failed in a copy with
    NumPy's MemoryError naming no array."""
    _refuse_repeating(path, host.nbytes, host.itemsize, host.shape, host.strides,
                      "a broadcast", "the array it views, or np.array(value) if the whole "
                      "is meant")


def _refuse_repeating(path: str, nbytes: int, itemsize: int, shape: tuple[int, ...],
                      byte_strides: Any, view: str, fix: str) -> None:
    """A view whose strides repeat its data (NumPy's broadcast_to, torch's
    expand: strides of 0) that would be written as more than _EXPANDS_ABOVE
    bytes beyond the memory it spans, refused naming it."""
    if nbytes <= _EXPANDS_ABOVE or 0 in shape:
        return
    spanned = itemsize + sum((n - 1) * abs(s) for n, s in zip(shape, byte_strides))
    if nbytes - spanned > _EXPANDS_ABOVE:
        raise ArgumentTypeError(f"array {path!r}: a view of {spanned} bytes of memory that "
                                f"would be written as {nbytes} bytes ({view} view repeats its "
                                f"data); save {fix}")


def _refuse_subclass(name: str, value: Any) -> None:
    """Containers come back as the type they were saved as: dict, OrderedDict
    (a state_dict()), list, tuple. Any other subclass (a namedtuple, a
    defaultdict) could not be rebuilt without pickle: refused now, not
    changed on the way back."""
    for base in (dict, list, tuple):
        if isinstance(value, base) and type(value) not in (base, OrderedDict):
            raise ArgumentTypeError(f"array {name!r}: a {type(value).__name__} (a "
                                    f"{base.__name__} subclass) would come back as a plain "
                                    f"{base.__name__}; convert it ({base.__name__}(value)) "
                                    "before saving")


_PLAIN = frozenset({str, int, bool, type(None)})  # floats: nan and inf are not JSON
_CONTAINERS = frozenset({dict, OrderedDict, list, tuple})


def flatten(name: str, value: Any, add_array: Callable[[np.ndarray, dict], int],
            depth: int = 0, read: bool = True) -> Any:
    """The JSON tree of ``value``; arrays go to ``add_array``, which returns an
    index (``read`` false: the arrays themselves, not copied to the host)."""
    if depth > MAX_TREE_DEPTH:  # what the reader refuses (and a cycle) is refused here
        raise ArgumentTypeError(f"array {name!r}: nested deeper than {MAX_TREE_DEPTH} levels "
                                "(or refers to itself); flatten it")
    kind = type(value)
    if kind in _PLAIN:  # the common cases first: a save flattens its whole tree
        return {"value": value}
    if kind not in _CONTAINERS:  # nothing these exact types are is an array or refused
        leaf = _leaf(name, value, read)
        if leaf is not None:
            return {"array": add_array(*leaf)}
        _refuse_subclass(name, value)
    if isinstance(value, dict):
        return _flatten_dict(name, value, add_array, depth, read)
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [flatten(f"{name}/{i}", v, add_array, depth + 1, read)
                                        for i, v in enumerate(value)]}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise ArgumentTypeError(f"array {name!r}: {kind_of(value)} cannot be saved without "
                            "pickle; save arrays, tensors, numbers, strings, and dicts/lists "
                            "of them")


def _flatten_dict(name: str, value: dict, add_array: Callable[[np.ndarray, dict], int],
                  depth: int, read: bool = True) -> dict[str, Any]:
    items = []
    for key, item in value.items():
        if type(key) not in (str, int):
            raise ArgumentTypeError(f"array {name!r}: key {key!r} is a {type(key).__name__}; "
                                    "only str and int keys can be saved without pickle")
        items.append([key, type(key).__name__,
                      flatten(f"{name}/{key}", item, add_array, depth + 1, read)])
    return {"odict" if type(value) is OrderedDict else "dict": items}


_TORCH_VIEWS = {"int8": 1, "int16": 2, "int32": 4, "int64": 8}


def _torch_dtype(torch, info: dict[str, Any], host: np.ndarray):
    """The torch dtype a torch leaf was saved with; ValueError unless it is
    one whose bits the saved host array holds."""
    name = info.get("torch_dtype")
    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"torch_dtype {name!r} is not a torch dtype")
    if dtype.itemsize != host.dtype.itemsize:
        raise ValueError(f"torch_dtype {name} has {dtype.itemsize}-byte elements, the saved "
                         f"array {host.dtype.itemsize}-byte ones")
    return dtype


def _import(kind: str):
    try:
        return __import__({"torch": "torch", "jax": "jax.numpy"}[kind], fromlist=["_"])
    except ImportError:
        raise ValueError(f"the array was saved from {kind}; install {kind} to read it") from None


def _restore_leaf(host: np.ndarray, info: dict[str, Any], cupy) -> Any:
    kind = info.get("kind")
    if kind == "torch":
        torch = _import("torch")
        view = info.get("torch_view")
        if view is not None and _TORCH_VIEWS.get(view) != host.dtype.itemsize:
            raise ValueError(f"torch_view {view!r} does not fit a {host.dtype} array")
        # A freshly read array is writable and owned: no copy needed.
        tensor = torch.from_numpy(host if host.flags.writeable else host.copy())
        if view is not None:
            tensor = tensor.view(_torch_dtype(torch, info, host))
        return _as_trained(torch, tensor, info)
    extension = _ml_dtype(info, host)
    if extension is not None:
        host = host.view(extension)
    if kind == "cupy" and cupy is not None:
        return cupy.asarray(host)
    if kind == "jax":
        return _import("jax").asarray(host)
    if info.get("scalar") is True:
        if host.shape != ():
            raise ValueError(f"a scalar saved with shape {host.shape}")
        return host[()]
    return host


def _as_trained(torch, tensor: Any, info: dict[str, Any]) -> Any:
    """The tensor as an ``nn.Parameter`` and with ``requires_grad`` where it
    was saved so (``_trained``)."""
    grad = info.get("requires_grad", False)
    if not isinstance(grad, bool) or not isinstance(info.get("parameter", False), bool):
        raise ValueError("requires_grad and parameter must be true or false")
    if info.get("parameter"):
        return torch.nn.Parameter(tensor, requires_grad=grad)
    return tensor.requires_grad_(True) if grad else tensor


def restore_leaf(host: np.ndarray, info: Any, cupy=None) -> Any:
    """The array a leaf was saved as (NumPy, torch, CuPy, JAX); ValueError
    when ``info`` or the array cannot be turned back into it."""
    if not isinstance(info, dict):
        raise ValueError("array entry is not an object")
    try:
        return _restore_leaf(host, info, cupy)
    except ValueError:
        raise
    except (TypeError, RuntimeError, KeyError, AttributeError) as exc:
        # torch/jax refuse some dtypes and byte orders (e.g. big-endian).
        raise ValueError(f"cannot make a {info.get('kind')} array of "
                         f"{getattr(host, 'dtype', '?')}: {exc}") from None


class TreeError(ValueError):
    """A value tree that flatten() never writes; ``path`` says where in it."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path or '<top>'}: {what}")
        self.path, self.what = path, what


def _check_dict(body: Any, n_leaves: int, path: str, depth: int, kind: str = "dict") -> None:
    if not isinstance(body, list):
        raise TreeError(f"{path}.{kind}", "is not a list")
    for i, item in enumerate(body):
        where = f"{path}.{kind}[{i}]"
        if not isinstance(item, list) or len(item) != 3:
            raise TreeError(where, "is not a [key, key type, value] list")
        key, key_type, value = item
        if not (isinstance(key_type, str) and type(key) is _KEY_TYPES.get(key_type)):
            raise TreeError(where, f"key {str(key)[:40]!r} of type {str(key_type)[:20]!r} is "
                            "not a str or int key")
        check_tree(value, n_leaves, f"{where}[2]", depth + 1)


def _check_leaf(kind: str, body: Any, n_leaves: int, path: str) -> None:
    if kind == "array":
        if type(body) is not int or not 0 <= body < n_leaves:
            raise TreeError(f"{path}.array", f"index {str(body)[:40]} is not one of the "
                            f"{n_leaves} array files")
    elif kind == "float":
        if not (isinstance(body, str) and body in ("nan", "inf", "-inf")):
            raise TreeError(f"{path}.float", f"{str(body)[:40]!r} is not nan, inf or -inf")
    elif kind == "value":
        if body is not None and type(body) not in (bool, int, float, str):
            raise TreeError(f"{path}.value", "is not a number, string, bool or null")
    else:
        raise TreeError(path, f"unknown entry {str(kind)[:40]!r}")


def check_tree(tree: Any, n_leaves: int, path: str = "", depth: int = 0) -> None:
    """Raise TreeError unless ``tree`` is one flatten() writes, with array
    indexes below ``n_leaves`` and at most MAX_TREE_DEPTH levels deep."""
    if depth > MAX_TREE_DEPTH:
        raise TreeError(path, f"nested deeper than {MAX_TREE_DEPTH} levels")
    if not isinstance(tree, dict) or len(tree) != 1:
        raise TreeError(path, "is not a one-key object")
    (kind, body), = tree.items()
    if kind in ("dict", "odict"):
        _check_dict(body, n_leaves, path, depth, kind)
    elif kind in ("list", "tuple"):
        if not isinstance(body, list):
            raise TreeError(f"{path}.{kind}", "is not a list")
        for i, item in enumerate(body):
            check_tree(item, n_leaves, f"{path}.{kind}[{i}]", depth + 1)
    else:
        _check_leaf(kind, body, n_leaves, path)


def _build(tree: dict, leaf: Callable[[int], Any]) -> Any:
    (kind, body), = tree.items()
    if kind == "array":
        return leaf(body)
    if kind in ("dict", "odict"):
        pairs = ((key, _build(item, leaf)) for key, _key_type, item in body)
        return OrderedDict(pairs) if kind == "odict" else dict(pairs)
    if kind in ("list", "tuple"):
        items = [_build(item, leaf) for item in body]
        return items if kind == "list" else tuple(items)
    return float(body) if kind == "float" else body


def unflatten(tree: Any, leaves: list[np.ndarray], infos: list[dict], cupy=None,
              where: str = "") -> Any:
    """Rebuild a value from its JSON tree (never evaluating anything in it).

    Raises ValueError (a TreeError for the tree's shape) and nothing else,
    whatever ``tree`` and ``infos`` hold."""
    try:
        check_tree(tree, min(len(leaves), len(infos)))
    except TreeError as exc:
        raise TreeError(f"{where}{exc.path}", exc.what) from None

    def leaf(index: int) -> Any:
        try:
            return restore_leaf(leaves[index], infos[index], cupy)
        except ValueError as exc:
            raise ValueError(f"{where}{': ' if where else ''}array {index}: {exc}") from None

    return _build(tree, leaf)


def check(name: str, value: Any) -> None:
    """Raise the ArgumentTypeError (a TypeError) a save of ``value`` would
    raise, nothing copied: an asynchronous checkpoint checks its arrays on
    the training thread, so the call that passed them raises, as a
    synchronous one does."""
    flatten(name, value, lambda *_: 0, read=False)


def snapshot(value: Any) -> Any:
    """A private copy of ``value`` (arrays copied where they live, on the GPU
    for GPU arrays), so training may go on while a background save writes it."""
    module = type(value).__module__
    if isinstance(value, np.ndarray):
        return value.copy(order="K")  # its layout kept: a synchronous save writes it as is
    if module.startswith("cupy"):
        return value.copy()
    if module.startswith("torch") and hasattr(value, "detach"):
        copy = value.detach().clone()  # a Parameter's flags kept for the save
        if _is_parameter(value):
            return type(value)(copy, requires_grad=value.requires_grad)
        return copy.requires_grad_(True) if value.requires_grad else copy
    # only the containers a save keeps are rebuilt (an OrderedDict stays one);
    # any other subclass is handed on as it is, for the save to refuse by name
    if type(value) in (dict, OrderedDict):
        return type(value)((k, snapshot(v)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(snapshot(v) for v in value)
    return value  # scalars, NumPy scalars and JAX arrays are immutable


def leaf_indexes(tree: Any, n_leaves: int) -> list[int]:
    """The array files a value's tree uses (checked first, as unflatten does)."""
    check_tree(tree, n_leaves)
    found: list[int] = []
    _build(tree, found.append)
    return found
