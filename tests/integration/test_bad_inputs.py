"""Every bad input gets a typed error naming the file, what is wrong and the fix."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from nvidia.dali import fn, pipeline_def

import dvc_dali
from dvc_dali.format import store

from tests.helpers import pipelines

CPU = dict(num_threads=1, device_id=None)


def save_rotate(ckpt: Path, data: Path, steps: int = 3, **overrides) -> Path:
    kw = {**pipelines.make("rotate", str(data))["train"][1], **overrides}
    ck = dvc_dali.Checkpointer(ckpt)
    pipe = ck.pipeline("train", pipelines.rotate_pipe, **kw)
    for _ in range(steps):
        pipe.run()
    # "a": Fortran order, its own arrays/00000.npy; "w" goes into arrays/00000.pack
    ck.save(steps, arrays={"a": np.asfortranarray(np.ones((2, 3))), "w": np.arange(4.0)},
            metadata={"lr": 0.1})
    return ckpt


def snapshot_dir(ckpt: Path) -> Path:
    return ckpt / (ckpt / store.LATEST).read_text().split()[0]


def rewrite(ckpt: Path, rel: str, data: bytes, keep_digests: bool = True) -> Path:
    """Replace a member file; by default also fix the digests so only the
    content itself is wrong (what a careful forger or a foreign tool does)."""
    snap = snapshot_dir(ckpt)
    (snap / rel).write_bytes(data)
    if keep_digests:
        if rel != store.MANIFEST:
            manifest = json.loads((snap / store.MANIFEST).read_text())
            manifest["files"][rel] = {"md5": hashlib.md5(data).hexdigest(),
                                      "size": len(data)}
            raw = json.dumps(manifest).encode()
            (snap / store.MANIFEST).write_bytes(raw)
        else:
            raw = data
        (ckpt / store.LATEST).write_text(f"{snap.name} {hashlib.md5(raw).hexdigest()}\n")
    return snap / rel


def edit_manifest(ckpt: Path, change) -> None:
    snap = snapshot_dir(ckpt)
    manifest = json.loads((snap / store.MANIFEST).read_text())
    change(manifest)
    rewrite(ckpt, store.MANIFEST, json.dumps(manifest).encode())


@pytest.fixture
def saved(data_dir, tmp_path) -> Path:
    return save_rotate(tmp_path / "ckpt", data_dir)


def resume(ckpt: Path, data: Path, **overrides):
    kw = {**pipelines.make("rotate", str(data))["train"][1], **overrides}
    ck = dvc_dali.Checkpointer(ckpt)
    return ck.pipeline("train", pipelines.rotate_pipe, **kw)


STATE = "pipelines/00000.dali"
ARRAY = "arrays/00000.npy"
PACK = "arrays/00000.pack"


# -- damaged files ---------------------------------------------------------
@pytest.mark.parametrize("rel", [STATE, ARRAY, PACK])
def test_missing_file(saved, data_dir, rel):
    (snapshot_dir(saved) / rel).unlink()
    with pytest.raises(dvc_dali.CheckpointCorruptError, match=re.escape(rel) + ".*missing.*"
                       "dvc exp apply"):
        resume(saved, data_dir)


@pytest.mark.parametrize("rel", [STATE, ARRAY, PACK])
@pytest.mark.parametrize("how", ["truncated", "empty"])
def test_truncated_or_empty_file(saved, data_dir, rel, how):
    path = snapshot_dir(saved) / rel
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else b"")
    with pytest.raises(dvc_dali.CheckpointCorruptError,
                       match=re.escape(rel) + r": \d+ bytes, the manifest says \d+ \(truncated"):
        resume(saved, data_dir)


@pytest.mark.parametrize("rel", [STATE, ARRAY, PACK])
def test_same_size_corruption_fails_digest(saved, data_dir, rel):
    path = snapshot_dir(saved) / rel
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="do not match the crc32 in"):
        resume(saved, data_dir)


def test_a_format_1_checkpoint_still_resumes_and_is_checked(data_dir, tmp_path, monkeypatch):
    """dvc-dali 0.1 wrote format 1: md5 digests only, no packs (each array a
    file of its own). A checkpoint as it wrote it resumes to the same
    batches; damage is still caught by md5."""
    ref = save_rotate(tmp_path / "ref", data_dir)
    monkeypatch.setattr(store, "PACK_BELOW", 0)  # as format 1 was written
    saved = save_rotate(tmp_path / "ckpt", data_dir)
    expect = np.asarray(resume(ref, data_dir).run()[0].as_tensor())

    def as_format_1(m):
        m["format_version"] = 1
        for rel, info in m["files"].items():
            assert set(info) == {"crc32", "size"}  # written outside dvc exp run
            info.pop("crc32")
            info["md5"] = hashlib.md5((snapshot_dir(saved) / rel).read_bytes()).hexdigest()
    edit_manifest(saved, as_format_1)
    ck = dvc_dali.Checkpointer(saved)
    assert ck.step == 3 and ck.arrays["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    pipe = ck.pipeline("train", pipelines.rotate_pipe,
                       **pipelines.make("rotate", str(data_dir))["train"][1])
    assert np.array_equal(np.asarray(pipe.run()[0].as_tensor()), expect)
    path = snapshot_dir(saved) / ARRAY
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="do not match the md5 in"):
        dvc_dali.Checkpointer(saved)


def test_garbage_state_with_valid_digest(saved, data_dir):
    rewrite(saved, STATE, b"\xff\xfe garbage, not protobuf")
    with pytest.raises(dvc_dali.CheckpointCorruptError,
                       match=re.escape(STATE) + ": not a DALI checkpoint.*dvc-dali reset"):
        resume(saved, data_dir)


def test_empty_state_with_valid_digest(saved, data_dir):
    rewrite(saved, STATE, b"")
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="DALI state file is empty"):
        resume(saved, data_dir)


def test_garbage_array_with_valid_digest(saved, data_dir):
    rewrite(saved, ARRAY, b"not an npy file at all")
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="not a readable .npy"):
        dvc_dali.Checkpointer(saved)


def test_pickled_array_is_refused_not_loaded(saved, data_dir):
    buf = __import__("io").BytesIO()
    np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    rewrite(saved, ARRAY, buf.getvalue())
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="not a readable .npy"):
        dvc_dali.Checkpointer(saved)


# -- the manifest ----------------------------------------------------------
def test_edited_manifest_is_noticed(saved):
    path = snapshot_dir(saved) / store.MANIFEST
    text = path.read_text()
    assert '"step":3,' in text
    path.write_text(text.replace('"step":3,', '"step":30,'))
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="manifest.json: does not match "
                       "the md5 recorded in .*LATEST"):
        dvc_dali.Checkpointer(saved)


def test_manifest_not_json(saved):
    rewrite(saved, store.MANIFEST, b"{not json")
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="manifest.json: not valid JSON"):
        dvc_dali.Checkpointer(saved)


@pytest.mark.parametrize("evil", ["../../../etc/passwd", "/etc/passwd", "arrays/../x.npy"])
def test_manifest_paths_cannot_leave_the_checkpoint(saved, evil):
    def change(m):
        m["files"][evil] = m["files"].pop(ARRAY)
        m["arrays"]["w"]["file"] = evil
    edit_manifest(saved, change)
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="paths stay inside the snapshot"):
        dvc_dali.Checkpointer(saved)


def test_newer_format_version(saved):
    edit_manifest(saved, lambda m: m.update(format_version=store.FORMAT_VERSION + 1))
    with pytest.raises(dvc_dali.CheckpointFormatError, match="newer than this dvc-dali reads.*"
                       "upgrade"):
        dvc_dali.Checkpointer(saved)


def test_format_4_only_where_an_ml_dtypes_array_needs_it(tmp_path):
    """A dvc-dali before format 4 read an ml_dtypes array's bits as unsigned
    integers: only a checkpoint holding one is written as 4, which it refuses
    ("newer than this dvc-dali reads"); every other stays readable to it."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for name, value, version in (("plain", np.ones(2, np.float32), 3),
                                 ("bf16", np.ones(2, ml_dtypes.bfloat16), 4)):
        ck = dvc_dali.Checkpointer(tmp_path / name, resume=False)
        ck.save(1, arrays={"w": value})
        ck.close()
        latest = (tmp_path / name / "LATEST").read_text().split()[0]
        manifest = json.loads((tmp_path / name / latest / "manifest.json").read_text())
        assert manifest["format_version"] == version, name
        back = dvc_dali.load(tmp_path / name).arrays["w"]
        assert back.dtype == value.dtype and back.tobytes() == value.tobytes(), name


def test_foreign_manifest(saved):
    edit_manifest(saved, lambda m: m.update(format="orbax"))
    with pytest.raises(dvc_dali.CheckpointFormatError, match="not a dvc-dali manifest"):
        dvc_dali.Checkpointer(saved)


def test_missing_manifest_field(saved):
    edit_manifest(saved, lambda m: m.pop("step"))
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="field 'step' is missing"):
        dvc_dali.Checkpointer(saved)


def test_latest_pointer_garbage(saved):
    (saved / store.LATEST).write_text("../../elsewhere\n")
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="LATEST: does not hold"):
        dvc_dali.Checkpointer(saved)


def test_dali_1x_checkpoint(saved, data_dir):
    """DALI 1.x pickled its pipeline data; DALI 2 fails on it with a bare
    UnpicklingError. Build such bytes: real operator states, pickled context."""
    from dvc_dali.dali import protowire

    real = (snapshot_dir(saved) / STATE).read_bytes()
    ops = b"".join(bytes([0x0A]) + _varint(len(v)) + v
                   for n, _, v in protowire.fields(real) if n == 1)
    ctx_data = pickle.dumps({"iter": 3, "epoch_idx": 0})
    ctx = bytes([0x0A]) + _varint(len(ctx_data)) + ctx_data
    rewrite(saved, STATE, ops + bytes([0x12]) + _varint(len(ctx)) + ctx)
    with pytest.raises(dvc_dali.CheckpointFormatError, match=re.escape(STATE) +
                       ": written by DALI 1.x.*never unpickles"):
        resume(saved, data_dir)


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


# -- a different pipeline --------------------------------------------------
@pytest.mark.parametrize("change,expect", [
    (dict(batch_size=5), "batch_size: 4 -> 5"),
    (dict(shuffle=False), "operators.reader.args.random_shuffle: true -> false"),
    (dict(num_shards=2, shard_id=0), "operators.reader.args.num_shards: 1 -> 2"),
    (dict(num_shards=2, shard_id=1), "operators.reader.args.shard_id: 0 -> 1"),
    (dict(seed=8), "seed: 7 -> 8"),
], ids=["batch_size", "shuffle", "num_shards", "shard_id", "seed"])
def test_different_pipeline_says_what_differs(data_dir, tmp_path, change, expect):
    ckpt = save_rotate(tmp_path / "ckpt", data_dir,
                       **({"num_shards": 2, "shard_id": 0} if "shard_id" in change and
                          change["shard_id"] == 1 else {}))
    with pytest.raises(dvc_dali.PipelineMismatchError) as err:
        resume(ckpt, data_dir, **change)
    msg = str(err.value)
    assert str(ckpt) in msg and "dvc-dali reset" in msg
    assert expect.split(": ")[0] in msg and expect.split(": ")[1].replace(" ", "") in \
        msg.replace(" ", ""), msg


def test_different_file_root(data_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(data_dir / "images", other / "images")
    ckpt = save_rotate(tmp_path / "ckpt", data_dir)
    with pytest.raises(dvc_dali.PipelineMismatchError, match="file_root: .*images.* -> "):
        resume(ckpt, other)


def test_changed_data_under_the_same_file_root(tmp_path):
    data = pipelines.make_data(tmp_path / "data")
    ckpt = save_rotate(tmp_path / "ckpt", data)
    shutil.copy(data / "images/class0/000.jpg", data / "images/class0/999.jpg")
    with pytest.raises(dvc_dali.PipelineMismatchError,
                       match=r"data.reader.file_root: \"files as saved\" -> \"different files\""):
        resume(ckpt, data)


def test_a_pipeline_dali_cannot_build_is_said_in_one_line(tmp_path):
    """The images gone (their class folders left): DALI's build error, said
    in one line naming the operator and the script's line (it was DALI's
    RuntimeError with its C++ context; a resume meets the changed listing
    first, test_changed_data_under_the_same_file_root)."""
    data = pipelines.make_data(tmp_path / "data")
    ckpt = tmp_path / "ckpt"
    for image in (data / "images").rglob("*.jpg"):
        image.unlink()
    with pytest.raises(dvc_dali.PipelineBuildError) as raised:
        resume(ckpt, data)
    assert re.fullmatch(r"DALI could not build pipeline 'train' in its CPU operator "
                        r"nvidia\.dali\.fn\.readers\.file \(made at pipelines\.py, line \d+\): "
                        r"No files found\. Fix the pipeline's arguments or the files it reads, "
                        r"then rerun\.", str(raised.value)), raised.value


@pytest.mark.parametrize("args, error, said", [
    # found where DALI makes its backend, which describing the pipeline does first
    ({"batch_size": 0}, dvc_dali.PipelineBuildError,
     "DALI could not build pipeline 'p': Invalid batch size: 0. Please set a positive integer. "
     "Fix the pipeline's arguments or the files it reads, then rerun."),
    # found at build, as a ValueError
    ({"num_threads": 0}, dvc_dali.PipelineBuildError,
     "DALI could not build pipeline 'p': Pipeline created with `num_threads` < 1 can only be "
     "used for serialization. Fix the pipeline's arguments or the files it reads, then rerun."),
    # a string from a params file: DALI's "incompatible constructor arguments" named none
    ({"batch_size": "8"}, dvc_dali.ConfigError,
     "pipeline 'p': batch_size='8': DALI takes an integer here; pass one (a value read from a "
     "params file may be a string: int(...) it)"),
    ({"seed": 1.5}, dvc_dali.ConfigError,
     "pipeline 'p': seed=1.5: DALI takes an integer here; pass one (a value read from a "
     "params file may be a string: int(...) it)"),
])
def test_a_pipeline_argument_dali_refuses_is_said_in_one_line(tmp_path, data_dir, args, error,
                                                              said):
    """Pipeline arguments as a params.yaml may give them (each was DALI's
    ValueError or TypeError with a traceback through dvc-dali)."""
    @pipeline_def(**{"batch_size": 2, "num_threads": 1, "device_id": None, "seed": 1, **args})
    def labels():
        return fn.readers.file(file_root=str(data_dir / "images"), name="reader")[1]

    ck = dvc_dali.Checkpointer(tmp_path / "ckpt")
    with pytest.raises(error) as raised:
        ck.pipeline("p", labels)
    assert str(raised.value) == said


def test_changed_file_list_contents(tmp_path, data_dir):
    listing = tmp_path / "list.txt"
    files = sorted((data_dir / "images").rglob("*.jpg"))
    listing.write_text("".join(f"{f} {i % 3}\n" for i, f in enumerate(files)))

    @pipeline_def(**CPU, batch_size=2, seed=1)
    def listed():
        jpegs, labels = fn.readers.file(file_list=str(listing), name="reader")
        return labels

    ck = dvc_dali.Checkpointer(tmp_path / "ckpt")
    ck.pipeline("p", listed).run()
    ck.save(1)
    listing.write_text("".join(f"{f} {i % 3}\n" for i, f in enumerate(reversed(files))))
    with pytest.raises(dvc_dali.PipelineMismatchError, match="data.reader.file_list"):
        dvc_dali.Checkpointer(tmp_path / "ckpt").pipeline("p", listed)


def _two_uniforms(order):
    @pipeline_def(**CPU, batch_size=2, seed=3)
    def p():
        a = b = None
        for which in order:
            if which == "a":
                a = fn.random.uniform(range=(0.0, 1.0))
            else:
                b = fn.random.uniform(range=(10.0, 20.0))
        return a, b
    return p


def test_swapped_unnamed_operators(tmp_path):
    with pytest.warns(dvc_dali.UnnamedOperatorWarning):
        ck = dvc_dali.Checkpointer(tmp_path / "ckpt")
        ck.pipeline("p", _two_uniforms("ab")).run()
    ck.save(1)
    with pytest.raises(dvc_dali.PipelineMismatchError, match=r"__Uniform_0.args.range: "
                       r"\[0.0, 1.0\] -> \[10.0, 20.0\]"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dvc_dali.UnnamedOperatorWarning)
            dvc_dali.Checkpointer(tmp_path / "ckpt").pipeline("p", _two_uniforms("ba"))


def test_extra_operator(tmp_path):
    @pipeline_def(**CPU, batch_size=2, seed=3)
    def one():
        return fn.random.uniform(name="u")

    @pipeline_def(**CPU, batch_size=2, seed=3)
    def two():
        return fn.random.uniform(name="u"), fn.random.normal(name="n")

    ck = dvc_dali.Checkpointer(tmp_path / "ckpt")
    ck.pipeline("p", one).run()
    ck.save(1)
    with pytest.raises(dvc_dali.PipelineMismatchError,
                       match=r"operator n: <absent> -> random__Normal"):
        dvc_dali.Checkpointer(tmp_path / "ckpt").pipeline("p", two)


def test_a_pipeline_registered_after_the_checkpoint_starts_from_its_beginning(
        saved, data_dir, tmp_path, capsys):
    """A validation pipeline built at its first use, after the checkpoint
    was written: it starts fresh, as it did in the run that wrote it (it was
    refused, naming a fix that could not be followed: found by a sweep)."""
    fn_, kw = pipelines.make("rotate", str(data_dir))["train"]
    fresh = dvc_dali.Checkpointer(tmp_path / "fresh").pipeline("val", fn_, **kw)
    ck = dvc_dali.Checkpointer(saved)
    capsys.readouterr()
    late = ck.pipeline("val", fn_, **kw)
    assert "pipeline 'val' is not in " in capsys.readouterr().err
    for _ in range(3):
        got, want = late.run(), fresh.run()
        assert all(np.array_equal(np.asarray(g.as_tensor()), np.asarray(w.as_tensor()))
                   for g, w in zip(got, want))


def test_a_pipeline_not_registered_on_resume_is_said_at_the_first_save(saved, tmp_path,
                                                                        capsys):
    """Found by a sweep: the next checkpoint dropped its position without a word."""
    ck = dvc_dali.Checkpointer(saved)
    capsys.readouterr()
    ck.save(ck.step + 1)
    ck.save(ck.step + 2)
    said = capsys.readouterr().err
    assert said.count("pipeline(s) 'train' of the checkpoint at step ") == 1, said
    ck.close()


# -- external_source forms DALI cannot restore -----------------------------
def _es_pipe(source, **es_kw):
    @pipeline_def(**CPU, batch_size=2, seed=1)
    def p():
        return fn.external_source(source=source, **es_kw)
    return p


def test_external_source_forms(tmp_path):
    def gen():
        while True:
            yield [np.zeros(2, np.float32)] * 2

    unsupported = {
        "a generator function": _es_pipe(gen),
        "an iterable": _es_pipe([[np.zeros(2, np.float32)] * 2] * 3, cycle=True),
        "a parameterless callable": _es_pipe(lambda: [np.zeros(2, np.float32)] * 2),
        "feed_input": _es_pipe(None, name="fed"),
    }
    said = {"a generator function": "has a generator function source",
            "an iterable": "has an iterable source",  # it said "a iterable": a sweep
            "a parameterless callable": "has a callable without arguments",
            "feed_input": "has no source"}
    for form, p in unsupported.items():
        with pytest.raises(dvc_dali.UnsupportedPipelineError,
                           match="cannot save its position.*SampleInfo.*BatchInfo") as got:
            dvc_dali.Checkpointer(tmp_path / "x").pipeline("p", p)
        assert said[form] in str(got.value), str(got.value)
    ok = _es_pipe(lambda info: np.full(2, info.idx_in_epoch, np.float32), batch=False)
    ck = dvc_dali.Checkpointer(tmp_path / "ok")
    pipe = ck.pipeline("p", ok)
    pipe.run()
    ck.save(1)
    again = dvc_dali.Checkpointer(tmp_path / "ok").pipeline("p", ok)
    assert np.array(again.run()[0][0]).tolist() == [2.0, 2.0]


def test_unnamed_stateful_operator_warns_with_fix(tmp_path):
    @pipeline_def(**CPU, batch_size=2, seed=1)
    def p():
        return fn.random.uniform()

    with pytest.warns(dvc_dali.UnnamedOperatorWarning, match=r"__Uniform_0.*name="):
        dvc_dali.Checkpointer(tmp_path / "c").pipeline("p", p)


def test_named_operators_do_not_warn(tmp_path, data_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error", dvc_dali.UnnamedOperatorWarning)
        save_rotate(tmp_path / "ckpt", data_dir)


# -- arrays and metadata ---------------------------------------------------
def test_arrays_and_metadata_round_trip_exactly(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {
        "float32": rng.standard_normal((7, 3)).astype(np.float32),
        "float64": rng.standard_normal(5),
        "nan_inf": np.array([np.nan, np.inf, -np.inf, -0.0]),
        "int8": np.array([-128, 0, 127], np.int8),
        "uint16": np.arange(10, dtype=np.uint16).reshape(2, 5),
        "bool": np.array([True, False]),
        "complex": np.array([1 + 2j], np.complex64),
        "scalar": np.float64(3.5),
        "empty": np.zeros((0, 4), np.float32),
        "fortran": np.asfortranarray(rng.standard_normal((3, 4))),
        "bigendian": np.arange(3, dtype=">i4"),
        "layer1/weight.with odd name": np.ones(2),
    }
    meta = {"lr": 0.01, "name": "run", "nested": {"a": [1, 2]}}
    dvc_dali.Checkpointer(tmp_path / "c").save(42, arrays=arrays, metadata=meta)
    back = dvc_dali.Checkpointer(tmp_path / "c")
    assert back.resumed and back.step == 42 and back.metadata == meta
    assert set(back.arrays) == set(arrays)
    for name, value in arrays.items():
        got = back.arrays[name]
        assert got.dtype == np.asarray(value).dtype and got.shape == np.shape(value), name
        assert np.asarray(value).tobytes() == np.ascontiguousarray(got).tobytes() or \
            np.array_equal(got, value, equal_nan=True), name


def test_object_arrays_and_bad_metadata_are_refused(tmp_path):
    ck = dvc_dali.Checkpointer(tmp_path / "c")
    with pytest.raises(TypeError, match="Python objects, which would need pickle"):
        ck.save(1, arrays={"o": np.array([object()])})
    with pytest.raises(TypeError, match="metadata and params must be plain JSON"):
        ck.save(1, metadata={"x": object()})
    assert not (tmp_path / "c" / store.LATEST).exists()


def test_fresh_start_and_resume_false(saved):
    assert dvc_dali.Checkpointer(saved.parent / "nothing").step == 0
    ck = dvc_dali.Checkpointer(saved, resume=False)
    assert not ck.resumed and ck.step == 0 and ck.arrays == {}


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_checkpoint_after_close_is_refused(tmp_path, asynchronous):
    """close() lets another writer have the directory: a save through the
    closed Checkpointer would write beside it, unlocked; it is refused, and
    a new Checkpointer goes on from the last checkpoint."""
    ck = dvc_dali.Checkpointer(tmp_path / "c", asynchronous=asynchronous, rng=False)
    ck.make_checkpoint(1, arrays={"w": np.zeros(2)})
    ck.close()
    ck.close()  # twice: nothing more to do
    for call in (ck.save, ck.make_checkpoint):
        with pytest.raises(dvc_dali.ConfigError, match=r"is closed: it no longer holds the "
                                                        r"directory .* step 2 is not saved"):
            call(2, arrays={"w": np.ones(2)})
    again = dvc_dali.Checkpointer(tmp_path / "c", rng=False)
    assert again.step == 1
    again.close()


@pytest.mark.parametrize("inside_dvc", [False, True])
def test_a_checkpoint_directory_with_a_name_near_the_limit_saves_and_resumes(tmp_path,
                                                                            inside_dvc):
    """A name of 240 bytes (80 CJK characters), valid for the file system:
    the lock file named after it was too long, refused as a directory that
    cannot be written (found by a sweep)."""
    import dvc_dali

    if inside_dvc:
        (tmp_path / ".dvc").mkdir()
    ckpt = tmp_path / ("検" * 80)
    ck = dvc_dali.Checkpointer(ckpt)
    ck.save(3, arrays={"w": np.arange(3)})
    ck.close()
    again = dvc_dali.Checkpointer(ckpt)
    assert again.step == 3 and list(again.arrays["w"]) == [0, 1, 2]
    again.close()
