"""DALI's TensorFlow plugin (``DALIDataset``) and the TensorFlow iterator
state that carries its position.

``DALIDataset`` ignores ``Pipeline(checkpoint=...)``: the DALI state lives in
the TensorFlow iterator, and is reachable only as a whole TF checkpoint of
that iterator (the DALI bytes are nested, compressed, in a TF variant). So a
stream's saved state is the TF checkpoint files of its iterator, written
with the public ``tf.train.Checkpoint`` into a scratch directory and packed
into one byte string (see :func:`pack`).

A :class:`Stream` is the dataset a script trains from. Every iterator made
from it continues where the previous one stopped (the first starts at the
saved position), in a fresh run as in a resumed one: Keras makes a new
iterator per ``fit`` call, and a resumed ``fit`` that starts mid-epoch is
two calls.
"""

from __future__ import annotations

# One of the doors to DALI and TensorFlow (tests/unit/test_dali_boundary.py):
# subclassing tf.data's dataset classes is its job, and no other module's.
# ruff: noqa: SLF001

import re
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import CheckpointCorruptError, ConfigError

KIND = "tensorflow"  # the manifest's "kind" of a pipeline saved through its TF iterator
MAGIC = b"dvc-dali tf-iterator 1\n"
_PREFIX = "state"  # the scratch checkpoint's prefix: state.index, state.data-...
# The only file names a TF checkpoint of one iterator has: nothing else is
# ever written out of a (possibly hostile) packed state.
_MEMBER = re.compile(r"^\.(index|data-\d{5}-of-\d{5})$")
_HEAD = struct.Struct("<IQ")  # name length, data length


def pack(files: dict[str, bytes]) -> bytes:
    """The TF checkpoint ``files`` ({suffix after the prefix: bytes}) as one string."""
    out = [MAGIC]
    for suffix, data in sorted(files.items()):
        name = suffix.encode()
        out += [_HEAD.pack(len(name), len(data)), name, data]
    return b"".join(out)


def unpack(blob: bytes, where: str) -> dict[str, bytes]:
    """:func:`pack` reversed, every length and name checked (``where`` names
    the file in errors)."""
    def bad(why: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(
            f"{where}: not a TensorFlow iterator state written by dvc-dali ({why}). The "
            "checkpoint is damaged: restore an earlier one with `dvc exp apply <row>`, or "
            "start over with `dvc-dali reset`.")

    if not blob.startswith(MAGIC):
        raise bad("it does not start with the dvc-dali header")
    files: dict[str, bytes] = {}
    pos = len(MAGIC)
    while pos < len(blob):
        if len(blob) - pos < _HEAD.size:
            raise bad(f"truncated at byte {pos}")
        name_len, data_len = _HEAD.unpack_from(blob, pos)
        pos += _HEAD.size
        if name_len > 64 or pos + name_len + data_len > len(blob):
            raise bad(f"a member at byte {pos} runs past the end")
        try:
            suffix = blob[pos:pos + name_len].decode("ascii")
        except UnicodeDecodeError:
            raise bad(f"a member name at byte {pos} is not text") from None
        if not _MEMBER.match(suffix) or suffix in files:
            raise bad(f"unexpected member {suffix!r}")
        pos += name_len
        files[suffix] = blob[pos:pos + data_len]
        pos += data_len
    if files and ".index" not in files:
        raise bad("it has no .index member")
    return files


def _save_iterator(iterator: Any) -> bytes:
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="dvc-dali-tf-") as tmp:
        tf.train.Checkpoint(iterator=iterator).write(str(Path(tmp) / _PREFIX))
        return pack({p.name[len(_PREFIX):]: p.read_bytes()
                     for p in Path(tmp).iterdir() if p.name.startswith(_PREFIX + ".")})


def _restore_iterator(iterator: Any, blob: bytes, where: str) -> None:
    import tensorflow as tf

    files = unpack(blob, where)
    if not files:  # saved before any iterator existed: the stream's start
        return
    with tempfile.TemporaryDirectory(prefix="dvc-dali-tf-") as tmp:
        for suffix, data in files.items():
            (Path(tmp) / (_PREFIX + suffix)).write_bytes(data)
        try:
            tf.train.Checkpoint(iterator=iterator).read(
                str(Path(tmp) / _PREFIX)).assert_consumed()
        except (tf.errors.OpError, AssertionError, ValueError, IndexError, TypeError,
                KeyError) as exc:  # what TF raised on damaged bundles in fuzzing
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointCorruptError(
                f"{where}: TensorFlow could not restore the DALIDataset iterator from it "
                f"({first[:300]}). Restore an earlier checkpoint with `dvc exp apply <row>`, "
                "or start over with `dvc-dali reset`.") from None


class Stream:
    """The iterators of one dataset, seen as one stream of batches (see the
    module's doc). ``saved`` (a packed state, from ``where``) is where the
    first iterator starts."""

    def __init__(self, saved: bytes | None, where: str) -> None:
        self._pending = saved  # the state the next iterator starts from
        self._where = where
        # Held, not weakly: Keras drops a fit's iterator when the fit ends,
        # and the next fit's iterator must start where that one stopped.
        self._current: Any = None

    def started(self, iterator: Any) -> None:
        """A new iterator: it continues the stream."""
        if self._current is not None:
            self._pending, self._where = _save_iterator(self._current), "the previous iterator"
        if self._pending is not None:
            _restore_iterator(iterator, self._pending, self._where)
            self._pending = None
        self._current = iterator

    @property
    def iterated(self) -> bool:
        return self._current is not None

    def state(self) -> bytes:
        """The stream's position now, as bytes to save."""
        if self._current is not None:
            return _save_iterator(self._current)
        return self._pending if self._pending is not None else pack({})


def dataset(pipe: Any, on_iter: Callable[[Any], None], output_dtypes: Any,
            output_shapes: Any = None, transform: Callable[[Any], Any] | None = None) -> Any:
    """A ``DALIDataset`` over ``pipe`` (with the pipeline's own batch size,
    threads, device and queue depths: DALIDataset's defaults would override
    them), optionally ``transform``-ed (``lambda ds: ds.map(...)``); every
    iterator of the result is handed to ``on_iter`` as it is made."""
    try:
        import nvidia.dali.plugin.tf as dali_tf
        from tensorflow.python.data.ops import dataset_ops
    except ImportError as exc:
        raise ConfigError(
            f"Checkpointer.tf_dataset() needs TensorFlow and DALI's TF plugin ({exc}). "
            "Install them: pip install \"dvc-dali[tf]\", then pip install "
            "--no-build-isolation nvidia-dali-tf-plugin-cuda120==<your DALI version> "
            "(it compiles against the installed TensorFlow; needs g++).") from None

    depth = pipe._prefetch_queue_depth
    queues = ({"prefetch_queue_depth": depth} if isinstance(depth, int) else
              {"exec_separated": True, "cpu_prefetch_queue_depth": depth["cpu_size"],
               "gpu_prefetch_queue_depth": depth["gpu_size"]})
    ds = dali_tf.DALIDataset(pipe, batch_size=pipe.max_batch_size,
                             num_threads=pipe.num_threads, device_id=pipe.device_id,
                             output_dtypes=output_dtypes, output_shapes=output_shapes, **queues)
    if transform is not None:
        ds = transform(ds)
        if not isinstance(ds, dataset_ops.DatasetV2):
            raise TypeError(f"transform= returned {type(ds).__name__}, not a tf.data.Dataset")

    class _Tracked(dataset_ops.UnaryUnchangedStructureDataset):
        """``ds`` itself, but its iterators are seen (a tf.data node adds nothing)."""

        def __init__(self, inner: Any) -> None:
            self._input_dataset = inner
            super().__init__(inner, inner._variant_tensor)

        def __iter__(self) -> Any:
            iterator = super().__iter__()
            on_iter(iterator)
            return iterator

    return _Tracked(ds)
