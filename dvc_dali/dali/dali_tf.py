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

Each dataset ends in one map node of dvc-dali's, after the user's
``transform``: it hands every element, as host arrays, to the batch
digests (batch_digests.py) as the consumer takes it, eagerly or inside
Keras's ``tf.function``. The node is there whether digests are on or off
(off: an identity), since a TF iterator state restores only into the same
chain of nodes; states saved without it (``check_node`` absent from their
manifest entry) are restored into a dataset built without it.
"""

from __future__ import annotations

# One of the doors to DALI and TensorFlow (tests/unit/test_dali_boundary.py):
# subclassing tf.data's dataset classes is its job, and no other module's.
# ruff: noqa: SLF001

import contextlib
import re
import struct
import tempfile
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

from ..core.errors import CheckpointCorruptError, ConfigError, DvcDaliError

KIND = "tensorflow"  # the manifest's "kind" of a pipeline saved through its TF iterator
MAGIC = b"dvc-dali tf-iterator 1\n"
# what TensorFlow's error says when the check refused a batch
REFUSED = "dvc-dali refused this batch; its error is raised in place of this one"
CHECK_NODE = "check_node"  # a TF pipeline entry's field: its state has the check node
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
        iterator._dvc_dali_stream = weakref.ref(self)  # for superseded()

    @property
    def iterated(self) -> bool:
        return self._current is not None

    def state(self) -> bytes:
        """The stream's position now, as bytes to save."""
        if self._current is not None:
            return _save_iterator(self._current)
        return self._pending if self._pending is not None else pack({})


def superseded(iterator: Any) -> bool:
    """Whether ``iterator``'s stream has started another iterator since: the
    stream's position, which a checkpoint saves, is then that one's, while
    whoever reads ``iterator`` goes on from its own (Keras validating, or a
    callback evaluating, on the dataset fit trains from)."""
    ref = getattr(iterator, "_dvc_dali_stream", None)
    stream = ref() if ref is not None else None
    return stream is not None and stream._current is not iterator


def dataset(pipe: Any, on_iter: Callable[[Any], None], output_dtypes: Any,
            output_shapes: Any = None, transform: Callable[[Any], Any] | None = None,
            check: Callable[[list[Any]], None] | None = None,
            failure: Callable[[], BaseException | None] = lambda: None,
            check_node: bool = True) -> Any:
    """A ``DALIDataset`` over ``pipe`` (with the pipeline's own batch size,
    threads, device and queue depths: DALIDataset's defaults would override
    them), optionally ``transform``-ed (``lambda ds: ds.map(...)``); every
    iterator of the result is handed to ``on_iter`` as it is made.

    With ``check_node``, one map node ends it: ``check(arrays)`` gets each
    element (its components as host arrays, flattened) as it is taken, or,
    with ``check`` None, the element passes unseen. A DvcDaliError ``check``
    raises fails the element with an error of TensorFlow's; the iterators
    raise ``failure()`` (the refusal, kept) instead (see :func:`typed_errors`)."""
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
    if check_node:
        ds = _checked(ds, check)
    return _tracked(ds, on_iter, failure)


def _checked(ds: Any, check: Callable[[list[Any]], None] | None) -> Any:
    """``ds`` with the map node that hands each element to ``check`` (see
    :func:`dataset`); last, after the user's transform, so ``check`` sees
    what the training step gets, when it gets it."""
    import tensorflow as tf

    unpacked = type(ds.element_spec) is tuple  # tf.data passes a tuple's members as arguments

    def body(*flat: Any) -> bool:
        try:
            check([_numeric(a) for a in flat])
        except DvcDaliError:  # kept by the caller (failure()); raised here, TensorFlow
            return False      # would print it with a Python traceback
        return True

    @tf.autograph.experimental.do_not_convert
    def node(*args: Any) -> Any:
        element = args if unpacked else args[0]
        if check is None:  # the same node, so a state saved with digests off restores
            return tf.nest.map_structure(tf.identity, element, expand_composites=True)
        ok = tf.numpy_function(body, tf.nest.flatten(element, expand_composites=True),
                               Tout=tf.bool, stateful=True, name="dvc_dali_batch_check")
        with tf.control_dependencies([tf.debugging.Assert(ok, [REFUSED])]):
            return tf.nest.map_structure(tf.identity, element, expand_composites=True)

    options = tf.data.Options()
    # tf.data may add a prefetch after the last node: the check would then run
    # ahead of the training, and a checkpoint would hold checked batches unseen
    options.experimental_optimization.inject_prefetch = False
    if check is not None:
        # A Python function in a dataset is "external state", with which TF
        # refuses to save an iterator by default; the check holds no state of
        # the position (its digests restart at each checkpoint).
        options.experimental_external_state_policy = (
            tf.data.experimental.ExternalStatePolicy.IGNORE)
    return ds.map(node).with_options(options)


def _numeric(array: Any) -> Any:
    """A tf.string component (NumPy objects: bytes) as the bytes of each
    string after its length, which a digest can read; others as they are."""
    import numpy as np

    array = np.asarray(array)  # a scalar comes as a NumPy scalar, a string one as bytes
    if array.dtype.kind not in "OS":
        return array
    parts = [struct.pack("<Q", len(b)) + bytes(b) for b in array.reshape(-1)]
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


@contextlib.contextmanager
def typed_errors(failure: Callable[[], BaseException | None]) -> Iterator[None]:
    """TensorFlow's error for a batch the check refused is raised as the
    refusal itself (``failure()``, kept when the check raised it): the caller
    gets the typed error with its message."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as exc:
        cause = failure()
        if cause is None or REFUSED not in str(exc):
            raise
        raise cause from None


def _tracked(ds: Any, on_iter: Callable[[Any], None],
             failure: Callable[[], BaseException | None]) -> Any:
    """``ds`` itself, but its iterators are seen, and raise a check's error typed."""
    from tensorflow.python.data.ops import dataset_ops, iterator_ops
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops

    class _Iterator(iterator_ops.OwnedIterator):
        """An eager iterator (``next(it)``, ``for x in ds``); inside a
        ``tf.function`` (Keras's fit) TensorFlow rebuilds a plain one from
        its components, so there the caller of the function re-raises."""

        def _next_internal(self) -> Any:  # behind __next__ and get_next
            with typed_errors(failure):
                return super()._next_internal()

    class _Tracked(dataset_ops.UnaryUnchangedStructureDataset):
        """``ds`` itself, but its iterators are seen (a tf.data node adds nothing)."""

        def __init__(self, inner: Any) -> None:
            self._input_dataset = inner
            super().__init__(inner, inner._variant_tensor)

        def __iter__(self) -> Any:
            if not (context.executing_eagerly() or ops.inside_function()):
                return super().__iter__()  # tf.data's own refusal
            with ops.colocate_with(self._variant_tensor):  # as tf.data's __iter__
                iterator = _Iterator(self)
            on_iter(iterator)
            return iterator

    return _Tracked(ds)

