"""The one check of a manifest.json before anything uses it.

Every field is checked for type, range and required presence, so a manifest
edited by hand or by an attacker (digests recomputed) gives a
CheckpointCorruptError or CheckpointFormatError naming the file and the
field path (``manifest.json: field 'array_files[3].shape[1]' is -1, ...``)
instead of an AttributeError deep in the reader. Fields a reader never uses
(``metadata``, ``run.params``) may hold any JSON: their depth is bounded by
the parse (safe_json).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from . import arrays as arrays_mod
from ..core.errors import CheckpointCorruptError, CheckpointFormatError

FORMAT = "dvc-dali-checkpoint"
# 3: arrays smaller than PACK_BELOW share pack files (arrays/NNNNN.pack, an
# array at its "offset"); 2: a member file has a "crc32" (what reads check),
# and an "md5" too where DVC recorded it; 1: an "md5" only.
# 4: an array of an ml_dtypes dtype (bfloat16, float8, int4) is saved as its
# bits with the dtype's name ("ml_dtype"); written only by a checkpoint that
# holds one, so that a dvc-dali before it refuses that one (it would read the
# bits as unsigned integers) and reads every other.
FORMAT_VERSION = 4
WRITTEN_VERSION = 3  # what a checkpoint without such an array is written as
READABLE_VERSIONS = (1, 2, 3, 4)
# Each file of a snapshot costs a create, an fsync and later an unlink (about
# 0.2 ms of CPU each on ext4, more than writing 100 KB), and a model's state
# is mostly small tensors (biases, norms, optimizer steps): those share a pack.
PACK_BELOW = 1 << 20
PACK_MAX = 64 << 20  # a pack is read whole (its digest checked) for any array in it
FIX = ("restore an earlier checkpoint with `dvc exp apply <row>`, or start over with "
       "`dvc-dali reset`")
MEMBER_PATH = re.compile(r"^(pipelines/[0-9]{5}\.dali|arrays/[0-9]{5}\.(npy|pack)|"
                         r"dynamic/[0-9]{5}\.json)$")
MD5 = re.compile(r"^[0-9a-f]{32}$")
# A member file's digests (format 2: crc32, md5 or both; format 1: md5).
DIGESTS = {"md5": (MD5, "32 lowercase hex digits"),
           "crc32": (re.compile(r"^[0-9a-f]{8}$"), "8 lowercase hex digits")}
# What np.dtype(...).str gives: byte order, kind, item size, datetime unit.
DTYPE = re.compile(r"^[<>|][biufcmMSUV][0-9]{1,10}(\[[A-Za-z0-9]{1,8}\])?$")
_TORCH_DTYPE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KINDS = ("numpy", "cupy", "torch", "jax")
# How a torch tensor's bytes are saved (arrays._torch_leaf): a torch dtype
# NumPy has as that NumPy dtype (kind and size), torch_view null; any other
# as its bits, viewed as the signed integer of its size (torch_view "int16"
# for bfloat16). Every dtype torch 2.x has; a unit test checks the table
# against the installed torch.
TORCH_NUMPY = {"bool": "b1", "uint8": "u1", "int8": "i1", "int16": "i2", "uint16": "u2",
               "int32": "i4", "uint32": "u4", "int64": "i8", "uint64": "u8", "float16": "f2",
               "float32": "f4", "float64": "f8", "complex64": "c8", "complex128": "c16"}
TORCH_BITS = {"bfloat16": 2, "bits16": 2, "complex32": 4, "qint32": 4, **dict.fromkeys((
    "bits8", "bits1x8", "bits2x4", "bits4x2", "float4_e2m1fn_x2", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "qint8", "quint8",
    "quint2x4", "quint4x2", *(f"int{n}" for n in range(1, 8)),
    *(f"uint{n}" for n in range(1, 8))), 1)}
TORCH_VIEWS = {"int8": 1, "int16": 2, "int32": 4, "int64": 8}
_MAX_INT = (1 << 63) - 1  # file sizes, steps: what an off_t holds
_MAX_DIMS = 64


class ManifestError(CheckpointCorruptError):
    """A manifest field of the wrong type, out of range or missing."""

    def __init__(self, where: str, field: str, what: str) -> None:
        super().__init__(f"{where}: field {field!r} {what}: {FIX}")
        self.field = field


def key(path: str, name: Any) -> str:
    """``path.name`` or ``path['odd name']``: a field path a reader can follow."""
    if isinstance(name, int):
        return f"{path}[{name}]"
    if _NAME.match(name):
        return f"{path}.{name}" if path else name
    return f"{path}[{name[:60]!r}]"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Checker:
    """Field checks of one manifest; each failure names ``where`` and the field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, what: str) -> None:
        raise ManifestError(self.where, field, what)

    def get(self, obj: dict, path: str, name: str, required: bool = True) -> Any:
        field = key(path, name)
        if name not in obj:
            if required:
                self.fail(field, "is missing")
            return None
        return obj[name]

    def typed(self, value: Any, field: str, kind: type, what: str) -> Any:
        # bool is an int to Python, never to a manifest
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.fail(field, f"is {_show(value)}, expected {what}")
        return value

    def count(self, value: Any, field: str, minimum: int = 0) -> int:
        what = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
        self.typed(value, field, int, what)
        if not minimum <= value <= _MAX_INT:
            self.fail(field, f"is {_show(value)}, expected {what}")
        return value

    def text(self, value: Any, field: str, pattern: re.Pattern | None = None,
             what: str = "a string") -> str:
        self.typed(value, field, str, what)
        if pattern is not None and not pattern.match(value):
            self.fail(field, f"is {_show(value)}, expected {what}")
        return value

    def mapping(self, value: Any, field: str, each: Callable[[str, Any, str], None]
                | None = None) -> dict:
        self.typed(value, field, dict, "an object")
        if each is not None:
            for name, item in value.items():
                each(name, item, key(field, name))
        return value

    def member(self, value: Any, field: str, prefix: str, files: dict) -> str:
        """A file entry naming one of this snapshot's files of kind ``prefix``."""
        if not (isinstance(value, str) and MEMBER_PATH.match(value)
                and value.startswith(prefix)):
            self.fail(field, f"is {_show(value)}, not a {prefix}NNNNN file entry this format "
                      "writes (paths stay inside the snapshot)")
        if value not in files:
            self.fail(field, f"names {value!r}, which 'files' does not list")
        return value


def _check_header(manifest: Any, where: str) -> None:
    """format and format_version: a foreign or newer manifest is a format
    error (with its own fix), not corruption."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointFormatError(f"{where}: not a dvc-dali manifest (no \"format\": "
                                    f"\"{FORMAT}\"); point dvc-dali at its own checkpoint "
                                    "directory, or start over with `dvc-dali reset`")
    version = manifest.get("format_version")
    if type(version) is int and version > FORMAT_VERSION:
        raise CheckpointFormatError(f"{where}: format_version {version!r} is newer than this "
                                    f"dvc-dali reads ({FORMAT_VERSION}); upgrade dvc-dali "
                                    "(pip install -U dvc-dali)")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise ManifestError(where, "format_version", f"is {_show(version)}, expected "
                            f"one of {READABLE_VERSIONS}")


def digest_name(info: dict[str, Any]) -> str:
    """The digest a read checks in a validated ``files`` entry: the CRC-32
    where there is one (~8x faster than md5), else the md5."""
    return "crc32" if "crc32" in info else "md5"


def _check_files(c: _Checker, files: Any, version: int) -> None:
    def entry(name: str, info: Any, field: str) -> None:
        if not MEMBER_PATH.match(name):
            c.fail(field, "is not a file this format writes (paths stay inside the snapshot)")
        c.mapping(info, field)
        present = [d for d in DIGESTS if d in info]
        if (present != ["md5"]) if version == 1 else not present:
            c.fail(field, f"holds digest(s) {present or 'none'}, expected "
                   + ("an md5 (format 1)" if version == 1 else "a crc32, an md5 or both"))
        for digest in present:
            pattern, what = DIGESTS[digest]
            c.text(info[digest], key(field, digest), pattern, what)
        size = c.count(c.get(info, field, "size"), key(field, "size"))
        if name.endswith(".pack") and version < 3:
            c.fail(field, f"is a pack, which format {version} does not have")
        if name.endswith(".pack") and size > PACK_MAX:
            c.fail(key(field, "size"), f"is {size}, more than a pack holds ({PACK_MAX})")

    c.mapping(files, "files", entry)


def _check_run_and_rank(c: _Checker, manifest: dict) -> None:
    run = c.get(manifest, "", "run", required=False)
    if run is not None:
        c.mapping(run, "run")
        if "params" in run:
            c.mapping(run["params"], "run.params")
        total = run.get("total_steps")
        if total is not None:
            c.count(total, "run.total_steps")
    rank = c.get(manifest, "", "rank", required=False)
    if rank is not None:
        c.mapping(rank, "rank")
        size = c.count(c.get(rank, "rank", "world_size"), "rank.world_size", minimum=1)
        number = c.count(c.get(rank, "rank", "rank"), "rank.rank")
        if number >= size:
            c.fail("rank.rank", f"is {number}, not below world_size {size}")


def _check_description(c: _Checker, desc: Any, field: str) -> None:
    """What dali_state.differences() walks: operators with a type, args and inputs."""
    c.mapping(desc, field)

    def operator(name: str, op: Any, path: str) -> None:
        c.mapping(op, path)
        c.text(c.get(op, path, "type"), key(path, "type"))
        if "args" in op:
            c.mapping(op["args"], key(path, "args"))
        for i, item in enumerate(c.typed(op.get("inputs", []), key(path, "inputs"), list,
                                         "a list")):
            c.text(item, f"{key(path, 'inputs')}[{i}]")

    c.mapping(c.get(desc, field, "operators"), key(field, "operators"), operator)
    for name in ("batch_size", "seed"):
        if name in desc:
            c.typed(desc[name], key(field, name), int, "an integer")
    if "data" in desc:
        c.mapping(desc["data"], key(field, "data"),
                  lambda name, digest, path: c.text(digest, path))


def _check_pipelines(c: _Checker, pipelines: Any, files: dict) -> None:
    def entry(name: str, info: Any, field: str) -> None:
        c.mapping(info, field)
        c.member(c.get(info, field, "file"), key(field, "file"), "pipelines/", files)
        _check_description(c, c.get(info, field, "description"), key(field, "description"))
        if "fingerprint" in info:
            c.text(info["fingerprint"], key(field, "fingerprint"))
        # how the state was taken: pipe.checkpoint(), or a TF iterator's checkpoint
        if info.get("kind", "dali") not in ("dali", "tensorflow"):
            c.fail(key(field, "kind"), f"is {_show(info['kind'])}, expected dali or tensorflow")
        for counter in ("iter", "epoch_idx"):  # DALI's counters: any int
            if counter in info:
                c.typed(info[counter], key(field, counter), int, "an integer")
        if "contents" in info:  # optional: older manifests have none
            c.mapping(info["contents"], key(field, "contents"), lambda n, rec, path:
                      _check_contents(c, rec, path))
        if "serialized" in info:  # optional: the graph, for a replay (replay.py)
            c.text(info["serialized"], key(field, "serialized"), _BASE64, "base64 text")
        if "batches" in info:  # optional: older manifests have none
            _check_batches(c, info["batches"], key(field, "batches"))
        if "check_node" in info:  # a TF state with dvc-dali's check node (dali_tf.py)
            c.typed(info["check_node"], key(field, "check_node"), bool, "true or false")

    c.mapping(pipelines, "pipelines", entry)


_BASE64 = re.compile(r"^[A-Za-z0-9+/]{0,4000000}={0,2}$")
_LOG_ID = re.compile(r"^[0-9a-f]{32}$")
# an output's digest: its bytes' digest named by its algorithm (<name>:<hex>),
# or unnamed as dvc-dali wrote it before (c: CRC-32, g: the device sum; see
# batch_digests.LEGACY); a batch whose digest raised: ["failed:<exception type>"]
_BATCH_OUTPUT = re.compile(r"^[a-z0-9_]{1,24}/[0-9a-f]{8}/(?:[a-z0-9_]{1,16}:[0-9a-f]{8,64}|"
                           r"c[0-9a-f]{8}|g[0-9a-f]{16}|-)$")
_BATCH_FAILED = re.compile(r"^failed:[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _check_batches(c: _Checker, record: Any, field: str) -> None:
    """The digests of the batches after the previous checkpoint (batch_digests.py)."""
    c.mapping(record, field)
    c.text(c.get(record, field, "log"), key(field, "log"), _LOG_ID, "32 lowercase hex digits")
    previous = c.get(record, field, "previous")
    if previous is not None:
        c.text(previous, key(field, "previous"), _LOG_ID, "32 lowercase hex digits or null")
    batches = c.typed(c.get(record, field, "digests"), key(field, "digests"), list, "a list")
    for i, batch in enumerate(batches):
        where = f"{key(field, 'digests')}[{i}]"
        outputs = c.typed(batch, where, list, "a list of output digests")
        if len(outputs) == 1 and isinstance(outputs[0], str) and _BATCH_FAILED.match(outputs[0]):
            continue  # its digest failed while recording: a resume says "not verified"
        for output in outputs:
            c.text(output, where, _BATCH_OUTPUT,
                   "<dtype>/<8 hex>/<algorithm>:<8 to 64 hex> (or the older <c + 8 hex | g + "
                   "16 hex>), or failed:<exception type>")


_CRCS = re.compile(r"^(?:[0-9a-f]{8})*$")


def _check_contents(c: _Checker, record: Any, field: str) -> None:
    """A data location's content digests (data_contents.py): one CRC-32 a file."""
    c.mapping(record, field)
    files = c.count(c.get(record, field, "files"), key(field, "files"))
    c.count(c.get(record, field, "bytes"), key(field, "bytes"))
    crcs = c.text(c.get(record, field, "crc32"), key(field, "crc32"), _CRCS,
                  "8 lowercase hex digits a file")
    if len(crcs) != 8 * files:
        c.fail(key(field, "crc32"), f"holds {len(crcs) // 8} digests, but 'files' is {files}")


def _check_dynamic(c: _Checker, dynamic: Any, files: dict) -> None:
    def entry(name: str, info: Any, field: str) -> None:
        c.mapping(info, field)
        c.member(c.get(info, field, "file"), key(field, "file"), "dynamic/", files)
        if "batches" in info:  # optional: its readers' batch digests, by reader name
            c.mapping(info["batches"], key(field, "batches"), lambda reader, record, path:
                      _check_batches(c, record, path))

    c.mapping(dynamic, "dynamic", entry)


def _check_dtype(c: _Checker, value: Any, field: str) -> None:
    c.text(value, field, DTYPE, "a NumPy dtype string such as '<f4'")
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        c.fail(field, f"is {_show(value)}, not a NumPy dtype")
    if dtype.hasobject or dtype.itemsize == 0:
        c.fail(field, f"is {_show(value)}, a dtype dvc-dali never writes (objects or "
               "zero-size elements)")


def _check_array_file(c: _Checker, info: Any, field: str, files: dict) -> None:
    c.mapping(info, field)
    name = c.member(c.get(info, field, "file"), key(field, "file"), "arrays/", files)
    if name.endswith(".pack") != ("offset" in info):
        got = _show(info["offset"]) if "offset" in info else "absent"
        c.fail(key(field, "offset"), f"is {got}, expected "
               + ("the array's byte offset in its pack" if name.endswith(".pack")
                  else "none (an .npy file holds one array)"))
    if "offset" in info:  # that the array ends inside the pack is checked as it is read
        c.count(info["offset"], key(field, "offset"))
    _check_dtype(c, c.get(info, field, "dtype"), key(field, "dtype"))
    shape = c.typed(c.get(info, field, "shape"), key(field, "shape"), list, "a list")
    if len(shape) > _MAX_DIMS:
        c.fail(key(field, "shape"), f"has {len(shape)} dimensions, more than {_MAX_DIMS}")
    for i, size in enumerate(shape):
        c.count(size, f"{key(field, 'shape')}[{i}]")
    kind = info.get("kind", "numpy")
    if kind not in _KINDS:
        c.fail(key(field, "kind"), f"is {_show(kind)}, expected one of {', '.join(_KINDS)}")
    if "device" in info:
        c.text(info["device"], key(field, "device"))
    if not isinstance(info.get("scalar", False), bool) or (info.get("scalar") and shape):
        c.fail(key(field, "scalar"), f"is {_show(info.get('scalar'))}, expected true (with "
               "shape []) or false")
    _check_torch(c, info, field, np.dtype(info["dtype"]))


def _torch_size(name: str) -> int | None:
    if name in TORCH_NUMPY:
        return np.dtype(TORCH_NUMPY[name]).itemsize
    return TORCH_BITS.get(name)


def _check_torch(c: _Checker, info: dict, field: str, dtype: np.dtype) -> None:
    """kind, torch_dtype, torch_view and dtype agree: the bytes come back as
    the tensor they were (a bfloat16 without its view would be int16)."""
    kind = info.get("kind", "numpy")
    if kind != "torch":
        for name in ("torch_dtype", "torch_view", "requires_grad", "parameter"):
            if name in info:
                c.fail(key(field, name), f"is {_show(info[name])} on a {kind} array; only a "
                       "torch array has it")
        _check_ml_dtype(c, info, field, dtype, kind)
        return
    if "ml_dtype" in info:
        c.fail(key(field, "ml_dtype"), f"is {_show(info['ml_dtype'])} on a torch array; "
               "only a NumPy or JAX array has it")
    view, view_field = info.get("torch_view"), key(field, "torch_view")
    if view is not None and (not isinstance(view, str) or view not in TORCH_VIEWS):
        c.fail(view_field, f"is {_show(view)}, expected null or int8/int16/int32/int64")
    name = c.text(c.get(info, field, "torch_dtype"), key(field, "torch_dtype"), _TORCH_DTYPE,
                  "a torch dtype name")
    size = _torch_size(name)
    if size is None:
        c.fail(key(field, "torch_dtype"), f"is {name!r}, not a torch dtype this dvc-dali "
               "knows (a newer dvc-dali may read it)")
    if view is None and name not in TORCH_NUMPY:
        c.fail(view_field, f"is null, but torch_dtype {name} has no NumPy dtype: its bytes "
               f"are saved viewed as torch_view 'int{8 * size}'")
    if view is not None and TORCH_VIEWS[view] != size:
        c.fail(view_field, f"is {view!r} ({TORCH_VIEWS[view]}-byte elements), but torch_dtype "
               f"{name} has {size}-byte ones")
    saved = TORCH_NUMPY[name] if view is None else f"i{size}"
    if f"{dtype.kind}{dtype.itemsize}" != saved:
        c.fail(key(field, "dtype"), f"is {dtype.str!r}, but a torch {name} tensor"
               + ("" if view is None else f" viewed as {view}") + f" is saved as NumPy "
               f"'{saved}' ({np.dtype(saved).name})")


def _check_ml_dtype(c: _Checker, info: dict, field: str, dtype: np.dtype, kind: str) -> None:
    """An ml_dtypes array's bits are saved as unsigned integers of its size."""
    if "ml_dtype" not in info:
        return
    if kind not in ("numpy", "jax"):
        c.fail(key(field, "ml_dtype"), f"is {_show(info['ml_dtype'])} on a {kind} array; "
               "only a NumPy or JAX array has it")
    c.text(info["ml_dtype"], key(field, "ml_dtype"), _NAME, "an ml_dtypes dtype name")
    if dtype.kind != "u":
        c.fail(key(field, "dtype"), f"is {dtype.str!r}, but an ml_dtypes array is saved as "
               "its bits, unsigned integers of its size")


def _check_arrays(c: _Checker, trees: Any, n_files: int) -> None:
    def entry(name: str, tree: Any, field: str) -> None:
        try:
            arrays_mod.check_tree(tree, n_files)
        except arrays_mod.TreeError as exc:
            c.fail(field + exc.path, exc.what)

    c.mapping(trees, "arrays", entry)


def validate(manifest: Any, where: str) -> dict[str, Any]:
    """Check a parsed manifest.json whole; returns it. ``where`` (the file)
    starts every message."""
    _check_header(manifest, where)
    c = _Checker(where)
    files = c.mapping(c.get(manifest, "", "files"), "files")
    _check_files(c, files, manifest["format_version"])
    c.count(c.get(manifest, "", "step"), "step")
    for name in ("created",):
        if name in manifest:
            c.text(manifest[name], name)
    if "versions" in manifest:
        c.mapping(manifest["versions"], "versions", lambda n, v, path: c.text(v, path))
    c.mapping(c.get(manifest, "", "metadata"), "metadata")
    _check_run_and_rank(c, manifest)
    _check_pipelines(c, c.get(manifest, "", "pipelines"), files)
    _check_dynamic(c, c.get(manifest, "", "dynamic"), files)
    array_files = c.typed(c.get(manifest, "", "array_files"), "array_files", list, "a list")
    for i, info in enumerate(array_files):
        _check_array_file(c, info, f"array_files[{i}]", files)
    _check_arrays(c, c.get(manifest, "", "arrays"), len(array_files))
    return manifest
