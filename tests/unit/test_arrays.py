"""dvc_dali/format/arrays.py: a value saved with a checkpoint comes back as it went
in (types, key types, key order, dtypes, shapes, bits), through what a
checkpoint holds of it: a .npy file per array and JSON text for the tree and
the leaves' infos. What could not come back so is refused at save; a tree
that flatten() never writes is refused at read, saying where."""

from __future__ import annotations

import io
import json
import math
from collections import OrderedDict, defaultdict, namedtuple
from typing import Any

import numpy as np
import pytest

from dvc_dali.format import arrays


def save(value: Any) -> tuple[str, list[bytes], str]:
    """What a checkpoint holds of ``value``: the tree as JSON text, each
    array as .npy bytes, the arrays' infos as JSON text."""
    leaves: list[bytes] = []
    infos: list[dict] = []

    def add_array(host: np.ndarray, info: dict) -> int:
        buf = io.BytesIO()
        np.save(buf, host, allow_pickle=False)
        leaves.append(buf.getvalue())
        infos.append(info)
        return len(leaves) - 1

    tree = arrays.flatten("value", value, add_array)
    return json.dumps(tree, allow_nan=False), leaves, json.dumps(infos, allow_nan=False)


def load(saved: tuple[str, list[bytes], str]) -> Any:
    tree, leaves, infos = saved
    hosts = [np.load(io.BytesIO(data), allow_pickle=False) for data in leaves]
    return arrays.unflatten(json.loads(tree), hosts, json.loads(infos))


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (a dict's key types and
    order too); arrays equal in dtype, byte order, shape and bits; nan is nan."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if type(a).__module__.startswith("torch"):
        return (a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
                and _torch_bits(a) == _torch_bits(b))
    if isinstance(a, dict):
        return ([(type(k), k) for k in a] == [(type(k), k) for k in b]
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def _torch_bits(tensor) -> bytes:
    """A tensor's elements as bytes, whatever its dtype (bfloat16 has no NumPy one)."""
    import torch

    view = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().cpu().contiguous().view(view).numpy().tobytes()


def nested(levels: int) -> Any:
    """An array inside ``levels`` lists."""
    value: Any = np.arange(3)
    for _ in range(levels):
        value = [value]
    return value


def deep_tree(levels: int) -> dict:
    """The tree flatten() would write for nested(levels), were it allowed."""
    tree: dict = {"array": 0}
    for _ in range(levels):
        tree = {"list": [tree]}
    return tree


ROUND_TRIPS = {
    "float32, 2-d": np.arange(12, dtype=np.float32).reshape(3, 4),
    "Fortran order": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "big-endian int32": np.arange(3, dtype=">i4"),
    "every kind of dtype": {name: np.arange(4).astype(name) for name in (
        "bool", "int8", "uint16", "int64", "uint64", "float16", "float64", "complex64",
        "<U3", "S2", "datetime64[s]", "timedelta64[ms]")},
    "0-d array stays an array": np.array(2.5),
    "empty array": np.zeros((0, 3), np.int16),
    "NumPy scalars stay scalars": [np.float64(1.5), np.int32(-7), np.bool_(True),
                                   np.complex128(1 - 2j)],
    "plain values": {"none": None, "true": True, "int": -3, "big": 2 ** 70, "str": "x",
                     "float": 0.1, "empty": ""},
    "nan and infinities": [float("nan"), float("inf"), float("-inf"), -0.0],
    "int and str keys kept apart": {0: "int zero", "0": "str zero", -5: np.ones(2)},
    "an optimizer's state_dict": {
        "state": {0: {"step": np.int64(3), "exp_avg": np.zeros(3, np.float32)},
                  1: {"step": np.int64(3), "exp_avg": np.ones((2, 2), np.float32)}},
        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1]}]},
    "OrderedDict keeps its type and order": OrderedDict([("b", np.ones(2)), ("a", 1),
                                                         ("c", OrderedDict())]),
    "tuples and lists": ([1, (2, [3])], (), [], ((),)),
    "the same array twice": [np.arange(2)] * 2,
    "64 levels deep, the limit": nested(arrays.MAX_TREE_DEPTH),
}


@pytest.mark.parametrize("value", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_round_trip(value):
    back = load(save(value))
    assert same(back, value), (back, value)
    assert same(load(save(back)), value)  # and again, from what came back


def test_the_same_check_tells_what_a_round_trip_could_lose():
    """The comparison the table relies on is not blind to what matters."""
    value = ROUND_TRIPS["an optimizer's state_dict"]
    assert same(value, value)
    for changed in (np.arange(3, dtype=">i8"), np.arange(3.0), np.arange(3).reshape(3, 1),
                    [0, 1, 2], (0, 1, 2), np.int64(0)):
        assert not same(changed, np.arange(3)), changed
    assert not same({1: 0}, {"1": 0}) and not same({"a": 0, "b": 0}, {"b": 0, "a": 0})
    assert not same(OrderedDict(a=0), {"a": 0}) and not same(1, True)
    assert not same(float("nan"), 0.0) and same(float("nan"), float("nan"))


def test_each_array_is_one_file_in_order_and_leaf_indexes_finds_them():
    value = {"a": np.zeros(1), "b": [np.ones(2), {"c": np.full(3, 2)}], "d": 1}
    tree, leaves, _ = save(value)
    assert len(leaves) == 3
    assert arrays.leaf_indexes(json.loads(tree), len(leaves)) == [0, 1, 2]
    with pytest.raises(arrays.TreeError, match="not one of the 2 array files"):
        arrays.leaf_indexes(json.loads(tree), 2)


def test_torch_tensors_come_back_as_tensors_with_their_dtype_and_bits():
    torch = pytest.importorskip("torch")
    state = OrderedDict([
        ("bf16", torch.linspace(-2, 2, 6, dtype=torch.bfloat16)),  # no NumPy dtype: its bits
        ("f16", torch.tensor([1.5, -0.0, float("inf")], dtype=torch.float16)),
        ("f32", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
        ("i64", torch.arange(3)),
        ("bool", torch.tensor([True, False])),
        # found by a sweep: both came back plain tensors, which a resumed optimizer
        # never updated (a learned value kept in arrays stopped training)
        ("grad", torch.ones(2, requires_grad=True)),
        ("parameter", torch.nn.Parameter(torch.full((2,), 0.5))),
        ("frozen_parameter", torch.nn.Parameter(torch.zeros(1), requires_grad=False)),
        ("non_contiguous", torch.arange(6.0).reshape(2, 3).t()),
    ])
    tree, leaves, infos = save({"model": state})
    assert [i["torch_view"] for i in json.loads(infos)] == [
        "int16", None, None, None, None, None, None, None, None]
    for value in (load((tree, leaves, infos))["model"],  # and from an asynchronous snapshot
                  load(save({"model": arrays.snapshot(state)}))["model"]):
        assert type(value) is OrderedDict and list(value) == list(state)
        for name, tensor in state.items():
            got = value[name]
            assert type(got) is type(tensor) and got.dtype == tensor.dtype, name
            assert got.shape == tensor.shape and got.requires_grad == tensor.requires_grad, name
            assert _torch_bits(got.detach()) == _torch_bits(tensor.detach()), name


def test_a_quantized_tensor_is_refused_at_save_not_saved_without_its_scale():
    torch = pytest.importorskip("torch")
    q = torch.quantize_per_tensor(torch.tensor([0.5, -1.25]), 0.25, 10, torch.quint8)
    for check in (lambda v: save(v), lambda v: arrays.check("value", v)):
        with pytest.raises(TypeError, match="'value/q': a quantized tensor \\(torch.quint8\\) "
                                            "would come back without its scale and zero point"):
            check({"q": q})


@pytest.mark.parametrize("value,says", [
    (np.array([{"x": 1}], dtype=object), "holds Python objects"),
    (np.zeros(2, dtype=[]), "zero-size elements"),
    ({(1, 2): 0}, "key (1, 2) is a tuple"),
    ({1.5: 0}, "key 1.5 is a float"),
    ({True: 0}, "key True is a bool"),
    (namedtuple("Point", "x y")(1, 2), "a Point (a tuple subclass) would come back as a plain"),
    (defaultdict(list), "a defaultdict (a dict subclass) would come back as a plain dict"),
    (type("MyList", (list,), {})([1]), "a MyList (a list subclass)"),
    ({1, 2}, "a set cannot be saved without pickle"),
    (object(), "an object cannot be saved without pickle"),
    # found by a sweep: both came back plain ndarrays, the masked values as data
    (np.ma.array([1.0, -999.0], mask=[0, 1]), "a masked array would come back without its "
                                              "mask"),
    (np.matrix([[1, 2]]), "a matrix (an ndarray subclass) would come back as a plain ndarray"),
    # found by a sweep: NumPy's MemoryError in a copy, naming no array
    (np.broadcast_to(np.zeros(1, np.float32), (10**6, 10**6)),
     "a view of 4 bytes of memory that would be written as 4000000000000 bytes"),
    (np.broadcast_to(np.zeros(3), (10**5, 10**5, 3))[::2], "a view of 24 bytes of memory"),
], ids=["object dtype", "zero-size dtype", "tuple key", "float key", "bool key", "namedtuple",
        "defaultdict", "list subclass", "set", "object", "masked array", "matrix",
        "broadcast view", "strided broadcast view"])
def test_what_would_not_come_back_is_refused_at_save(value, says):
    with pytest.raises(TypeError) as err:
        save({"inner": value})
    assert says in str(err.value) and "'value/inner" in str(err.value), str(err.value)


def test_one_level_past_the_limit_is_refused():
    save(nested(arrays.MAX_TREE_DEPTH))
    with pytest.raises(TypeError, match="'value(/0)+': nested deeper than 64 levels"):
        save(nested(arrays.MAX_TREE_DEPTH + 1))


def test_a_value_that_refers_to_itself_is_refused_not_a_recursion_error():
    loop: list = []
    loop.append(loop)
    with pytest.raises(TypeError, match="refers to itself"):
        save(loop)


@pytest.mark.parametrize("tree,n_leaves,says", [
    ([], 0, "arrays.w: is not a one-key object"),
    ({"list": [], "tuple": []}, 0, "arrays.w: is not a one-key object"),
    ({"pickle": "x"}, 0, "arrays.w: unknown entry 'pickle'"),
    ({"array": 1}, 1, "arrays.w.array: index 1 is not one of the 1 array files"),
    ({"array": True}, 1, "arrays.w.array: index True is not one of the 1 array files"),
    ({"array": -1}, 1, "arrays.w.array: index -1 is not one of the 1 array files"),
    ({"float": "1e999"}, 0, "arrays.w.float: '1e999' is not nan, inf or -inf"),
    ({"value": [1]}, 0, "arrays.w.value: is not a number, string, bool or null"),
    ({"list": {}}, 0, "arrays.w.list: is not a list"),
    ({"dict": [["k", "str"]]}, 0, "arrays.w.dict[0]: is not a [key, key type, value] list"),
    ({"dict": [[1, "str", {"value": 0}]]}, 0,
     "arrays.w.dict[0]: key '1' of type 'str' is not a str or int key"),
    ({"odict": [["k", "float", {"value": 0}]]}, 0, "arrays.w.odict[0]: key 'k' of type 'float'"),
    ({"tuple": [{"list": [{"oops": 0}]}]}, 0, "arrays.w.tuple[0].list[0]: unknown entry 'oops'"),
    (deep_tree(arrays.MAX_TREE_DEPTH + 1), 1,
     "arrays.w" + ".list[0]" * (arrays.MAX_TREE_DEPTH + 1) + ": nested deeper than 64 levels"),
])
def test_a_tree_flatten_never_writes_is_refused_saying_where(tree, n_leaves, says):
    hosts = [np.zeros(1)] * n_leaves
    infos = [{"kind": "numpy", "device": "cpu"}] * n_leaves
    with pytest.raises(arrays.TreeError) as err:
        arrays.unflatten(tree, hosts, infos, where="arrays.w")
    assert str(err.value) == says or str(err.value).startswith(says), str(err.value)


def test_the_tree_limit_is_the_save_limit():
    hosts, infos = [np.arange(3)], [{"kind": "numpy", "device": "cpu"}]
    tree = deep_tree(arrays.MAX_TREE_DEPTH)
    assert json.loads(save(nested(arrays.MAX_TREE_DEPTH))[0]) == tree
    assert same(arrays.unflatten(tree, hosts, infos), nested(arrays.MAX_TREE_DEPTH))


@pytest.mark.parametrize("info,says", [
    (None, "array entry is not an object"),
    ({"kind": "numpy", "scalar": True}, "a scalar saved with shape (2,)"),
    ({"kind": "torch", "torch_dtype": "bfloat16", "torch_view": "int32"},
     "torch_view 'int32' does not fit a int16 array"),
    ({"kind": "torch", "torch_dtype": "float32", "torch_view": "int16"},
     "torch_dtype float32 has 4-byte elements, the saved array 2-byte ones"),
    ({"kind": "torch", "torch_dtype": "os.system", "torch_view": "int16"},
     "torch_dtype 'os.system' is not a torch dtype"),
], ids=["not a dict", "scalar of shape (2,)", "view of another size", "dtype of another size",
        "not a dtype name"])
def test_leaf_infos_that_do_not_fit_the_array_are_refused(info, says):
    if info and info["kind"] == "torch":
        pytest.importorskip("torch")
    with pytest.raises(ValueError) as err:
        arrays.restore_leaf(np.zeros(2, np.int16), info)
    assert says in str(err.value), str(err.value)


def test_snapshot_copies_arrays_so_training_may_go_on():
    torch = pytest.importorskip("torch")
    value = {"w": np.zeros(3), "t": torch.zeros(2), "nested": [np.ones(2), (np.ones(1),)],
             "n": 1}
    copy = arrays.snapshot(value)
    assert same(copy, value)
    value["w"] += 1
    value["t"] += 1
    value["nested"][0][:] = 5
    value["nested"][1][0][:] = 5
    assert same(copy, {"w": np.zeros(3), "t": torch.zeros(2),
                       "nested": [np.ones(2), (np.ones(1),)], "n": 1})
    assert same(load(save(copy)), copy)


def test_snapshot_keeps_what_a_save_would_keep_or_refuse():
    value = {"od": OrderedDict([("b", np.ones(2)), ("a", 1)])}
    assert same(load(save(arrays.snapshot(value))), value)
    for refused in (defaultdict(list), namedtuple("Point", "x y")(1, 2)):
        with pytest.raises(TypeError, match="would come back as a plain"):
            save(arrays.snapshot({"v": refused}))


def test_ml_dtypes_arrays_come_back_with_their_dtype_numpy_and_jax():
    """Found by a sweep: bfloat16, float8 and int4 arrays (JAX's and Keras's
    low precisions) came back as raw void bytes, or could not be read at all
    (float8_e5m2's '<f1', JAX's arrays: every row of such a run unreadable)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = {name: np.array([1.5, 2.0, 3.0], dtype=getattr(ml_dtypes, name))
              for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "int4", "uint4")}
    values["scalar"] = ml_dtypes.bfloat16(0.25)
    values["fortran"] = np.asfortranarray(np.arange(6.0).reshape(2, 3).astype(ml_dtypes.bfloat16))
    tree, leaves, infos = save(values)
    assert all(i["ml_dtype"] for i in json.loads(infos))
    back = load((tree, leaves, infos))
    assert same(back, values), back
    jnp = pytest.importorskip("jax.numpy")
    value = jnp.asarray([1.5, -2.0], dtype=jnp.bfloat16)
    got = load(save({"j": value}))["j"]
    assert type(got) is type(value) and got.dtype == value.dtype
    assert np.asarray(got).tobytes() == np.asarray(value).tobytes()


@pytest.mark.parametrize("info,says", [
    ({"kind": "numpy", "ml_dtype": "os.system"}, "is not a dtype name"),
    ({"kind": "numpy", "ml_dtype": "float128x"}, "is not a dtype of the installed ml_dtypes"),
    ({"kind": "numpy", "ml_dtype": "float32"}, "is not a dtype of the installed ml_dtypes"),
    ({"kind": "numpy", "ml_dtype": "bfloat16"}, "has 2-byte elements, the saved array is uint8"),
])
def test_an_ml_dtype_that_does_not_fit_the_bits_is_refused(info, says):
    pytest.importorskip("ml_dtypes")
    with pytest.raises(ValueError, match=says):
        arrays.restore_leaf(np.zeros(2, np.uint8), info)


def test_what_a_tensors_bytes_would_not_bring_back_is_refused_naming_it():
    """Found by a sweep: torch's or JAX's tracebacks naming no array (and, in
    an asynchronous save, raised by the next call only)."""
    torch = pytest.importorskip("torch")
    cases = {
        "a sparse_coo tensor would not come back": torch.eye(2).to_sparse(),
        "a sparse_csr tensor would not come back": torch.eye(2).to_sparse_csr(),
        "a nested tensor would not come back": torch.nested.nested_tensor(
            [torch.zeros(1), torch.zeros(2)]),
        "a view of 4 bytes of memory that would be written as": torch.zeros(1).expand(
            1 << 29),
    }
    for says, value in cases.items():
        for check in (save, lambda v: arrays.check("value", v)):
            with pytest.raises(TypeError, match=f"'value/t': {says}"):
                check({"t": value})
    conj = torch.tensor([1 + 2j]).conj()  # a lazy view: saved as its values
    assert torch.equal(load(save({"t": conj}))["t"], conj.resolve_conj())
    jax = pytest.importorskip("jax")
    for check in (save, lambda v: arrays.check("value", v)):
        with pytest.raises(TypeError, match="'value/k': a typed PRNG key"):
            check({"k": jax.random.key(0)})
