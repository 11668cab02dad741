"""The pure parts of the batch proof (dvc_dali/proof/batch_digests.py): what
differs between two digests, what a companion file yields when torn or
forged, which manifest holds the digests after a checkpoint, the setting."""

from __future__ import annotations

import dataclasses
import json
import zlib

import numpy as np
import pytest

from dvc_dali.proof import batch_digests as bd
from dvc_dali.training import restorable as rs
from dvc_dali.core.context import RunContext
from dvc_dali.core.errors import ConfigError

A = "uint8/0000aaaa/c11111111"
ID1, ID2 = "1" * 32, "2" * 32


@pytest.mark.parametrize("want, got, said", [
    ([A], [A], []),
    ([A], ["float/0000aaaa/c11111111"], ["output 0: dtype uint8 -> float"]),
    (["uint8/0000aaaa/crc32:11111111"], ["uint8/0000bbbb/crc32:11111111"],
     ["output 0: sample shapes differ"]),
    ([A], ["uint8/0000aaaa/c22222222"], ["output 0: same dtype and shapes, other bytes"]),
    ([A, A], [A, "uint8/0000aaaa/c22222222"], ["output 1: same dtype and shapes, other bytes"]),
    ([A], [A, A], ["2 outputs where 1 were produced"]),
    # a host CRC and a device sum are not comparable: no difference shown (nor a
    # match: test_each_check_ends_matched_differs_or_not_verified)
    ([A], ["uint8/0000aaaa/g" + "0" * 16], []),
])
def test_differences(want, got, said):
    assert bd.differences(want, got) == said


C32 = "uint8/0000aaaa/crc32:11111111"  # a host CRC-32, named
G = "uint8/0000aaaa/gwsum1:" + "1" * 16  # the device sum, named
OTHER = "recorded by another digest algorithm"
UNREADABLE = "a recorded digest is unreadable"
MATCHED, DIFFERS, NOT_VERIFIED = "matched", "differs", "not verified"  # bd's outcomes


@pytest.mark.parametrize("want, got, outcome, said", [
    ([C32], [C32], MATCHED, ()),
    # unnamed, as dvc-dali wrote them before: c is the same CRC-32, g the same device sum
    ([A], [C32], MATCHED, ()),
    (["uint8/0000aaaa/g" + "1" * 16], [G], MATCHED, ()),
    ([A], ["uint8/0000aaaa/crc32:22222222"], DIFFERS,
     ("output 0: same dtype and shapes, other bytes",)),
    # as dvc-dali a4ef8da recorded a batch of the example (unnamed: the CRC of
    # repr(tl.shape())) and as this one digests the same dense batch ("<n>x<shape>"):
    # the shapes fields differ, the bytes agree: not verified, never "differs"
    (["float/c9a40b90/ccc2048bc", "int32/0d9c1175/c799f4d44"],
     ["float/734f9719/crc32:cc2048bc", "int32/bf5b96ad/crc32:799f4d44"], NOT_VERIFIED,
     ("recorded by an older dvc-dali, which wrote sample shapes another way",)),
    # ...but other bytes under such a field are a difference all the same
    ([A], ["uint8/0000bbbb/crc32:22222222"], DIFFERS, ("output 0: same dtype, other bytes",)),
    ([A], ["float/0000bbbb/crc32:11111111"], DIFFERS, ("output 0: dtype uint8 -> float",)),
    ([C32], ["float/0000aaaa/crc32:11111111"], DIFFERS, ("output 0: dtype uint8 -> float",)),
    # two kinds (a host CRC, a device sum): nothing comparable, whatever the fields say
    ([G], [C32], NOT_VERIFIED, (OTHER,)),
    (["uint8/0000aaaa/g" + "1" * 16], [C32], NOT_VERIFIED, (OTHER,)),
    ([A], [G], NOT_VERIFIED, (OTHER,)),
    (["float/0000bbbb/g" + "0" * 16], ["float32/0000aaaa/crc32:11111111"], NOT_VERIFIED,
     (OTHER,)),
    # another (a later, an unknown) algorithm, even with the same value
    (["uint8/0000aaaa/mix64:" + "1" * 16], [C32], NOT_VERIFIED, (OTHER,)),
    ([C32, G], [C32, C32], NOT_VERIFIED, (OTHER,)),  # one output matched is no proof
    # a difference shown by one output is one, whatever another cannot tell
    ([G, C32], [C32, "uint8/0000aaaa/crc32:22222222"], DIFFERS,
     ("output 1: same dtype and shapes, other bytes",)),
    ([G], [C32, C32], DIFFERS, ("2 outputs where 1 were produced",)),
    # nothing recorded, a digest that failed then or now, one that cannot be read
    (None, [C32], NOT_VERIFIED, ("no digest was recorded for it",)),
    (["failed:RuntimeError"], [C32], NOT_VERIFIED,
     ("its digest failed while it was recorded (RuntimeError)",)),
    ([C32], ["failed:MemoryError"], NOT_VERIFIED, ("its digest failed now (MemoryError)",)),
    (["uint8/0000aaaa/-"], [C32], NOT_VERIFIED, ("a recorded digest is unreadable",)),
    (["../etc"], [C32], NOT_VERIFIED, ("a recorded digest is unreadable",)),
    (["uint8/0000aaaa/CRC32:11111111"], [C32], NOT_VERIFIED,
     ("a recorded digest is unreadable",)),
    # the same unreadable text on both sides is no match (check's fast path for equal digests)
    (["uint8/0000aaaa/-"], ["uint8/0000aaaa/-"], NOT_VERIFIED,
     ("a recorded digest is unreadable",)),
    (["uint8/0000aaaa/crc32:"], ["uint8/0000aaaa/crc32:"], NOT_VERIFIED,
     ("a recorded digest is unreadable",)),
    # a hand-edited value or shapes field of a width no run wrote: unreadable, not
    # "other bytes" (found by a sweep: a false refusal)
    (["uint8/0000aaaa/crc32:111111111"], [C32], NOT_VERIFIED, (UNREADABLE,)),
    (["uint8/0000aaaa/crc32:1111111"], [C32], NOT_VERIFIED, (UNREADABLE,)),
    (["uint8/0000aaaa/c111111111"], [C32], NOT_VERIFIED, (UNREADABLE,)),
    (["uint8/0000aaaa/gwsum1:" + "1" * 15], [G], NOT_VERIFIED, (UNREADABLE,)),
    (["uint8/0000aaaa/g" + "1" * 17], [G], NOT_VERIFIED, (UNREADABLE,)),
    (["uint8/0000aaa/crc32:11111111"], [C32], NOT_VERIFIED, (UNREADABLE,)),
    (["uint8/0000aaaax/crc32:11111111"], [C32], NOT_VERIFIED, (UNREADABLE,)),
    ([C32, "uint8/0000aaaa/crc32:0011111111"], [C32, C32], NOT_VERIFIED, (UNREADABLE,)),
    # a record of no output, or of another number with one unreadable: no run wrote
    # it, so it shows no difference (it was refused: "1 outputs where 0 were produced")
    ([], [C32], NOT_VERIFIED, ("a recorded digest is unreadable",)),
    (["uint8/0000aaaa/-", C32], [C32], NOT_VERIFIED, ("a recorded digest is unreadable",)),
])
def test_each_check_ends_matched_differs_or_not_verified(want, got, outcome, said):
    found = bd.check(want, got)
    assert (found.outcome, found.lines) == (outcome, said)
    if want is not None:
        assert bd.differences(want, got) == (list(said) if outcome == DIFFERS else [])


def test_a_manifest_digest_of_another_width_is_unreadable_not_other_bytes():
    """The manifest's schema takes 8 to 64 hex digits of any algorithm; a
    hand-edited crc32 of 9 (or mix64 of 8) was compared as other bytes: a
    false refusal of the resume."""
    got = bd.digest_arrays([np.arange(6, dtype=np.uint8)])
    for wide in (got[0] + "0", got[0].replace(f"{bd.HOST}:", f"{bd.DEVICE}:")):
        record = {"log": ID2, "previous": ID1, "digests": [[wide]]}
        want = bd.from_manifest({"pipelines": {"train": {bd.KEY: record}}}, ID1)["train"][0]
        assert (bd.check(want, got).outcome, bd.check(want, got).reason) == (
            NOT_VERIFIED, UNREADABLE), wide


def test_what_is_stored_names_the_algorithm():
    from nvidia.dali.tensors import TensorListCPU

    for out in (bd.digest([TensorListCPU(np.zeros((2, 3), np.uint8))]),
                bd.digest([TensorListCPU([np.zeros(2, np.uint8), np.zeros(3, np.uint8)])]),
                bd.digest_arrays([np.zeros((2, 3), np.uint8)])):
        assert bd.parse_output(out[0])[2] == bd.HOST and f"/{bd.HOST}:" in out[0], out
    # the same CRC-32 of the same bytes as the unnamed c<8 hex> of before
    value = bd.parse_output(bd.digest_arrays([np.arange(6, dtype=np.uint8)])[0])[3]
    assert value == f"{zlib.crc32(bytes(range(6))):08x}"


@pytest.mark.parametrize("checks, proven, line", [
    ([(MATCHED,)] * 3, True, "pipeline 'train': the 3 batches after the checkpoint at step 20 "
     "are those the run it resumes produced"),
    ([(MATCHED,)], True, "pipeline 'train': the batch after the checkpoint at step 20 is the "
     "one the run it resumes produced"),
    ([(NOT_VERIFIED, (OTHER,))] * 2, False,
     "pipeline 'train': batch digests of the 2 batches after the checkpoint at step 20: "
     f"batches 1-2 not verified ({OTHER}); so this resume is not proven exact"),
    ([(MATCHED,), (NOT_VERIFIED, ("no digest was recorded for it",)), (MATCHED,), (MATCHED,)],
     False,
     "pipeline 'train': batch digests of the 4 batches after the checkpoint at step 20: batch "
     "1 matched; batch 2 not verified (no digest was recorded for it); batches 3-4 matched; so "
     "this resume is not proven exact"),
])
def test_the_resume_line_says_which(checks, proven, line):
    """Batches are counted after the checkpoint, not named by step: a
    stream may give several a step (found by a sweep: 'steps 3-15' was said
    of 13 batches in 8 steps)."""
    checks = [bd.Check(*c) for c in checks]
    said = bd.summary("pipeline", "train", 20, checks)
    assert said[0] == proven and said[1].startswith(line), said
    assert ("the run it resumes produced" in said[1]) == proven
    # doctor --verify counts batches, from 1
    assert bd.outcomes(checks[:2], 1, "batch").startswith(("batches 1-2 ", "batch 1 "))


def _resumed(tmp_path, recorded):
    rec = bd.Recorder(tmp_path, bd.ALL, False)
    rec.resume(ID1, {"s": recorded}, 20, lambda name: "x", "m", {"s"})
    rec.track("s", "dataset")
    return rec


def test_a_resume_of_digests_of_another_kind_says_not_verified_once(tmp_path, capsys):
    batches = [[np.full((2, 3), i, np.uint8)] for i in range(4)]
    ours = [bd.digest_arrays(b) for b in batches]
    other = [[o.replace(f"{bd.HOST}:", "g") + "0" * 8 for o in d] for d in ours]  # a device's
    rec = _resumed(tmp_path, other[:2] + ours[2:3])
    for b in batches:
        rec.observe("s", b, bd.digest_arrays)
    err = capsys.readouterr().err
    assert err.count("not verified") == 1 and "are those the run it resumes produced" not in err
    assert ("dataset 's': batch digests of the 3 batches after the checkpoint at step 20: "
            f"batches 1-2 not verified ({OTHER}); batch 3 matched") in err, err
    # the next checkpoint's manifest holds this run's digests, of today's algorithm
    entries = rec.checkpoint({"s": {}})
    assert entries["s"][bd.KEY]["digests"] == ours


def test_a_digest_that_fails_while_recording_marks_its_batch_and_says_so_once(tmp_path, capsys):
    rec = bd.Recorder(tmp_path, bd.ALL, False)
    rec.track("s", "dataset")
    rec.checkpoint({"s": {}})  # the segment after a checkpoint: recorded
    log_id = rec.log_id

    def flaky(batch):
        if int(batch[0][0, 0]) in (1, 2):
            raise RuntimeError("no device memory")
        return bd.digest_arrays(batch)

    batches = [[np.full((2, 3), i, np.uint8)] for i in range(4)]
    for b in batches:
        rec.observe("s", b, flaky)
    err = capsys.readouterr().err
    assert err.count("digest of batch") == 1 and "RuntimeError: no device memory" in err, err
    kept = bd.read_companion(tmp_path, log_id)["s"]  # none dropped after the failure
    assert kept == [bd.digest_arrays(batches[0]), ["failed:RuntimeError"],
                    ["failed:RuntimeError"], bd.digest_arrays(batches[3])]
    rec = _resumed(tmp_path, kept)
    for b in batches:
        rec.observe("s", b, bd.digest_arrays)
    err = capsys.readouterr().err
    assert ("dataset 's': batch digests of the 4 batches after the checkpoint at step 20: "
            "batch 1 matched; batches 2-3 not verified (its digest failed while it was "
            "recorded (RuntimeError)); batch 4 matched") in err, err
    assert "are those the run it resumes produced" not in err


def test_companion_file_keeps_whole_lines_in_order(tmp_path):
    lines = [json.dumps({"p": "train", "i": i, "d": [A]}) for i in range(3)]
    text = "\n".join([lines[0], lines[1], "{not json", json.dumps({"p": "train", "i": 5,
                                                                    "d": [A]}),
                      lines[2], '{"p": "train", "i": 3, "d": ["uint8/'])  # torn by a kill
    (tmp_path / f"{ID1}.jsonl").write_text(text)
    assert bd.read_companion(tmp_path, ID1) == {"train": [[A], [A], [A]]}
    assert bd.read_companion(tmp_path, "../" + ID1[3:]) == {}  # never a path outside
    assert bd.read_companion(tmp_path, ID2) == {}


def test_the_next_manifest_holds_the_digests_after_a_checkpoint():
    manifest = {"pipelines": {
        "train": {bd.KEY: {"log": ID2, "previous": ID1, "digests": [[A]]}},
        "val": {bd.KEY: {"log": ID2, "previous": None, "digests": []}},
        "tf": {"kind": "tensorflow"}}}
    assert bd.from_manifest(manifest, ID1) == {"train": [[A]]}
    assert bd.from_manifest(manifest, ID2) == {}
    assert bd.log_id_of(manifest) == ID2
    assert bd.log_id_of({"pipelines": {"tf": {}}}) is None


def test_what_changed_names_the_dali_version_and_the_files():
    said = bd.what_changed({"dali": "2.3.0"}, {"dali": "2.4.0"}, ["reader.file_root: changed a"])
    assert said == "DALI 2.3.0 -> 2.4.0; reader.file_root: changed a"
    same = bd.what_changed({"dali": "2.4.0"}, {"dali": "2.4.0"}, [])
    assert same.startswith("the DALI version, the data") and "external_source callable" in same
    # another DALI, the data's listing unchanged: the version may not be the cause
    other = bd.what_changed({"dali": "2.4.0"}, {"dali": "2.3.0"}, [])
    assert other.startswith("DALI 2.4.0 -> 2.3.0; the data files' names and sizes and the "
                            "pipeline's description are unchanged; a file rewritten in place")
    # another dvc-dali (an upgrade mid-run): named, beside DALI's
    upgraded = bd.what_changed({"dali": "2.4.0", "dvc_dali": "0.1.0"},
                               {"dali": "2.4.0", "dvc_dali": "0.2.0"}, [])
    assert upgraded.startswith("dvc-dali 0.1.0 -> 0.2.0; the DALI version, the data files'")
    both = bd.what_changed({"dali": "2.3.0", "dvc_dali": "0.1.0"},
                           {"dali": "2.4.0", "dvc_dali": "0.2.0"}, ["x: changed a"])
    assert both == "DALI 2.3.0 -> 2.4.0; dvc-dali 0.1.0 -> 0.2.0; x: changed a"


def test_companion_dir_is_outside_the_checkpoint_output(tmp_path):
    (tmp_path / "repo" / ".dvc").mkdir(parents=True)
    ckpt = tmp_path / "repo" / "checkpoint"
    assert bd.companion_dir(ckpt, {}) == tmp_path / "repo" / bd.COMPANION
    # a --temp run's: the workspace's, where a later run looks
    (tmp_path / "ws" / ".dvc").mkdir(parents=True)
    assert bd.companion_dir(ckpt, {"DVC_ROOT": str(tmp_path / "ws")}) == (
        tmp_path / "ws" / bd.COMPANION)
    assert bd.companion_dir(tmp_path / "plain" / "ck", {}) == (
        tmp_path / "plain" / ".ck.dvc-dali-batches")
    # DVC_ROOT naming no DVC repository (left set by hand, a stale shell): not
    # used, so no `.dvc` is made there, which would make a DVC repository of
    # it to every later run (found by a sweep: /tmp/.dvc)
    for stray in (tmp_path / "plain", tmp_path / "missing"):
        (tmp_path / "plain").mkdir(exist_ok=True)
        assert bd.companion_dir(ckpt, {"DVC_ROOT": str(stray)}) == (
            tmp_path / "repo" / bd.COMPANION)


@pytest.mark.parametrize("value, want", [(None, -1), ("", -1), ("all", -1), ("0", 0),
                                         ("16", 16)])
def test_verify_batches_setting(value, want):
    env = {} if value is None else {"DVC_DALI_VERIFY_BATCHES": value}
    assert RunContext.from_environ(env).verify_batches == want


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_a_bad_verify_batches_names_the_variable(value):
    with pytest.raises(ConfigError, match="DVC_DALI_VERIFY_BATCHES"):
        RunContext.from_environ({"DVC_DALI_VERIFY_BATCHES": value})


def test_pruning_keeps_the_newest_companion_files(tmp_path, monkeypatch):
    monkeypatch.setattr(bd, "_KEEP_LOGS", 3)
    made = [bd._new_log_id() for _ in range(5)]  # in creation order
    assert made == sorted(made) and all(len(i) == 32 and bd._valid_id(i) for i in made)
    for log_id in reversed(made):  # written newest first: the name decides, not the mtime
        (tmp_path / f"{log_id}.jsonl").write_text("{}\n")
    bd._prune(tmp_path)
    assert sorted(p.stem for p in tmp_path.iterdir()) == made[2:]



@pytest.mark.parametrize("a, b, equal", [
    ([np.zeros((4, 3), np.uint8)], [np.zeros((3, 4), np.uint8)], False),  # shapes
    ([np.zeros((4, 3), np.uint8)], [np.zeros((4, 3), np.int8)], False),  # dtype
    ([np.zeros((4, 3), np.uint8)], [np.eye(4, 3, dtype=np.uint8)], False),  # bytes
    ([[np.ones(2), np.ones(3)]], [[np.ones(3), np.ones(2)]], False),  # ragged: the order
    ([[np.ones(2)]], [np.ones((1, 2))], True),  # one sample, ragged or dense: the same
    ([np.arange(6).reshape(2, 3)], [np.arange(6).reshape(2, 3)], True),
])
def test_host_arrays_digest_tells_shapes_dtypes_and_bytes(a, b, equal):
    da, db = bd.digest_arrays(a), bd.digest_arrays(b)
    assert (da == db) == equal, bd.differences(da, db)


def test_a_dali_batch_digest_tells_sample_order_shapes_and_bytes():
    """Dense batches take the one-buffer path, ragged ones the per-sample one."""
    from nvidia.dali.tensors import TensorListCPU

    def of(*samples):
        return bd.digest([TensorListCPU([np.asarray(s, np.uint8) for s in samples])])

    a, b = np.zeros((2, 3)), np.ones((3, 2))
    assert of(a, b) == of(a, b)
    assert of(a, b) != of(b, a)  # ragged: the order of the shapes
    assert of(a, a) != of(a, np.eye(2, 3))  # dense: the bytes
    assert of(a, a) != of(a.reshape(3, 2), a.reshape(3, 2))  # dense: the shape
    assert bd.differences(of(a, a), of(a, a, a)) == ["output 0: sample shapes differ"]


@dataclasses.dataclass
class _Entry:
    """A manifest entry as its Restorable captures it (a pipeline's, a
    dynamic-mode Checkpoint's): what the proof annotates."""

    section: str
    name: str
    value: dict

    def capture(self) -> dict:
        return dict(self.value)


def _into_manifest(recorder, pipelines, dynamic, readers):
    """The entries given with the proof's records, through the Checkpointer's
    own path (restorable.BatchProof into restorable.assemble); returns
    (pipelines, dynamic) as the manifest gets them."""
    entries = [_Entry(rs.PIPELINES, name, value) for name, value in pipelines.items()]
    entries += [_Entry(rs.DYNAMIC, name, value) for name, value in dynamic.items()]
    proof = rs.BatchProof(recorder=recorder, readers=readers, versions=dict,
                          sources={(e.section, e.name): None for e in entries})
    parts = rs.assemble([*entries, proof])
    return parts[rs.PIPELINES], parts[rs.DYNAMIC]


def test_dynamic_mode_readers_digests_sit_under_their_checkpoints_entry(tmp_path):
    """A dynamic-mode reader is no pipeline: its digests go to the manifest's
    dynamic part, under its Checkpoint's entry by reader name, and are found
    there under its stream name ("<Checkpoint name>/<reader name>")."""
    rec = bd.Recorder(tmp_path, bd.ALL, False)
    stream, readers = bd.dynamic_stream("dyn", "reader"), {"dyn/reader": ("dyn", "reader")}
    assert stream == "dyn/reader" and rec.track(stream, "dynamic-mode reader")
    _, dynamic = _into_manifest(rec, {"train": {}}, {"dyn": {"state": "{}"}}, readers)
    first = dynamic["dyn"][bd.KEY]["reader"]
    assert first["previous"] is None and first["digests"] == []
    batch = [np.arange(6, dtype=np.uint8).reshape(2, 3), [np.zeros(2), np.zeros(3)]]
    rec.observe(stream, batch, bd.digest_arrays)
    pipelines, dynamic = _into_manifest(rec, {"train": {}}, {"dyn": {"state": "{}"}}, readers)
    assert pipelines == {"train": {}}  # not tracked: nothing added
    manifest = {"pipelines": pipelines, "dynamic": dynamic}
    assert bd.from_manifest(manifest, first["log"]) == {stream: [bd.digest_arrays(batch)]}
    assert bd.log_id_of(manifest) == dynamic["dyn"][bd.KEY]["reader"]["log"]
    assert bd.log_id_of({"pipelines": {}, "dynamic": {"dyn": {"file": "x"}}}) is None


def test_a_dynamic_mode_readers_mismatch_names_it(tmp_path):
    rec = bd.Recorder(tmp_path, bd.ALL, False)
    rec.resume(ID1, {"dyn/reader": [["uint8/0000aaaa/c11111111"]]}, 2, lambda name: "x", "m",
               {"dyn/reader"})
    rec.track("dyn/reader", "dynamic-mode reader")
    with pytest.raises(bd.BatchMismatchError, match=r"dynamic-mode reader 'dyn/reader': batch "
                       r"1 after the checkpoint at step 2 \(m; step 3 where it gives one "
                       r"batch a step\)"):
        rec.observe("dyn/reader", [np.zeros((1, 2), np.uint8)], bd.digest_arrays)


def test_companion_files_beyond_the_newest_200_are_removed(tmp_path):
    old = [f"{i:016x}{'0' * 16}.jsonl" for i in range(1, 206)]  # older ids sort first
    for name in old:
        (tmp_path / name).write_bytes(b"")
    rec = bd.Recorder(tmp_path, bd.ALL, False)
    rec.track("s", "dataset")
    rec.checkpoint({"s": {}})  # a new segment, the pruning handed to the thread
    assert bd._digest_thread().drain()  # jobs run in order: the pruning ran before this
    left = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    # the new segment's file made (by the thread, after the save) and kept
    assert len(left) == bd._KEEP_LOGS and left[-1] == f"{rec.log_id}.jsonl"
    assert left[0] == old[6]  # the 6 oldest went
    rec.observe("s", [np.zeros(3, np.uint8)], bd.digest_arrays)
    assert (tmp_path / f"{rec.log_id}.jsonl").read_bytes().count(b"\n") == 1
    rec.close()


def test_a_segment_closed_before_the_thread_made_its_file_gets_it_empty(tmp_path):
    """A save, then close() before the digest thread got to the new segment's
    file (the thread held busy here, as a loaded machine does): the file is
    made all the same, empty, so a resume of that checkpoint finds that no
    batch followed it, not digests lost."""
    import threading

    rec = bd.Recorder(tmp_path, bd.ALL, False)
    rec.track("s", "dataset")
    go = threading.Event()
    bd._digest_thread().submit(go.wait)
    rec.checkpoint({"s": {}})
    rec.close()
    assert not (tmp_path / f"{rec.log_id}.jsonl").exists()  # the thread has not run yet
    go.set()
    assert bd._digest_thread().drain()
    assert (tmp_path / f"{rec.log_id}.jsonl").read_bytes() == b""
    assert rec._log is None  # nothing left open


def test_companion_files_are_pruned_at_the_first_checkpoint_and_every_50th(tmp_path,
                                                                           monkeypatch):
    pruned = []
    monkeypatch.setattr(bd, "_prune", pruned.append)
    rec = bd.Recorder(tmp_path, bd.ALL, False)
    rec.track("s", "dataset")
    for _ in range(101):
        rec.checkpoint({"s": {}})
    assert bd._digest_thread().drain()  # jobs run in order
    assert [d for d in pruned if d == tmp_path] == [tmp_path] * 3  # checkpoints 1, 51, 101
    rec.close()


def test_the_refusal_of_a_differing_batch_is_public_and_a_pipeline_mismatch():
    """The guides and the Keras callback name BatchMismatchError as the error to
    catch, but `dvc_dali.BatchMismatchError` was an AttributeError (found by a
    sweep)."""
    import dvc_dali
    from dvc_dali.proof import batch_digests

    assert "BatchMismatchError" in dvc_dali.__all__
    assert dvc_dali.BatchMismatchError is batch_digests.BatchMismatchError
    assert issubclass(dvc_dali.BatchMismatchError, dvc_dali.PipelineMismatchError)


def test_a_digest_that_fails_on_the_digest_thread_is_recorded_failed_and_said_once(
        tmp_path, capsys):
    """A `tf_dataset`'s elements are hashed on the digest thread: one whose
    digest raises there is recorded as failed (a resume says it is not
    verified), never dropped, and said once."""
    rec = bd.Recorder(tmp_path, bd.ALL, False)
    rec.track("s", "dataset")
    rec.checkpoint({"s": {}})

    def fails(batch):
        raise MemoryError("no memory for the digest")

    for _ in range(3):
        rec.observe("s", [np.zeros(2)], fails, deferred=True)
    rec.close()
    assert rec.costs.background == 3, rec.costs
    assert bd.read_companion(tmp_path, rec.log_id)["s"] == [["failed:MemoryError"]] * 3
    assert capsys.readouterr().err.count("no memory for the digest") == 1


@pytest.mark.parametrize("shape", [(4, 0), (0,), (2, 0, 3)])
def test_samples_of_zero_bytes_get_a_digest_of_their_shapes(shape):
    """A view with a 0 in its shape cannot be cast to bytes: such batches
    were recorded as failed and never verified (found by a sweep). Their
    digest is the CRC of no bytes, under their shapes."""
    zero = bd.digest_arrays([np.zeros(shape, np.float32)])
    assert bd.parse_output(zero[0]) and not zero[0].startswith(bd.FAILED)
    assert zero != bd.digest_arrays([np.zeros((4, 1), np.float32)])
    assert zero == bd.digest_arrays([np.zeros(shape, np.float32)])


def test_a_dali_batch_of_zero_size_samples_is_digested(tmp_path):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def empty():
        return fn.external_source(source=lambda: np.zeros((0, 3), np.float32), batch=False,
                                  dtype=types.FLOAT)

    pipe = empty()
    pipe.build()
    (value,) = bd.digest(pipe.run())
    assert bd.parse_output(value) and not value.startswith(bd.FAILED), value


@pytest.mark.parametrize("tail, kept", [
    (b'{"p": "s", "i": 1, "d": ["uint8/0000aaaa/c1', 1),  # torn by a kill: cut
    (b"", 1),
    (None, 2),  # the second line whole
])
def test_a_resume_appends_after_a_torn_last_line_not_to_it(tmp_path, tail, kept):
    """Found by a sweep: the first line a resume appended ended the line the
    kill tore, so neither parsed and every later line read as out of order."""
    batch = [np.zeros(2, np.uint8)]
    lines = [json.dumps({"p": "s", "i": i, "d": bd.digest_arrays(batch)}).encode() + b"\n"
             for i in range(2)]
    path = tmp_path / f"{ID1}.jsonl"
    path.write_bytes(lines[0] + (lines[1] if tail is None else tail))
    rec = bd.Recorder(tmp_path, bd.ALL, False)
    rec.track("s", "dataset")
    log = bd.read_log(tmp_path, ID1)
    rec.resume(ID1, log.found, 2, lambda name: "x", "m", {"s"})
    for _ in range(kept + 2):  # compared, then appended
        rec.observe("s", batch, bd.digest_arrays)
    rec.close()
    again = bd.read_log(tmp_path, ID1)
    assert not again.problem, again.problem
    assert len(again.found["s"]) == kept + 2


_EDGE_BATCHES = [[np.full((2, 3), i, np.uint8)] for i in range(3)]
_EDGE_DIGESTS = [bd.digest_arrays(b) for b in _EDGE_BATCHES]


def _line(i: int, stream: str = "s", digest: list | None = None) -> bytes:
    return (json.dumps({"p": stream, "i": i, "d": _EDGE_DIGESTS[i] if digest is None
                        else digest}) + "\n").encode()


def _resumed_from(directory, step=20, total=40, elsewhere=()):
    """A BatchProof restoring a checkpoint at ``step`` (of a run of ``total``
    steps) whose batch-log id is ID1, its stream 's' (a dataset)."""
    from dvc_dali.format import store

    rec = bd.Recorder(directory, bd.ALL, False, elsewhere=elsewhere)
    proof = rs.BatchProof(recorder=rec, sources={}, readers={}, versions=dict)
    snapshot = store.Snapshot(directory.parent / "ckpt", {
        "step": step, "run": {"total_steps": total},
        "pipelines": {"s": {bd.KEY: {"log": ID1, "previous": None, "digests": []}}}})
    proof.restore(rs.SavedCheckpoint(snapshot, (), False))
    rec.track("s", "dataset")
    return rec


FILE = f"{ID1}.jsonl"
NO_LINE = f"{FILE} holds no complete line"
CUT = f"{FILE} ends in an incomplete line"
PROOF = "the run it resumes produced (batch digests)"


@pytest.mark.parametrize("content, said", [
    # made at the save, no batch followed before the kill: nothing compared, said
    pytest.param(b"", ["no digest of a batch after the checkpoint at step 20 is recorded in",
                       "no batch is compared"], id="empty"),
    # no newline at all: read as one torn line and ignored without a word (found by a sweep)
    pytest.param(_line(0)[:-12], [NO_LINE, "(digests read: none), so those batches are not "
                                  "verified"], id="one torn line"),
    pytest.param(_line(0)[:-1], [NO_LINE, "(digests read: none)"], id="its newline lost"),
    pytest.param(b"\x00\xffnot a line dvc-dali wrote", [NO_LINE], id="garbage"),
    # a valid prefix, then what no write of dvc-dali's left: the batches past it are said
    pytest.param(_line(0) + _line(1) + b"garbage",
                 [CUT, "(digests read: 2 of 's'), so the batches past",
                  f"the 2 batches after the checkpoint at step 20 are those {PROOF}"],
                 id="valid then garbage"),
    pytest.param(_line(0) + _line(1) + b"garbage\n",
                 ["do not parse or are out of order (the first: line 3)",
                  "digests read: 2 of 's'", f"the 2 batches after the checkpoint at step 20 "
                  f"are those {PROOF}"], id="valid then a garbage line"),
    pytest.param(_line(0, "other") + _line(1, "other"),
                 ["names 'other', which the checkpoint does not hold"],
                 id="another stream's lines only"),
    pytest.param(_line(0) + _line(2),
                 ["out of order (the first: line 2)", "digests read: 1 of 's'",
                  f"the batch after the checkpoint at step 20 is the one {PROOF}"],
                 id="an index gap"),
    pytest.param(_line(0) + _line(0) + _line(1),
                 ["out of order (the first: line 2)", "digests read: 2 of 's'",
                  f"the 2 batches after the checkpoint at step 20 are those {PROOF}"],
                 id="a duplicated line"),
    pytest.param(_line(1), ["out of order (the first: line 1)", "digests read: none"],
                 id="the second batch only"),
    # another algorithm's digests, a record of no output: not verified, never a refusal
    pytest.param(_line(0, digest=[d.replace("crc32:", "mix64:00000000")
                                  for d in _EDGE_DIGESTS[0]]),
                 ["batch 1 not verified (recorded by another digest algorithm)"],
                 id="another algorithm"),
    pytest.param(_line(0, digest=[]), ["batch 1 not verified (a recorded digest is "
                                       "unreadable)"], id="no output"),
    # a hand-edited value one digit wider: unreadable, not "other bytes" (a false refusal)
    pytest.param(_line(0, digest=[d + "0" for d in _EDGE_DIGESTS[0]]),
                 ["batch 1 not verified (a recorded digest is unreadable)"],
                 id="a value of another width"),
])
def test_a_companion_file_at_its_edges_is_said_never_a_proof_it_does_not_hold(
        tmp_path, capsys, content, said):
    """Each batch after the checkpoint ends matched, differs or not
    verified, and where it is not verified the resume says so and why."""
    directory = tmp_path / "batches"
    directory.mkdir()
    (directory / FILE).write_bytes(content)
    rec = _resumed_from(directory)
    for batch in _EDGE_BATCHES:
        rec.observe("s", batch, bd.digest_arrays)
    rec.close()
    err = capsys.readouterr().err
    for part in said:
        assert part in err, err
    proven = [line for line in err.splitlines() if PROOF in line]
    assert len(proven) == any(PROOF in part for part in said), err
    # the resume continued the segment: a later resume reads a digest of each batch
    again = bd.read_log(directory, ID1)
    assert len(again.found.get("s", [])) == len(_EDGE_BATCHES), again


def test_companion_files_are_found_where_their_run_wrote_them(tmp_path, capsys):
    """Found by a sweep: a `.dvc` made in a parent folder between a run and its
    resume (`dvc init --subdir`, a monorepo made around the project) moved
    where the resume looked, and it said the batches were not verified
    though their digests were where the run wrote them."""
    project = tmp_path / "project"
    ckpt = project / "ckpt"
    before = bd.companion_dir(ckpt, {})
    assert before == project / ".ckpt.dvc-dali-batches"
    before.mkdir(parents=True)
    (before / FILE).write_bytes(_line(0) + _line(1))
    (tmp_path / ".dvc").mkdir()  # a DVC repository made around it
    places = bd.companion_dirs(ckpt, {})
    assert places[0] == tmp_path / bd.COMPANION != before and before in places
    rec = _resumed_from(places[0], elsewhere=places[1:])
    for batch in _EDGE_BATCHES:
        rec.observe("s", batch, bd.digest_arrays)
    rec.close()
    err = capsys.readouterr().err
    assert f"the 2 batches after the checkpoint at step 20 are those {PROOF}" in err, err
    # the segment goes on where it was found; the next resume finds it whole there
    assert bd.read_log(before, ID1).found["s"] == _EDGE_DIGESTS
    assert not (places[0] / FILE).exists()
    # found nowhere: the line names each place looked in
    (before / FILE).unlink()
    _resumed_from(places[0], elsewhere=places[1:]).close()
    err = capsys.readouterr().err
    assert f"{places[0] / FILE} is missing (looked in {before} too" in err, err


def test_doctor_verify_reads_the_digests_where_the_run_wrote_them(tmp_path):
    """`dvc-dali doctor --verify` looked in the repository's `.dvc` only:
    a checkpoint whose run wrote its digests before that `.dvc` was made
    (beside the checkpoint) read as none recorded."""
    from dvc_dali.proof import replay

    (tmp_path / ".dvc").mkdir()
    before = tmp_path / "project" / ".ckpt.dvc-dali-batches"
    before.mkdir(parents=True)
    (before / FILE).write_bytes(_line(0) + _line(1) + b"garbage")
    manifest = {"pipelines": {"s": {bd.KEY: {"log": ID1, "previous": None, "digests": []}}}}
    found, why = replay._recorded(tmp_path, "project/ckpt", manifest, {})
    assert found == {"s": _EDGE_DIGESTS[:2]}
    assert why == f"project/.ckpt.dvc-dali-batches/{FILE} {bd.CUT_SHORT}", why
