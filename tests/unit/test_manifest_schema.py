"""The manifest schema and the bounded parsers under it (safe_json, npy,
arrays.check_tree, protowire's typed getters), without DALI or files."""

from __future__ import annotations

import copy
import io
import itertools
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dvc_dali.format import arrays, manifest_schema, npy, safe_json
from dvc_dali.dali import protowire
from dvc_dali.core.errors import CheckpointCorruptError, CheckpointFormatError

# A manifest.json as dvc-dali 0.1.0 (format_version 1) wrote it: a DALI
# pipeline, a torch bfloat16 leaf, int keys, a tuple with inf, no dynamic state.
TODAY = json.loads(
    '{"array_files":[{"device":"cpu","dtype":"<i2","file":"arrays/00000.npy","kind":"torch","'
    'shape":[2],"torch_dtype":"bfloat16","torch_view":"int16"},{"device":"cpu","dtype":"<f8",'
    '"file":"arrays/00001.npy","kind":"numpy","shape":[4]}],"arrays":{"misc":{"tuple":[{"floa'
    't":"inf"},{"value":null},{"value":"x"},{"value":true}]},"opt":{"dict":[["state","str",{"'
    'dict":[[0,"int",{"dict":[["m","str",{"array":0}]]}]]}],["groups","str",{"list":[{"dict":'
    '[["lr","str",{"value":0.1}],["params","str",{"list":[{"value":0}]}]]}]}]]},"w":{"array":'
    '1}},"created":"2026-11-23T19:41:41+0000","dynamic":{},"files":{"arrays/00000.npy":{"md5"'
    ':"68dcc7e3a7b81d8d1a6f5c407cfe22ec","size":132},"arrays/00001.npy":{"md5":"6d0ba80c528c4'
    '889e600092167eef96f","size":160},"pipelines/00000.dali":{"md5":"e3d79e0dc6a3dad098af9bc8'
    '4bb0f969","size":347}},"format":"dvc-dali-checkpoint","format_version":1,"metadata":{"lr'
    '":0.1},"pipelines":{"train":{"description":{"batch_size":4,"data":{"reader.file_root":"f'
    'cbc399630b76bf74c757c5ecf569a8ca91d1b25"},"operators":{"__Image_0":{"args":{"device":"cp'
    'u","output_type":0},"inputs":["reader[0]"],"type":"decoders__Image"},"__Rotate_1":{"args'
    '":{"device":"cpu","fill_value":0.0,"keep_size":true},"inputs":["__Image_0","angle"],"typ'
    'e":"Rotate"},"angle":{"args":{"device":"cpu","range":[-45.0,45.0]},"inputs":[],"type":"r'
    'andom__Uniform"},"crop":{"args":{"device":"cpu","size":[16,16]},"inputs":["__Rotate_1"],'
    '"type":"RandomResizedCrop"},"reader":{"args":{"device":"cpu","file_root":"/data/images",'
    '"num_shards":1,"random_shuffle":true,"shard_id":0},"inputs":[],"type":"readers__File"}},'
    '"seed":7},"epoch_idx":0,"file":"pipelines/00000.dali","fingerprint":"fe5a2e86c582ef1d009'
    'c8aa4d37ba6feb6421b23","iter":1}},"rank":null,"run":{"params":{"lr":0.1},"total_steps":1'
    '0},"step":1,"versions":{"dali":"2.4.0","dvc_dali":"0.1.0","numpy":"2.4.6","python":"3.11'
    '.7"}}'
)
WHERE = "ckpt/step-000000001-0badcafe/manifest.json"


def check(manifest) -> None:
    manifest_schema.validate(manifest, WHERE)


def edited(path: str, value=None, delete: bool = False) -> dict:
    """TODAY with the field at ``path`` (dotted, [i] for list items) set or deleted."""
    manifest = copy.deepcopy(TODAY)
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    node = manifest
    for part in parts[:-1]:
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    last = parts[-1]
    last = int(last[1:-1]) if last.startswith("[") else last
    if delete:
        del node[last]
    else:
        node[last] = value
    return manifest


def test_todays_manifest_is_valid():
    assert manifest_schema.validate(copy.deepcopy(TODAY), WHERE) == TODAY


@pytest.mark.parametrize("value", [-5, True, 1.0, None, "1", 2 ** 64, [], {}])
def test_step_must_be_a_non_negative_int(value):
    with pytest.raises(CheckpointCorruptError, match=re.escape(f"{WHERE}: field 'step' is ")):
        check(edited("step", value))


BAD_FIELDS = [
    # (path, value, field named in the message)
    ("array_files[1].shape", [4, -1], "array_files[1].shape[1]"),
    ("array_files[1].shape", [4.0], "array_files[1].shape[0]"),
    ("array_files[1].shape", [True], "array_files[1].shape[0]"),
    ("array_files[1].shape", "4", "array_files[1].shape"),
    ("array_files[1].dtype", "|O", "array_files[1].dtype"),
    ("array_files[1].dtype", "<U0", "array_files[1].dtype"),
    ("array_files[1].dtype", "float64", "array_files[1].dtype"),
    ("array_files[1].kind", "pickle", "array_files[1].kind"),
    ("array_files[1].file", "../x.npy", "array_files[1].file"),
    ("array_files[1].file", "arrays/00009.npy", "array_files[1].file"),
    ("array_files[1].file", "pipelines/00000.dali", "array_files[1].file"),
    ("array_files[0].torch_dtype", "load", "array_files[0].torch_dtype"),  # no torch dtype
    ("array_files[0].torch_dtype", "torch.load()", "array_files[0].torch_dtype"),
    ("array_files[0].torch_view", "float32", "array_files[0].torch_view"),
    ("array_files[0].torch_view", [], "array_files[0].torch_view"),  # unhashable: found by fuzz
    ("array_files[0].torch_view", {"a": 1}, "array_files[0].torch_view"),
    ("array_files[1]", [], "array_files[1]"),
    ("array_files", {}, "array_files"),
    ("files.pipelines/00000.dali.md5", "x" * 32, "files['pipelines/00000.dali'].md5"),
    ("files.pipelines/00000.dali.size", -1, "files['pipelines/00000.dali'].size"),
    ("files.pipelines/00000.dali.size", 1e308, "files['pipelines/00000.dali'].size"),
    ("files.pipelines/00000.dali", None, "files['pipelines/00000.dali']"),
    ("pipelines.train.file", None, "pipelines.train.file"),
    ("pipelines.train.iter", "1", "pipelines.train.iter"),
    ("pipelines.train.epoch_idx", True, "pipelines.train.epoch_idx"),
    ("pipelines.train.description.operators.crop.args", [],
     "pipelines.train.description.operators.crop.args"),
    ("array_files[0].torch_dtype", None, "array_files[0].torch_dtype"),
    ("pipelines.train.description", [], "pipelines.train.description"),
    ("pipelines.train.description.operators.crop", {"args": {}, "inputs": []},
     "pipelines.train.description.operators.crop.type"),
    ("pipelines.train.description.operators.crop.inputs", [0],
     "pipelines.train.description.operators.crop.inputs[0]"),
    ("pipelines.train.description.seed", "7", "pipelines.train.description.seed"),
    ("pipelines.train", 0, "pipelines.train"),
    ("dynamic", [], "dynamic"),
    ("dynamic.d", {"file": "dynamic/00000.json"}, "dynamic.d.file"),
    ("metadata", None, "metadata"),
    ("run", [], "run"),
    ("run.params", "lr=0.1", "run.params"),
    ("run.total_steps", -1, "run.total_steps"),
    ("run.total_steps", True, "run.total_steps"),
    ("run.total_steps", float("inf"), "run.total_steps"),
    ("rank", 0, "rank"),
    ("rank", {"rank": 2, "world_size": 2}, "rank.rank"),
    ("rank", {"rank": 0, "world_size": 0}, "rank.world_size"),
    ("rank", {"rank": 0}, "rank.world_size"),
    ("versions.dali", 2, "versions.dali"),
    ("created", {}, "created"),
    ("arrays.w", {"array": 2}, "arrays.w.array"),
    ("arrays.w", {"array": True}, "arrays.w.array"),
    ("arrays.w", {"array": 1, "file": "x"}, "arrays.w"),
    ("arrays.misc.tuple[0].float", "1e308", "arrays.misc.tuple[0].float"),
    ("arrays.misc.tuple[1].value", [], "arrays.misc.tuple[1].value"),
    ("arrays.opt.dict[0]", ["state", "str"], "arrays.opt.dict[0]"),
    ("arrays.opt.dict[0][1]", "float", "arrays.opt.dict[0]"),
    ("arrays.opt.dict[0][0]", 5, "arrays.opt.dict[0]"),
]


@pytest.mark.parametrize("path,value,field", BAD_FIELDS, ids=[f"{p}={v!r}"[:50]
                                                              for p, v, _ in BAD_FIELDS])
def test_bad_field_names_file_and_field(path, value, field):
    manifest = _edit(path, value)
    if field is None:
        check(manifest)
        return
    with pytest.raises(CheckpointCorruptError) as err:
        check(manifest)
    assert str(err.value).startswith(f"{WHERE}: field {field!r} ")
    assert err.value.field == field
    assert "dvc-dali reset" in str(err.value)


def _edit(path: str, value) -> dict:
    """edited(), with file names (which hold dots) as one path part."""
    manifest = copy.deepcopy(TODAY)
    if path.startswith("files."):
        rest = path[len("files."):]
        name = next(n for n in manifest["files"] if rest.startswith(n))
        sub = rest[len(name) + 1:]
        if sub:
            manifest["files"][name][sub] = value
        else:
            manifest["files"][name] = value
        return manifest
    if path.startswith("dynamic."):
        manifest["dynamic"]["d"] = value
        return manifest
    return edited(path, value)


@pytest.mark.parametrize("field", ["step", "files", "pipelines", "arrays", "array_files",
                                   "dynamic", "metadata"])
def test_required_fields(field):
    with pytest.raises(CheckpointCorruptError, match=f"field '{field}' is missing"):
        check(edited(field, delete=True))


@pytest.mark.parametrize("field", ["run", "rank", "created", "versions"])
def test_optional_fields(field):
    check(edited(field, delete=True))


@pytest.mark.parametrize("path", ["array_files[1].kind", "array_files[1].device",
                                  "pipelines.train.description.operators.crop.inputs",
                                  "pipelines.train.description.operators.crop.args",
                                  "pipelines.train.fingerprint", "pipelines.train.iter"])
def test_optional_entry_fields(path):
    check(edited(path, delete=True))


def test_run_may_be_empty_and_total_steps_null():
    check(edited("run", {}))
    check(edited("run.total_steps", None))


def test_paths_cannot_leave_the_snapshot():
    manifest = copy.deepcopy(TODAY)
    manifest["files"]["../../etc/passwd"] = manifest["files"].pop("arrays/00001.npy")
    with pytest.raises(CheckpointCorruptError, match="paths stay inside the snapshot"):
        check(manifest)


@pytest.mark.parametrize("version,error", [
    (5, CheckpointFormatError), (0, CheckpointCorruptError), ("1", CheckpointCorruptError),
    (True, CheckpointCorruptError), (1.0, CheckpointCorruptError),
    (None, CheckpointCorruptError)])
def test_format_version(version, error):
    with pytest.raises(error, match="format_version"):
        check(edited("format_version", version))


def _with_digests(version: int, entry: dict) -> dict:
    manifest = copy.deepcopy(TODAY)
    manifest["format_version"] = version
    manifest["files"]["pipelines/00000.dali"] = {"size": 347, **entry}
    return manifest


@pytest.mark.parametrize("version,entry,bad", [
    (2, {"crc32": "0badcafe"}, None),  # format 2: a CRC-32, what reads check
    (2, {"md5": "e3d79e0dc6a3dad098af9bc84bb0f969"}, None),
    (2, {"crc32": "0badcafe", "md5": "e3d79e0dc6a3dad098af9bc84bb0f969"}, None),  # recorded
    (1, {"crc32": "0badcafe"}, "expected an md5 (format 1)"),  # format 1 had md5 only
    (1, {"crc32": "0badcafe", "md5": "e3d79e0dc6a3dad098af9bc84bb0f969"}, "format 1"),
    (2, {}, "holds digest(s) none"),
    (2, {"crc32": "0BADCAFE"}, "8 lowercase hex digits"),
    (2, {"crc32": "badcafe"}, "8 lowercase hex digits"),
    (2, {"crc32": 195951310}, "8 lowercase hex digits"),
    (2, {"crc32": "0badcafe", "md5": "x" * 32}, "32 lowercase hex digits"),
    (2, {"sha256": "0" * 64}, "holds digest(s) none"),
])
def test_member_digests(version, entry, bad):
    manifest = _with_digests(version, entry)
    if bad is None:
        check(manifest)
        assert manifest_schema.digest_name(manifest["files"]["pipelines/00000.dali"]) == (
            "crc32" if "crc32" in entry else "md5")  # the faster one is read
        return
    with pytest.raises(CheckpointCorruptError, match=re.escape(bad)) as info:
        check(manifest)
    assert "files['pipelines/00000.dali']" in str(info.value)


@pytest.mark.parametrize("manifest", [[], None, 0, "x", {"format": "orbax"}])
def test_foreign_document(manifest):
    with pytest.raises(CheckpointFormatError, match="not a dvc-dali manifest"):
        check(manifest)


def test_odd_names_are_quoted_in_field_paths():
    manifest = copy.deepcopy(TODAY)
    manifest["arrays"]["layer 1/w"] = {"array": 7}
    with pytest.raises(CheckpointCorruptError, match=re.escape("field \"arrays['layer 1/w']"
                                                               ".array\"")):
        check(manifest)


def test_deep_arrays_tree():
    tree = {"array": 0}
    for _ in range(arrays.MAX_TREE_DEPTH + 1):
        tree = {"list": [tree]}
    with pytest.raises(CheckpointCorruptError, match="nested deeper than 64"):
        check(edited("arrays.w", tree))


# -- safe_json ---------------------------------------------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(alphabet=st.sampled_from('[]{}"\\ab\u00e9\n')),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(alphabet='[]{}"\\a'), inner, max_size=3),
                    max_leaves=20)


def reference_depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(reference_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(reference_depth, value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None, database=None)
@given(JSON, st.booleans())
def test_depth_is_exact(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=None if ascii_only else 1)
    assert safe_json.depth(text.encode()) == reference_depth(value)
    assert safe_json.loads(text, where="x") == value


def test_depth_limit_refuses_before_parsing():
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(CheckpointCorruptError, match="x.json: JSON nested 100000 levels deep"):
        safe_json.loads(deep, where="x.json")
    ok = b"[" * 256 + b"]" * 256
    assert safe_json.depth(ok) == 256
    safe_json.loads(ok, where="x.json")
    with pytest.raises(CheckpointCorruptError, match="more than the 10"):
        safe_json.loads(b'{"a":' * 11 + b"1" + b"}" * 11, where="x", max_depth=10)


def test_brackets_in_strings_do_not_count():
    text = json.dumps({"a": "[[[[" * 1000, "b": "\\" * 3 + '"]]' + "{" * 500})
    assert safe_json.depth(text.encode()) == 1


@pytest.mark.parametrize("data", [b"{not json", b"\xff\xfe{}", b"", b"[1]x", b"1" * 5000,
                                  "\ud800".encode("utf-8", "surrogatepass")])
def test_invalid_json(data):
    with pytest.raises(CheckpointCorruptError, match="x: not valid JSON"):
        safe_json.loads(data, where="x")


def test_constants():
    assert safe_json.loads(b"[Infinity]", where="x") == [float("inf")]
    with pytest.raises(CheckpointCorruptError, match="Infinity is not a JSON number"):
        safe_json.loads(b"[Infinity]", where="x", allow_constants=False)


# -- npy -----------------------------------------------------------------------
def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def npy_read(data: bytes, dtype: str, shape) -> np.ndarray:
    return npy.read(io.BytesIO(data), len(data), dtype, list(shape), _NoHash())


class _NoHash:
    def update(self, data) -> None:
        pass


@pytest.mark.parametrize("array", [
    np.arange(5.0), np.float32(2.5), np.zeros((0, 3)), np.asfortranarray(np.ones((3, 4))),
    np.arange(3, dtype=">i4"), np.array([True, False]), np.array(["ab", "c"]),
    np.array([b"xy"]), np.zeros(2, dtype=[("a", "<f4"), ("b", "<i8", (2,))]),
    np.array(["2020-01-01"], dtype="M8[ns]"), np.ones((2, 2), np.complex64),
    np.zeros(tuple([1] * 32)),
], ids=lambda a: f"{np.asarray(a).dtype}{np.shape(a)}")
def test_npy_round_trip(array):
    array = np.asarray(array)
    back = npy_read(npy_bytes(array), array.dtype.str, array.shape)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes(order="A") == array.tobytes(order="A")
    assert back.flags.f_contiguous == array.flags.f_contiguous


def test_npy_md5_covers_every_byte():
    import hashlib

    data = npy_bytes(np.arange(100_000.0))
    md5 = hashlib.md5()
    npy.read(io.BytesIO(data), len(data), "<f8", [100_000], md5)
    assert md5.hexdigest() == hashlib.md5(data).hexdigest()


def with_header(header: str, data: bytes = b"", version: bytes = b"\x01\x00") -> bytes:
    raw = header.encode()
    size = len(raw).to_bytes(2 if version == b"\x01\x00" else 4, "little")
    return npy.MAGIC + version + size + raw + data


@pytest.mark.parametrize("data,dtype,shape,match", [
    (with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (10000000, 10000000), }",
                 b"\0" * 64), "<f8", [10**7, 10**7], "needs 800000000000000 data bytes"),
    (npy_bytes(np.arange(4.0)), "<f4", [4], "the manifest says <f4"),
    (npy_bytes(np.arange(4.0)), "<f8", [2, 2], "the manifest says <f8 shape \\(2, 2\\)"),
    (npy_bytes(np.arange(4.0)), ">f8", [4], "the manifest says >f8"),
    (with_header("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", b"\0" * 8),
     "|O", [1], "is not a dtype"),
    (with_header("{'descr': [('a', '|O')], 'fortran_order': False, 'shape': (1,), }",
                 b"\0" * 8), "|V8", [1], "Python objects"),
    (with_header("{'descr': __import__('os').system('x'), 'fortran_order': False, "
                 "'shape': (1,), }"), "<f8", [1], "is not a dtype"),
    (with_header("{'descr': [" * 300 + "]" * 300 + ", 'fortran_order': False, "
                 "'shape': (1,), }"), "<f8", [1], "is not a dtype"),
    (with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (" + "1, " * 65 + "), }"),
     "<f8", [1] * 65, "at most 64"),
    (with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (-1,), }"), "<f8", [1],
     "not the dict NumPy writes"),
    (with_header("{'descr': '<f8', 'fortran_order': 0, 'shape': (1,), }"), "<f8", [1],
     "not the dict NumPy writes"),
    (with_header("{'descr': '<V0', 'fortran_order': False, 'shape': (10000000,), }"), "<V0",
     [10**7], "zero-size"),
    (npy.MAGIC + b"\x02\x00" + (1 << 30).to_bytes(4, "little"), "<f8", [1], "more than"),
    (npy.MAGIC + b"\x09\x00\x10\x00", "<f8", [1], "version 9.0"),
    (b"not an npy file at all", "<f8", [1], "magic"),
    (b"", "<f8", [1], "magic"),
])
def test_npy_refused_before_allocating(data, dtype, shape, match):
    with pytest.raises(npy.NpyError, match=match):
        npy_read(data, dtype, shape)


def test_npy_short_read_is_noticed():
    data = npy_bytes(np.arange(4.0))
    with pytest.raises(npy.NpyError, match="changed while read"):
        npy.read(io.BytesIO(data[:-8]), len(data), "<f8", [4], _NoHash())


# -- arrays.unflatten on any tree -----------------------------------------------
ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                   | st.text(max_size=5) | st.sampled_from(["array", "dict", "list", "tuple",
                                                            "float", "value", "str", "int",
                                                            "nan", "inf"]),
                   lambda inner: st.lists(inner, max_size=4)
                   | st.dictionaries(st.sampled_from(["array", "dict", "list", "tuple", "float",
                                                      "value", "x"]) | st.text(max_size=3),
                                     inner, max_size=2),
                   max_leaves=30)
INFOS = st.lists(st.fixed_dictionaries({}, optional={
    "kind": st.sampled_from(["numpy", "torch", "jax", "cupy", "x"]) | ANY,
    "torch_dtype": st.sampled_from(["float32", "bfloat16", "load", "nn", "int16"]) | ANY,
    "torch_view": st.sampled_from([None, "int16", "int32", "int8"]) | ANY}) | ANY, max_size=3)


@settings(max_examples=300, deadline=None, database=None)
@given(ANY, INFOS)
def test_unflatten_raises_only_value_error(tree, infos):
    leaves = [np.arange(4, dtype=np.int16), np.arange(3, dtype=">f8"),
              np.array(["x"])][:len(infos)]
    try:
        arrays.unflatten(tree, leaves, infos, None, "w")
    except ValueError:
        pass


def test_unflatten_deep_and_cyclic_trees():
    tree: dict = {"array": 0}
    for _ in range(10_000):
        tree = {"list": [tree]}
    with pytest.raises(ValueError, match="nested deeper"):
        arrays.unflatten(tree, [], [])
    loop: dict = {"list": []}
    loop["list"].append(loop)
    with pytest.raises(ValueError, match="nested deeper"):
        arrays.unflatten(loop, [], [])


def test_flatten_refuses_what_unflatten_would():
    value: list = []
    node = value
    for _ in range(arrays.MAX_TREE_DEPTH):
        node.append([])
        node = node[0]
    arrays.flatten("ok", value, lambda host, info: 0)
    node.append([])
    with pytest.raises(TypeError, match="nested deeper than 64"):
        arrays.flatten("deep", value, lambda host, info: 0)


def test_torch_leaf_checks():
    torch = pytest.importorskip("torch")
    host = np.arange(4, dtype=np.int16)
    info = {"kind": "torch", "torch_dtype": "bfloat16", "torch_view": "int16"}
    assert arrays.unflatten({"array": 0}, [host], [info]).dtype == torch.bfloat16
    for bad in ({**info, "torch_dtype": "load"}, {**info, "torch_dtype": "float32"},
                {**info, "torch_view": "int32"}, {**info, "torch_dtype": 5}):
        with pytest.raises(ValueError):
            arrays.unflatten({"array": 0}, [host], [bad])
    with pytest.raises(ValueError, match="array 0: .*byte order"):
        arrays.unflatten({"array": 0}, [np.arange(3, dtype=">f8")], [{"kind": "torch"}])


# -- how an array's bytes are viewed: dtype, kind, torch_dtype, torch_view agree --
def torch_entry(index: int = 0, **fields) -> dict:
    """TODAY with array_files[index]'s keys in ``drop`` deleted, ``fields`` set."""
    manifest = copy.deepcopy(TODAY)
    entry = manifest["array_files"][index]
    for name in fields.pop("drop", ()):
        del entry[name]
    entry.update(fields)
    return manifest


BF16 = {"torch_dtype": "bfloat16", "torch_view": "int16", "dtype": "<i2"}
DISAGREE = [
    # (array_files[0] fields, the field named) - what a hand or a bug may write
    ({**BF16, "torch_view": None}, "torch_view"),  # issue 28.8: bfloat16 read as int16
    ({"torch_dtype": "bfloat16", "dtype": "<i2", "drop": ["torch_view"]}, "torch_view"),
    ({**BF16, "torch_view": "int32"}, "torch_view"),  # view size != element size
    ({**BF16, "torch_view": "int8"}, "torch_view"),
    ({**BF16, "torch_view": "float16"}, "torch_view"),  # not an integer view
    ({**BF16, "dtype": "<f2"}, "dtype"),  # the bits are saved as int16
    ({**BF16, "dtype": "<u2"}, "dtype"),
    ({**BF16, "dtype": "<i4"}, "dtype"),
    ({"torch_dtype": "float8_e4m3fn", "torch_view": None, "dtype": "|i1"}, "torch_view"),
    ({"torch_dtype": "float8_e5m2", "torch_view": "int16", "dtype": "<i2"}, "torch_view"),
    ({"torch_dtype": "complex32", "torch_view": None, "dtype": "<c8"}, "torch_view"),
    ({"torch_dtype": "complex32", "torch_view": "int32", "dtype": "<c8"}, "dtype"),
    ({"torch_dtype": "float32", "torch_view": "int16", "dtype": "<i2"}, "torch_view"),
    ({"torch_dtype": "float32", "torch_view": None, "dtype": "<i4"}, "dtype"),
    ({"torch_dtype": "float32", "torch_view": None, "dtype": "<f8"}, "dtype"),
    ({"torch_dtype": "float16", "torch_view": None, "dtype": "<i2"}, "dtype"),
    ({"torch_dtype": "int64", "torch_view": None, "dtype": "<u8"}, "dtype"),
    ({"torch_dtype": "bool", "torch_view": None, "dtype": "|u1"}, "dtype"),
    ({"torch_dtype": "complex64", "torch_view": None, "dtype": "<f8"}, "dtype"),
    ({"torch_dtype": "load", "torch_view": None, "dtype": "<f4"}, "torch_dtype"),  # unknown
    ({"torch_dtype": "half", "torch_view": None, "dtype": "<f2"}, "torch_dtype"),  # an alias
    ({"torch_dtype": "bfloat17", "torch_view": "int16", "dtype": "<i2"}, "torch_dtype"),
    ({"drop": ["torch_dtype"], "torch_view": None, "dtype": "<i2"}, "torch_dtype"),
    ({**BF16, "kind": "numpy"}, "torch_dtype"),  # torch fields on another kind
    ({**BF16, "kind": "jax"}, "torch_dtype"),
]


@pytest.mark.parametrize("fields,field", DISAGREE, ids=[repr(f)[:60] for f, _ in DISAGREE])
def test_fields_that_view_the_bytes_must_agree(fields, field):
    with pytest.raises(CheckpointCorruptError) as err:
        check(torch_entry(0, **fields))
    assert err.value.field == f"array_files[0].{field}", str(err.value)
    assert str(err.value).startswith(f"{WHERE}: field 'array_files[0].{field}' ")


@pytest.mark.parametrize("fields", [{"torch_view": "int16"}, {"torch_dtype": "float64"},
                                    {"torch_view": None}])
def test_a_numpy_array_has_no_torch_fields(fields):
    with pytest.raises(CheckpointCorruptError, match=r"array_files\[1\]\.torch_.* only a torch"):
        check(torch_entry(1, **fields))


def test_every_torch_dtype_the_writer_saves_is_valid_and_comes_back():
    """The tables against the installed torch: each of its dtypes, saved by
    arrays.flatten's leaf writer, passes the check and comes back the same."""
    torch = pytest.importorskip("torch")
    names = [n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)
             and str(getattr(torch, n)) == f"torch.{n}"]
    assert set(names) == set(manifest_schema.TORCH_NUMPY) | set(manifest_schema.TORCH_BITS)
    for name in names:
        tensor = torch.empty(3, dtype=getattr(torch, name))
        host, info = arrays._torch_leaf(tensor)
        check(torch_entry(0, dtype=host.dtype.str, **info))
        assert arrays.restore_leaf(host, info).dtype == tensor.dtype, name


def test_every_combination_the_check_accepts_comes_back_as_its_torch_dtype():
    """The class, not the example: every torch_dtype x torch_view x dtype;
    whatever passes the check is restored as a tensor of its torch_dtype
    holding the saved bytes (torch is the oracle)."""
    torch = pytest.importorskip("torch")
    import warnings

    names = [*manifest_schema.TORCH_NUMPY, *manifest_schema.TORCH_BITS, "load", "half"]
    codes = ["|b1", "|u1", "|i1", "<i2", "<u2", "<f2", "<i4", "<u4", "<f4", "<c8", "<i8",
             "<u8", "<f8", "<c16"]
    accepted = 0
    for name, view, code in itertools.product(names, [None, *manifest_schema.TORCH_VIEWS],
                                              codes):
        info = {"kind": "torch", "torch_dtype": name, "torch_view": view, "device": "cpu"}
        try:
            check(torch_entry(0, dtype=code, **info))
        except CheckpointCorruptError:
            continue
        accepted += 1
        host = np.arange(3).astype(code)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex32, quantized: torch's own warnings
            tensor = arrays.restore_leaf(host, info)
        assert tensor.dtype == getattr(torch, name), (name, view, code)
        raw = tensor.view(getattr(torch, view)) if view else tensor
        assert raw.numpy().tobytes() == host.tobytes(), (name, view, code)
    assert accepted >= len(manifest_schema.TORCH_NUMPY) + len(manifest_schema.TORCH_BITS)


# -- protowire's typed getters ---------------------------------------------------
def test_protowire_typed_getters():
    msg = protowire.parse(b"\x0a\x03abc\x10\x05\x1a\x02\xff\xfe")
    assert protowire.first_text(msg, 1) == "abc" and protowire.first_int(msg, 2) == 5
    assert protowire.first_bytes(msg, 9, b"") == b""
    for get, number in ((protowire.first_bytes, 2), (protowire.first_int, 1),
                        (protowire.first_text, 3), (protowire.first_text, 9)):
        with pytest.raises(protowire.WireError):
            get(msg, number)


@pytest.mark.parametrize("digests, bad", [
    ([["uint8/0000aaaa/crc32:11111111", "float/0000aaaa/gwsum1:" + "1" * 16]], None),
    ([["uint8/0000aaaa/c11111111"], ["uint8/0000aaaa/g" + "1" * 16]], None),  # unnamed, older
    ([["failed:RuntimeError"], ["uint8/0000aaaa/crc32:11111111"]], None),  # its digest raised
    ([["uint8/0000aaaa/crc32:1111"]], "digests[0]"),  # too short
    ([["uint8/0000aaaa/Crc32:11111111"]], "digests[0]"),
    ([["failed:../etc"]], "digests[0]"),
    ([["uint8/0000aaaa/crc32:11111111", "failed:RuntimeError"]], "digests[0]"),  # whole batch
])
def test_batch_digests_name_their_algorithm(digests, bad):
    """A batch's digests (batch_digests.py): each output's algorithm named, the
    unnamed form older releases wrote, or a batch whose digest failed."""
    record = {"log": "2" * 32, "previous": "1" * 32, "digests": digests}
    manifest = edited("pipelines.train.batches", record)
    if bad is None:
        check(manifest)
    else:
        with pytest.raises(CheckpointCorruptError, match=re.escape(f"batches.{bad}")):
            check(manifest)
