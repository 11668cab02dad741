"""Everything that touches a DALI pipeline: building it with a checkpoint,
describing it for the manifest, and reading checkpoint bytes. (DALI's
framework iterators are in dali_iterators.py, dynamic mode in
dali_dynamic.py, the TF plugin in dali_tf.py; tests/unit/test_dali_boundary.py
lists the modules that may import DALI.)

DALI restores silently into a pipeline with another batch size, shuffle flag,
file_root, shard or seed. The description recorded here holds each of those,
so a restore can say what differs instead of producing other data.
"""

from __future__ import annotations

# This module is one of the doors to DALI (tests/unit/test_dali_boundary.py):
# reaching DALI objects' private attributes is the doors' job, no other module's.
# ruff: noqa: SLF001

import contextlib
import hashlib
import json
import operator
import os
import re
import struct
import warnings
from typing import Any, Iterator

from . import protowire
from ..format import safe_json
from ..core.errors import (
    ArgumentError,
    ArgumentTypeError,
    ConfigError,
    CheckpointCorruptError,
    CheckpointFormatError,
    PipelineBuildError,
    UnnamedOperatorWarning,
    UnsupportedPipelineError,
)
from ..core.arguments import kind_of, shown
from ..core.flat_keys import flat_keys

# Arguments DALI adds for its own bookkeeping (source line numbers, display
# names): they change when the script is edited, not when the data does.
KIND = "dali"  # the manifest's "kind" of a pipeline saved with pipe.checkpoint()
_IGNORED_ARG_PREFIX = "_"
_IGNORED_ARGS = {"preserve_name", "device_id", "num_threads"}
_DATA_LOCATION_ARGS = {"file_root", "file_list", "annotations_file", "manifest_filepaths"}


def dali_version() -> str:
    import nvidia.dali

    return nvidia.dali.__version__


def prepare(source: Any, kwargs: dict[str, Any], name: str) -> Any:
    """An unbuilt Pipeline with checkpointing on (a saved state is set later,
    by :func:`build`).

    ``source`` is a ``@pipeline_def`` function (called with ``kwargs``) or an
    unbuilt ``Pipeline``; anything else is refused naming pipeline ``name``.
    """
    from nvidia.dali import Pipeline

    if isinstance(source, Pipeline):
        if kwargs:
            raise ArgumentTypeError(
                f"pipeline {name!r}: {', '.join(sorted(kwargs))} given with an already "
                "constructed Pipeline; pass them to the @pipeline_def function instead "
                f"(ck.pipeline({name!r}, my_pipeline, batch_size=...))")
        if source._built:
            raise ArgumentError(f"pipeline {name!r}: the Pipeline is already built, and DALI "
                                "restores a checkpoint only at build(); pass the Pipeline "
                                "before calling build() or run()")
        # Pipeline() stores both and reads them only at build(); setting them
        # here is what passing them to the constructor would have done.
        source._enable_checkpointing = True
        source._checkpoint = None
        return source
    if not callable(source):
        raise ArgumentTypeError(f"pipeline {name!r}: source={shown(source)} is "
                                f"{kind_of(source)}; pass a @pipeline_def function or an "
                                "unbuilt Pipeline")
    _check_keywords(source, kwargs, name)
    # checkpoint=None as for a Pipeline above: a saved state is set only by build()
    with _not_utf8_said(name):  # the function makes its operators here
        pipe = source(**kwargs, enable_checkpointing=True, checkpoint=None)
    if not isinstance(pipe, Pipeline):
        raise ArgumentTypeError(f"pipeline {name!r}: {getattr(source, '__name__', source)!r} "
                                f"returned {kind_of(pipe)}, not a Pipeline: decorate "
                                "it with @pipeline_def")
    return pipe


_DALI_UNSUPPORTED = re.compile(r"^Unsupported argument type with name (\w+)$")


def _not_utf8(value: Any) -> str | None:
    """The first text of ``value`` (a str or path, or a list of them) that
    cannot be UTF-8: a name the file system gave with a byte such as 0xff."""
    for text in value if isinstance(value, (list, tuple)) else [value]:
        text = os.fspath(text) if isinstance(text, os.PathLike) else text
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return text
    return None


@contextlib.contextmanager
def _not_utf8_said(name: str) -> Iterator[None]:
    """DALI takes a text argument only as UTF-8: a ``file_root`` with a byte
    that is not (``data/\\xff``) failed in the pipeline function with DALI's
    traceback and "Unsupported argument type with name file_root" (found by a
    sweep). Said in one line naming the argument, its value, the script's
    line and the fix."""
    try:
        yield
    except RuntimeError as exc:
        found = _DALI_UNSUPPORTED.match(str(exc).strip())
        frames = []  # (frame, line), the outermost first
        tb = exc.__traceback__
        while tb is not None:
            frames.append((tb.tb_frame, tb.tb_lineno))
            tb = tb.tb_next
        text = _not_utf8(_refused_value(found.group(1), frames)) if found else None
        if text is None:
            raise
        key = found.group(1)  # DALI's own (_origin_stack_filename): where the script is
        what, fix = (f"{key}={text!r}{_made_at(frames)}", "rename that directory or file, "
                     "or give a link to it whose name is UTF-8")
        if key.startswith("_"):
            what, fix = (f"the script's path {text!r} (DALI keeps where each operator was "
                         "made)", "move the script (or the project) to a path that is")
        raise PipelineBuildError(
            f"pipeline {name!r}: {what} is not UTF-8 (a name with a byte such as \\xff), and "
            f"DALI takes it only as UTF-8 text: {fix}") from None


def _refused_value(key: str, frames: list[tuple[Any, int]]) -> Any:
    """The value of argument ``key`` DALI refused, read from the innermost
    frame that holds the operator's arguments (DALI's ``_add_spec_args``);
    None where no frame does (another DALI release)."""
    for frame, _ in reversed(frames):
        kwargs = frame.f_locals.get("kwargs")
        if isinstance(kwargs, dict) and key in kwargs:
            return kwargs[key]
    return None


def _made_at(frames: list[tuple[Any, int]]) -> str:
    """" (made at FILE, line N)": the innermost frame of the script, neither
    DALI's nor dvc-dali's; "" where there is none."""
    dali = f"{os.sep}nvidia{os.sep}dali{os.sep}"
    ours = f"{os.sep}{__package__.split('.')[0]}{os.sep}"
    user = [(f, n) for f, n in frames if dali not in f.f_code.co_filename
            and ours not in f.f_code.co_filename]
    if not user:
        return ""
    frame, line = user[-1]
    return f" (made at {os.path.basename(frame.f_code.co_filename)}, line {line})"


def _check_keywords(source: Any, kwargs: dict[str, Any], name: str) -> None:
    """A keyword neither the @pipeline_def function nor ``Pipeline()`` takes
    (a typo: ``batchsize=8``), named: DALI's own check is an ``assert`` (a
    traceback saying "This shouldn't happen"; under ``python -O`` the
    argument was dropped without a word)."""
    import inspect
    from nvidia.dali import Pipeline

    func = getattr(source, "__wrapped__", None)
    if not getattr(source, "_is_pipeline_def", False) or not callable(func):
        return
    try:
        spec, ctor = inspect.getfullargspec(func), inspect.getfullargspec(Pipeline.__init__)
    except TypeError:  # no signature to read: DALI checks it
        return
    if spec.varkw is not None:  # DALI refuses **kwargs itself
        return
    known = {*spec.args, *spec.kwonlyargs, *ctor.args, *ctor.kwonlyargs, "debug",
             "enable_conditionals"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ArgumentTypeError(
            f"pipeline {name!r}: {', '.join(unknown)}: neither {func.__name__}() nor DALI's "
            f"Pipeline takes {'this argument' if len(unknown) == 1 else 'these arguments'}; "
            "check the spelling (batch_size, num_threads, device_id, seed, or one of "
            f"{func.__name__}()'s own)")


# (the Pipeline's attribute, the argument's name, whether None is allowed):
# integers DALI's backend takes, whose wrong type it reports as
# "incompatible constructor arguments", naming none
_INTEGER_ARGS = (("max_batch_size", "batch_size", False), ("num_threads", "num_threads", False),
                 ("device_id", "device_id", True), ("seed", "seed", True))


def check_arguments(pipe: Any, name: str) -> None:
    """Pipeline ``name``'s integer arguments are integers: a value read from
    a params file as a string or a float is named here."""
    for attr, arg, none_allowed in _INTEGER_ARGS:
        value = getattr(pipe, attr, None)
        if not (value is None and none_allowed) and not _is_integer(value):
            raise ConfigError(f"pipeline {name!r}: {arg}={value!r}: DALI takes an integer "
                              f"here; pass one (a value read from a params file may be a "
                              f"string: int(...) it)")


def _is_integer(value: Any) -> bool:
    """An int or a NumPy integer; not a bool, a float or a string."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


@contextlib.contextmanager
def _dali_builds(name: str) -> Iterator[None]:
    """DALI's errors of making pipeline ``name``'s backend (a bad argument,
    no files found) as one PipelineBuildError: DALI raises RuntimeError for
    most, ValueError for some (batch_size=0, num_threads=0)."""
    try:
        yield
    except (RuntimeError, ValueError) as exc:
        raise PipelineBuildError(build_failure(name, str(exc))) from exc


def build(pipe: Any, name: str, state: bytes | None = None, state_file: str = "") -> None:
    """Build ``pipe``, restoring ``state`` (read from ``state_file``) if given,
    as Pipeline(checkpoint=...) would: DALI restores only at build(), after
    its backend is built, so the two are done apart here: a pipeline that
    cannot be built (no files found, a bad argument) is said to be that, not
    a damaged checkpoint."""
    pipe._checkpoint = None
    with _dali_builds(name):
        pipe.build()
    if state is None:
        return
    pipe._checkpoint = state
    try:
        pipe._restore_state_from_checkpoint()
    except (RuntimeError, ValueError) as exc:
        raise CheckpointCorruptError(
            f"{state_file}: DALI could not restore pipeline {name!r} from it "
            f"({str(exc).splitlines()[0]}). Restore an earlier checkpoint with "
            "`dvc exp apply <row>`, or start over with `dvc-dali reset`.") from exc


_DALI_OPERATOR = re.compile(r"Error in (\w+) operator `([^`]+)`")
_DALI_WHERE = re.compile(r'File "([^"]+)", line (\d+)')
_DALI_ASSERT = re.compile(r'^Assert on ".*" failed: ')
_DALI_SAME_NAMES = re.compile(r"'((?:[^'\\]|\\.)*)': \[<")  # {'x': [<...Instance ...>, ...]}


def build_failure(name: str, text: str) -> str:
    """The one line said of DALI's build error ``text`` (its operator, where
    the script made it, what DALI found), without DALI's traceback and C++
    context."""
    lines = [line.strip() for line in text.splitlines()]
    found = next((i for i, line in enumerate(lines) if line == "encountered:"), None)
    rest = [line for line in (lines[found + 1:] if found is not None else lines)
            if line and not line.startswith(("C++ context:", "Current pipeline object",
                                             "Critical error when building"))]
    what = _DALI_ASSERT.sub("", rest[0]) if rest else "an error with no message"
    same = _DALI_SAME_NAMES.findall(text)
    if same:  # the names, not the operators' reprs with their addresses
        names = ", ".join(f"'{n}'" for n in same)
        what = f"{what.rstrip(':')} ({names}): give each its own."
    operator = _DALI_OPERATOR.search(text)
    where = _DALI_WHERE.findall(text)
    at = ""
    if operator:
        at = f" in its {operator.group(1)} operator {operator.group(2)}"
    if where:
        path, line = where[-1]
        at += f" (made at {os.path.basename(path)}, line {line})"
    return (f"DALI could not build pipeline {name!r}{at}: {what} Fix the pipeline's "
            "arguments or the files it reads, then rerun.")


def build_graph(pipe: Any, name: str) -> None:
    """Build the Python graph without DALI's own external_source warning,
    which :func:`check_restorable` replaces with an error; DALI's errors
    there (operators of one name) as a PipelineBuildError."""
    if not pipe._py_graph_built:
        with warnings.catch_warnings(), _dali_builds(name):
            warnings.filterwarnings("ignore", message="Checkpointing enabled in a pipeline")
            pipe._build_graph()


def check_restorable(pipe: Any, name: str) -> None:
    """Refuse external sources whose position DALI does not checkpoint.

    DALI restores an external_source only for a one-argument callable; any
    other source silently restarts from its beginning after a restore.
    """
    from nvidia.dali._utils.external_source_impl import SourceKind
    from nvidia.dali.external_source import _is_external_source

    build_graph(pipe, name)
    for op in pipe._ops:
        if not _is_external_source(op):
            continue
        group = getattr(op, "_group", None)
        if op._callback is None or group is None:
            form = "no source (fed with feed_input)"
        elif group.source_desc.kind != SourceKind.CALLABLE:
            kind = group.source_desc.kind.name.lower().replace("_func", " function")
            form = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} source"
        elif not group.source_desc.has_inputs:
            form = "a callable without arguments"
        else:
            continue
        raise UnsupportedPipelineError(
            f"pipeline {name!r}: external_source {op.name!r} has {form}. DALI cannot save "
            "its position and would restart it from the beginning after a restore, so the "
            "batches would differ from an uninterrupted run. Use a callable of one argument: "
            "the sample index (int), nvidia.dali.types.SampleInfo (batch=False) or "
            "nvidia.dali.types.BatchInfo (batch=True, batch_info=True)."
        )


def _decode_argument(raw: bytes) -> tuple[str, Any]:
    msg = protowire.parse(raw)
    name = msg[1][0].decode()
    values: list[Any] = []
    values += [struct.unpack("<f", v)[0] for v in msg.get(3, [])]
    values += [v - (1 << 64) if v >= 1 << 63 else v for v in msg.get(4, [])]
    values += [v.decode() for v in msg.get(5, [])]
    values += [bool(v) for v in msg.get(6, [])]
    values += [_decode_argument(v)[1] for v in msg.get(7, [])]  # vector elements
    is_vector = bool(msg.get(8, [0])[0])
    return name, values if is_vector or len(values) != 1 else values[0]


# The walks the data digests were made with, by name: how far a link to a
# folder is followed ("none", "class": at a class folder right under the top,
# "all": at any depth, once per real folder) and whether an entry that is no
# regular file is listed with size -1 (else its stat size). A manifest names
# the walk of its pipelines' data digests (WALK_KEY); one without the name was
# written before walks were named, by one of walk0-walk3, so a resume tells a
# digest of another walk (not verified) from changed data (data_contents).
WALKS = {
    "walk0": ("none", False),  # up to f8b2f2a: a folder that is a link skipped
    "walk1": ("all", False),  # f8b2f2a: links followed at any depth
    "walk2": ("class", False),  # bf432a9: links followed at class folders only
    "walk3": ("class", True),  # ff46f4a: a FIFO or device listed with size -1
}
WALK = "walk3"  # this release's: change the recipe, add a walk and name it here
WALK_KEY = "data_walk"  # the manifest pipeline entry's field naming the walk


def data_files(top: str, rel: str = "", walk: str = WALK) -> list[tuple[str, str, int]]:
    """(name relative to ``top`` with ``rel`` before it, path, size) of the
    files below ``top``, in a stable order: a directory's files by name,
    then its subdirectories by name (os.scandir: one stat per entry, what
    100,000-file data sets need). A link to a folder right under ``top`` (a
    class folder) is followed, as DALI's file reader follows it (its files
    were left out, so data changed there resumed silently; found by a
    sweep); deeper links are not (DALI reads no deeper than the class
    folders, and a link to / would be walked whole). Size -1: an entry that
    cannot be stat'ed (a dangling link, which DALI skips) or is no regular
    file (a FIFO, whose open blocks for ever; a link to /dev/zero, endless):
    named, never read, never a traceback. ``walk``: another of WALKS, to
    compare with a digest an earlier release made."""
    out: list[tuple[str, str, int]] = []
    follow, unsized = WALKS[walk]
    _walk(top, rel, out, (follow, unsized, True), frozenset({os.path.realpath(top)}))
    return out


def _walk(top: str, rel: str, out: list[tuple[str, str, int]], how: tuple[str, bool, bool],
          above: frozenset[str]) -> None:
    follow, unsized, top_level = how
    try:
        with os.scandir(top) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    dirs = []
    for e in entries:
        if _is_dir(e):
            dirs.append(e)
            continue
        try:
            size = e.stat().st_size if e.is_file() or not unsized else -1
        except OSError:
            size = -1
        out.append((f"{rel}{e.name}", e.path, size))
    for e in dirs:
        linked = e.is_symlink()
        if follow == "all":  # walk1 went into every folder once, by its real path
            real = os.path.realpath(e.path)
            if real not in above:
                _walk(e.path, f"{rel}{e.name}/", out, how, above | {real})
        elif not linked or (follow == "class" and top_level):
            _walk(e.path, f"{rel}{e.name}/", out, (follow, unsized, False), above)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _digest_dir(h, top: str, walk: str = WALK) -> None:
    """Names and sizes below ``top`` (:func:`data_files`); a name's bytes as
    the file system has them (a name that is not UTF-8 too)."""
    for name, _, size in data_files(top, walk=walk):
        h.update(os.fsencode(name) + f"\0{size}\0".encode())


def _data_digest(value: Any, where: str, walk: str = WALK) -> str | None:
    """A digest of the data behind a location argument, so a data set that
    changed under the same path is noticed. A path that does not exist is
    named here, before DALI's own C++ assertion at build()."""
    paths = value if isinstance(value, list) else [value]
    h = hashlib.sha1()
    for path in paths:
        if not isinstance(path, str) or not path:
            continue
        if os.path.isdir(path):
            _digest_dir(h, path, walk)
        elif os.path.isfile(path):
            with open(path, "rb") as fh:
                h.update(fh.read())
        else:
            raise ConfigError(
                f"{where}={path!r}: no such file or directory (from {os.getcwd()}). Create "
                "the data first (`dvc pull`, or run the stage that prepares it), or fix the "
                "path.")
    return h.hexdigest()


_UNSERIALIZABLE = re.compile(r"Could not serialize the operator: `?([\w.]+)`?")


def _refuse_unserializable(name: str, text: str) -> None:
    """An operator DALI cannot serialize (``fn.python_function``): the
    pipeline is described (and so a changed one told at a resume) from its
    serialized graph, so it is not supported yet; not a build failure."""
    found = _UNSERIALIZABLE.search(text)
    if found:
        raise UnsupportedPipelineError(
            f"pipeline {name!r}: DALI cannot serialize its operator {found.group(1)}, and "
            "dvc-dali describes a pipeline by its serialized graph (to tell a changed one at a "
            "resume): not supported yet. Compute it in a one-argument external_source callable "
            "instead.") from None


def describe(pipe: Any, name: str) -> dict[str, Any]:
    """What determines pipeline ``name``'s output stream, as plain JSON data."""
    build_graph(pipe, name)
    with _dali_builds(name):  # DALI makes its backend here, where batch_size=0 is found
        try:
            serialized = pipe.serialize()
        except RuntimeError as exc:
            _refuse_unserializable(name, str(exc))
            raise
    msg = protowire.parse(serialized)
    operators: dict[str, Any] = {}
    data: dict[str, str] = {}
    for raw in msg.get(5, []):
        op = protowire.parse(raw)
        inst = op[5][0].decode() if 5 in op else op[1][0].decode()
        args = {}
        for raw_arg in op.get(4, []):
            arg, value = _decode_argument(raw_arg)
            if arg.startswith(_IGNORED_ARG_PREFIX) or arg in _IGNORED_ARGS:
                continue
            args[arg] = value
            if arg in _DATA_LOCATION_ARGS:
                digest = _data_digest(value, f"{inst}.{arg}")
                if digest:
                    data[f"{inst}.{arg}"] = digest
        inputs = [protowire.parse(i)[1][0].decode() for i in op.get(2, [])]
        operators[inst] = {"type": op[1][0].decode(), "args": args, "inputs": inputs}
    seed = msg.get(9, [-1])[0]
    return {
        "batch_size": msg[2][0],
        "seed": seed - (1 << 64) if seed >= 1 << 63 else seed,
        "operators": operators,
        "data": data,
    }


def data_digest(description: dict[str, Any], where: str, walk: str) -> str | None:
    """The data digest of location ``where`` ("<operator>.<arg>") of a
    pipeline's description, made again with ``walk`` (one of WALKS)."""
    inst, _, arg = where.rpartition(".")
    value = description.get("operators", {}).get(inst, {}).get("args", {}).get(arg)
    return _data_digest(value, where, walk) if value else None


def fingerprint(description: dict[str, Any]) -> str:
    text = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()


def differences(old: dict[str, Any], new: dict[str, Any],
                skip: frozenset[str] = frozenset()) -> list[str]:
    """Human-readable 'what: old -> new' lines between two descriptions
    (``skip``: data locations whose digests are not to be compared, as
    data_contents.data_verdicts tells)."""
    old_ops, new_ops = old.get("operators", {}), new.get("operators", {})
    lines = [f"operator {op}: {old_ops[op]['type'] if op in old_ops else '<absent>'} -> "
             f"{new_ops[op]['type'] if op in new_ops else '<absent>'}"
             for op in sorted(set(old_ops) ^ set(new_ops))]
    common = set(old_ops) & set(new_ops)
    flat_old: dict[str, Any] = {}
    flat_new: dict[str, Any] = {}
    for flat, desc, ops in ((flat_old, old, old_ops), (flat_new, new, new_ops)):
        pruned = {**desc, "operators": {k: v for k, v in ops.items() if k in common}}
        flat.update(flat_keys(pruned, empty_as_leaf=False))
    for key in sorted(set(flat_old) | set(flat_new)):
        a, b = flat_old.get(key, "<absent>"), flat_new.get(key, "<absent>")
        if a != b and not (key.startswith("data.") and key[5:] in skip):
            if key.startswith("data."):
                a, b = "files as saved", "different files"
            lines.append(f"{key}: {json.dumps(a)} -> {json.dumps(b)}")
    return lines


def serialized(pipe: Any) -> str:
    """The pipeline's graph as DALI serializes it, base64 (for a replay
    without the training script: replay.py)."""
    import base64

    return base64.b64encode(pipe.serialize()).decode("ascii")


def has_python_source(description: dict[str, Any]) -> bool:
    """Operators fed by Python code, which DALI does not serialize."""
    return any(op.get("type", "").startswith(("ExternalSource", "Python", "DLTensorPython"))
               for op in description.get("operators", {}).values())


def rebuild(serialized_graph: bytes, description: dict[str, Any], state: bytes) -> Any:
    """A pipeline deserialized and built with ``state`` restored (on GPU 0
    when an operator runs on a GPU, else on the CPU)."""
    from nvidia.dali import Pipeline

    gpu = any(op.get("args", {}).get("device") in ("gpu", "mixed")
              for op in description.get("operators", {}).values())
    pipe = Pipeline(batch_size=description["batch_size"], num_threads=2,
                    device_id=0 if gpu else None, enable_checkpointing=True, checkpoint=state)
    pipe.deserialize_and_build(serialized_graph)
    return pipe


def keeps_outputs(pipe: Any) -> bool:
    """True when a returned batch stays valid while referenced (DALI's default
    executor; the legacy one, exec_dynamic=False, reuses output buffers)."""
    return pipe._exec_dynamic is not False


def capture(pipe: Any) -> bytes:
    """The pipeline's state now (readers' positions, random generators)."""
    return pipe.checkpoint()


def read_state(data: bytes, path: str) -> dict[str, Any]:
    """Check checkpoint bytes and return {operators: {name: state size}, iter, epoch_idx}.

    DALI itself fails on bad bytes with cryptic errors (or an UnpicklingError
    for DALI 1.x checkpoints); this names the file and the cause first.
    """
    if not data:
        raise CheckpointCorruptError(f"{path}: the DALI state file is empty. The checkpoint "
                                     "is damaged: restore an earlier one with `dvc exp apply`, "
                                     "or start over with `dvc-dali reset`.")
    try:
        msg = protowire.parse(data)
        ops = {}
        for raw in msg.get(1, []):
            if not isinstance(raw, bytes):
                raise protowire.WireError("an operator entry is not a message")
            op = protowire.parse(raw)
            ops[protowire.first_text(op, 1)] = len(protowire.first_bytes(op, 2, b""))
        ctx = protowire.parse(protowire.first_bytes(msg, 2)) if 2 in msg else {}
        pipeline_data = protowire.first_bytes(ctx, 1, b"")
    except (protowire.WireError, KeyError, IndexError, UnicodeDecodeError, TypeError) as exc:
        raise CheckpointCorruptError(
            f"{path}: not a DALI checkpoint ({exc}). The file is damaged or was replaced: "
            "restore an earlier checkpoint with `dvc exp apply`, or start over with "
            "`dvc-dali reset`.") from None
    if pipeline_data[:1] == b"\x80":
        raise CheckpointFormatError(
            f"{path}: written by DALI 1.x (its pipeline data is a pickle); DALI "
            f"{dali_version()} reads only DALI 2 checkpoints and dvc-dali never unpickles. "
            "Finish the run with DALI 1.x, or start over with `dvc-dali reset`.")
    # Depth-limited: DALI's own JSON inside a checkpoint is input from outside too.
    info = safe_json.loads(pipeline_data, where=f"{path}: DALI pipeline data")
    try:
        return {"operators": ops, "iter": int(info["iter"]), "epoch_idx": int(info["epoch_idx"])}
    except (ValueError, KeyError, TypeError, OverflowError):
        raise CheckpointCorruptError(
            f"{path}: the DALI pipeline data is not the JSON DALI 2 writes. Restore an earlier "
            "checkpoint with `dvc exp apply`, or start over with `dvc-dali reset`.") from None


def warn_unnamed(name: str, pipe: Any) -> None:
    """Warn about stateful operators whose state is keyed by creation order.

    Call it straight from the public method the user called: the warning
    points two frames up, at the user's line.
    """
    state = read_state(capture(pipe), name)
    unnamed = [op for op, size in state["operators"].items() if size and op.startswith("__")]
    if unnamed:
        warnings.warn(
            f"pipeline {name!r}: stateful operators without name= ({', '.join(unnamed)}); "
            "their saved state is matched by creation order, so reordering them in the code "
            "would restore each into the other. Give each a name, e.g. "
            "fn.random.uniform(..., name=\"angle\").",
            UnnamedOperatorWarning,
            stacklevel=3,
        )
