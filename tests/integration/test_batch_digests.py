"""Proof at runtime, the batches: a resumed pipeline whose batches differ
from those the run it continues produced after the same checkpoint is
refused before the step that would train on them, naming the pipeline, the
step and what differs. Real DALI pipelines over real image files; the runs
are killed with SIGKILL between two checkpoints, as a preemption would."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dvc_dali.proof import batch_digests
from tests.helpers.proof import (companion, keep_size_and_mtime, manifest,
                                 perturb_same_size_and_mtime, refused_then_inexact,
                                 same_as_uninterrupted)
from tests.helpers.proof import run as proof_run


def test_a_rewritten_file_the_next_batches_read_is_refused_before_its_step(tmp_path, images):
    # names, sizes and mtimes unchanged, and no content digest (threshold 0):
    # only the batches can tell
    ckpt = tmp_path / "ckpt"
    off = {"DVC_DALI_CONTENT_DIGEST_MAX": "0"}
    proc = proof_run("rotate", images, ckpt, tmp_path / "first.npz", 6, save_at=[2], kill_after=4,
               **off)
    assert proc.returncode == -9, proc.stderr[-3000:]
    log_id = batch_digests.log_id_of(manifest(ckpt))
    kept = batch_digests.read_companion(companion(ckpt), log_id)
    # steps 3 and 4, each written before its batch was handed out: none lost at the kill
    assert len(kept["train"]) == 2, kept
    for path in (images / "images").rglob("*.jpg"):
        perturb_same_size_and_mtime(path)

    refused_then_inexact("rotate", images, ckpt, tmp_path / "resumed.npz", "pipeline 'train'",
                         **off)


def test_a_resume_with_no_digest_recorded_after_its_checkpoint_says_so(tmp_path, images):
    """Killed right after its save, before any later batch's digest was
    written (a kill can come before the digest thread writes): the resume
    compared nothing and said nothing, as if verified (found under load)."""
    ckpt = tmp_path / "ckpt"
    run = {"PROOF_TOTAL_STEPS": "4"}  # unfinished at step 2: a kill, not the run's end
    proc = proof_run("rotate", images, ckpt, tmp_path / "first.npz", 4, save_at=[2],
                     kill_after=2, **run)
    assert proc.returncode == -9, proc.stderr[-3000:]
    proc = proof_run("rotate", images, ckpt, tmp_path / "resumed.npz", 4, **run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no digest of a batch after the checkpoint at step 2 is recorded in " in proc.stderr
    assert "no batch is compared" in proc.stderr and "are those the run it resumes produced" \
        not in proc.stderr, proc.stderr


def test_a_dvc_repository_made_around_a_run_leaves_its_digests_found(tmp_path, images):
    """Found by a sweep: a `.dvc` made above the checkpoint between a run and
    its resume (`dvc init` of a monorepo around the project, `dvc init
    --subdir`) moved where the resume looked for the batch digests, so it
    said the batches were not verified though they were where the run wrote
    them. It reads them there now, and continues that file."""
    ckpt = tmp_path / "project" / "ckpt"
    proc = proof_run("rotate", images, ckpt, tmp_path / "first.npz", 8, save_at=[4],
                     kill_after=7)
    assert proc.returncode == -9, proc.stderr[-3000:]
    log_id = batch_digests.log_id_of(manifest(ckpt))
    assert len(batch_digests.read_companion(companion(ckpt), log_id)["train"]) == 3
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    assert batch_digests.companion_dir(ckpt, {}) != companion(ckpt)

    proc = proof_run("rotate", images, ckpt, tmp_path / "resumed.npz", 8)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("pipeline 'train': the 3 batches after the checkpoint at step 4 are those the run "
            "it resumes produced") in proc.stderr, proc.stderr
    # the segment went on in its file: a later resume from step 4 reads each batch there
    assert len(batch_digests.read_companion(companion(ckpt), log_id)["train"]) == 4


def test_a_resume_on_purpose_on_changed_data_leaves_the_checkpoints_segment_alone(
        tmp_path, images):
    """DVC_DALI_INEXACT=1 on rewritten data, past the digests recorded: the
    run writes nothing more into the resumed checkpoint's segment, and its
    next save records only the batches before the difference (none here).
    With the data and that checkpoint put back (as `dvc exp apply` of its
    row would), a resume from it is compared with the run it continues."""
    ckpt = tmp_path / "ckpt"
    off = {"DVC_DALI_CONTENT_DIGEST_MAX": "0"}
    proc = proof_run("rotate", images, ckpt, tmp_path / "first.npz", 10, save_at=[4],
                     kill_after=8, **off)
    assert proc.returncode == -9, proc.stderr[-3000:]
    log_id = batch_digests.log_id_of(manifest(ckpt))
    kept = batch_digests.read_companion(companion(ckpt), log_id)
    assert len(kept["train"]) == 4, kept  # steps 5-8
    saved = tmp_path / "saved-ckpt"
    shutil.copytree(ckpt, saved)
    originals = {path: path.read_bytes() for path in (images / "images").rglob("*.jpg")}
    for path in originals:
        perturb_same_size_and_mtime(path)

    proc = proof_run("rotate", images, ckpt, tmp_path / "inexact.npz", 12, save_at=[12],
                     DVC_DALI_INEXACT="1", **off)
    assert proc.returncode == 0 and "no longer exact" in proc.stderr, proc.stderr[-3000:]
    assert batch_digests.read_companion(companion(ckpt), log_id) == kept
    record = manifest(ckpt)["pipelines"]["train"]["batches"]
    assert record["previous"] == log_id and record["digests"] == [], record

    shutil.rmtree(ckpt)
    shutil.copytree(saved, ckpt)
    for path, raw in originals.items():
        keep_size_and_mtime(path, raw)
    proc = proof_run("rotate", images, ckpt, tmp_path / "exact.npz", 10, **off)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"pipeline 'train': the 4 batches after the checkpoint at step 4 are "
                     r"those the run it "
                     r"resumes produced", proc.stderr), proc.stderr


def test_a_resume_on_purpose_past_changed_contents_leaves_the_checkpoints_segment_alone(
        tmp_path, images):
    """The data's contents changed (content digests on, the default) and
    DVC_DALI_INEXACT=1, the run it resumes killed right after its save: the
    batches it trains on are not appended as those that followed the
    checkpoint, so the data put back, the exact resume from that checkpoint
    is not refused for them (it was: a sweep's branch off a row, then `dvc
    exp apply` of the row)."""
    ckpt = tmp_path / "ckpt"
    proc = proof_run("rotate", images, ckpt, tmp_path / "first.npz", 8, save_at=[4],
                     kill_after=4)
    assert proc.returncode == -9, proc.stderr[-3000:]
    log_id = batch_digests.log_id_of(manifest(ckpt))
    assert batch_digests.read_companion(companion(ckpt), log_id) == {}
    originals = {path: path.read_bytes() for path in (images / "images").rglob("*.jpg")}
    for path in originals:
        perturb_same_size_and_mtime(path)

    proc = proof_run("rotate", images, ckpt, tmp_path / "inexact.npz", 8, kill_after=7,
                     DVC_DALI_INEXACT="1")
    assert proc.returncode == -9 and "no longer exact" in proc.stderr, proc.stderr[-3000:]
    assert batch_digests.read_companion(companion(ckpt), log_id) == {}

    for path, raw in originals.items():
        keep_size_and_mtime(path, raw)
    proc = proof_run("rotate", images, ckpt, tmp_path / "exact.npz", 8)
    assert proc.returncode == 0 and "BatchMismatchError" not in proc.stderr, \
        proc.stderr[-3000:]
    same_as_uninterrupted("rotate", images, tmp_path, tmp_path / "exact.npz", 8)


def test_a_resume_that_ends_before_its_digests_run_out_says_at_close_what_it_compared(
        tmp_path, capsys):
    from tests.helpers import pipelines

    import dvc_dali

    ckpt = tmp_path / "ckpt"
    fn, kwargs = pipelines.make("source", str(tmp_path))["train"]
    ck = dvc_dali.Checkpointer(ckpt)
    pipe = ck.pipeline("train", fn, **kwargs)
    ck.save(0)
    for _ in range(8):
        pipe.run()
    ck.close()
    ck = dvc_dali.Checkpointer(ckpt)
    pipe = ck.pipeline("train", fn, **kwargs)
    for _ in range(2):  # of the 8 recorded
        pipe.run()
    assert "are those the run it resumes produced" not in capsys.readouterr().err
    ck.close()
    said = capsys.readouterr().err
    assert ("pipeline 'train': the 2 batches after the checkpoint at step 0 are those the "
            "run it resumes produced") in said, said


@contextlib.contextmanager
def address_space_at_most(extra: int):
    """This process's address space capped at what it maps now plus
    ``extra``: a read without a bound ends in MemoryError, not in the
    machine's memory."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    resource.setrlimit(resource.RLIMIT_AS, (pages * os.sysconf("SC_PAGE_SIZE") + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


UNREAD = {  # what the companion file was made into -> what the resume says of it
    "a link to /dev/zero": "is a symbolic link (not read)",  # it said "is missing"
    "a 10 MB line": "has a line longer than 1 MB",
    "a FIFO": "is not a regular file",  # the resume then waited on it for ever, writing
    "a directory": "is not a regular file",  # a traceback
    "random bytes": "line(s) that do not parse or are out of order",  # nothing said
    "another pipeline's lines": "names 'nosuch', which the checkpoint does not hold",  # nothing
}


@pytest.mark.parametrize("how", list(UNREAD))
def test_a_companion_file_that_cannot_be_read_is_said_and_never_waited_on(tmp_path, how):
    """Never read whole, never opened to wait on, never written through: the
    resume neither fails nor hangs nor claims a proof for batches it could
    not read, and says why they are not verified."""
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 6, save_at=[2],
                     kill_after=5)
    assert proc.returncode == -9, proc.stderr[-3000:]
    log_id = batch_digests.log_id_of(manifest(ckpt))
    path = companion(ckpt) / f"{log_id}.jsonl"
    lines = path.read_text().splitlines()
    path.unlink()
    if how == "a link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif how == "a 10 MB line":  # the first batch's own record, padded: no line dvc-dali writes
        first = {**json.loads(lines[0]), "pad": "x" * 10_000_000}
        path.write_text("".join(line + "\n" for line in [json.dumps(first), *lines[1:]]))
    elif how == "a FIFO":  # held open by a reader: a writer would not block, but write into it
        os.mkfifo(path)
        reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    elif how == "a directory":
        path.mkdir()
    elif how == "random bytes":
        path.write_bytes(os.urandom(4000).replace(b"\n", b"") + b"\n" * 3)
    else:
        path.write_text("".join(line.replace('"p": "train"', '"p": "nosuch"') + "\n"
                                for line in lines))
    with address_space_at_most(256 << 20):
        assert "train" not in batch_digests.read_companion(companion(ckpt), log_id)
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "resumed.npz", 6)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "are those the run it resumes produced" not in proc.stderr, proc.stderr
    assert UNREAD[how] in proc.stderr and "not verified" in proc.stderr + "not compared", \
        proc.stderr[-3000:]
    assert not path.is_symlink() or os.readlink(path) == "/dev/zero"
    if how == "a FIFO":  # nothing was written into it
        with contextlib.suppress(BlockingIOError):
            assert os.read(reader, 1 << 16) == b""
        os.close(reader)


def test_a_changed_external_source_callable_is_refused(tmp_path):
    # the pipeline's description (operators, arguments, seed) is the same
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 6, save_at=[2], kill_after=4)
    assert proc.returncode == -9, proc.stderr[-3000:]
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "resumed.npz", 6, PROOF_SOURCE_SHIFT="1")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "BatchMismatchError" in text, text
    assert "batch 1 after the checkpoint at step 2 (" in text, text
    assert "external_source callable" in text, text
    # the same callable resumes, and its batches are those of an uninterrupted run
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "resumed.npz", 6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # steps 3 and 4 were compared
    assert ("pipeline 'train': the 2 batches after the checkpoint at step 2 are those the "
            "run it resumes produced") in proc.stderr, proc.stderr
    same_as_uninterrupted("source", tmp_path, tmp_path, tmp_path / "resumed.npz", 6)


def test_a_digest_that_fails_while_recording_is_said_once_and_not_verified_at_the_resume(
        tmp_path):
    """Batches 2 and 3 after the checkpoint: their digests raise; the run
    says so once and records the later ones; the resume says those two are
    not verified, never that the batches are those of the run it resumes
    (on the digest thread: test_batch_groups, test_tf_proof)."""
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 8, save_at=[2],
                     kill_after=7, PROOF_DIGEST_FAILS="2,3")
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert proc.stderr.count("dvc-dali: ") == 1, proc.stderr  # said once
    assert "pipeline 'train': the digest of batch 2 after the last checkpoint failed " \
        "(RuntimeError: a digest failed)" in proc.stderr, proc.stderr
    kept = batch_digests.read_companion(companion(ckpt), batch_digests.log_id_of(manifest(ckpt)))
    assert kept["train"][1:3] == [["failed:RuntimeError"]] * 2, kept  # marked, not dropped
    assert batch_digests.parse_output(kept["train"][3][0]), kept  # the next one recorded
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "resumed.npz", 8)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("pipeline 'train': batch digests of the 5 batches after the checkpoint at step 2: "
            "batch 1 matched; batches 2-3 not verified (its digest failed while it was "
            "recorded (RuntimeError)); batches 4-5 matched; so this resume is not proven "
            "exact") in proc.stderr, proc.stderr
    assert proc.stderr.count("not verified") == 1, proc.stderr
    assert "are those the run it resumes produced" not in proc.stderr, proc.stderr


def test_a_run_that_ended_at_its_checkpoint_resumes_with_nothing_said(tmp_path):
    """The most common resume (more steps after a finished run): no batch
    followed the last checkpoint, so its companion file is empty; the resume
    has nothing to compare and says nothing, neither a proof nor a warning
    (a461b54 made the file at the first line, and the resume said the
    digests were missing)."""
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 2, save_at=[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    log_id = batch_digests.log_id_of(manifest(ckpt))
    assert (companion(ckpt) / f"{log_id}.jsonl").read_bytes() == b""  # made, no batch
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "resumed.npz", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dvc-dali" not in proc.stderr, proc.stderr
    same_as_uninterrupted("source", tmp_path, tmp_path, tmp_path / "resumed.npz", 4)


def test_the_next_checkpoint_holds_them_and_a_resume_of_it_reads_them(tmp_path):
    # killed after a second checkpoint: the digests of steps 3-4 are in step
    # 4's manifest (for a resume of step 2's row elsewhere: test_stage_batch_proof),
    # and step 5's in the companion file of step 4
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 6, save_at=[2, 4],
               kill_after=5)
    assert proc.returncode == -9, proc.stderr[-3000:]
    record = manifest(ckpt)["pipelines"]["train"]["batches"]
    assert len(record["digests"]) == 2 and record["previous"] and record["log"]
    # step 5's, written before the batch was handed out: kept at the kill
    assert len(batch_digests.read_companion(companion(ckpt), record["log"])["train"]) == 1


def test_verification_can_be_limited_or_turned_off(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 6, save_at=[2], kill_after=5,
               DVC_DALI_VERIFY_BATCHES="1")
    assert proc.returncode == -9, proc.stderr[-3000:]
    log_id = batch_digests.log_id_of(manifest(ckpt))
    assert len(batch_digests.read_companion(companion(ckpt), log_id)["train"]) == 1
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "r.npz", 6, PROOF_SOURCE_SHIFT="1")
    assert proc.returncode != 0, proc.stderr
    assert "batch 1 after the checkpoint at step 2 (" in proc.stderr, proc.stderr
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "r.npz", 6, PROOF_SOURCE_SHIFT="1",
               DVC_DALI_VERIFY_BATCHES="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = proof_run("source", tmp_path, ckpt, tmp_path / "r.npz", 6, DVC_DALI_VERIFY_BATCHES="x")
    assert bad.returncode != 0 and "DVC_DALI_VERIFY_BATCHES='x'" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_checkpoint_without_digests_resumes_saying_it_is_not_verified(tmp_path):
    """Found by a sweep: a checkpoint of a dvc-dali before batch digests (or
    saved with them off) resumed without a word: nothing told "proven"
    from "not checked"."""
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 6, save_at=[2],
                     kill_after=4, DVC_DALI_VERIFY_BATCHES="0")
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert batch_digests.log_id_of(manifest(ckpt)) is None
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "r.npz", 6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("the checkpoint at step 2 holds no batch digests (saved with "
            "DVC_DALI_VERIFY_BATCHES=0, or by a dvc-dali before them): the batches after it are "
            "not compared; this resume is not verified") in proc.stderr, proc.stderr
    assert "are those the run it resumes produced" not in proc.stderr


def test_a_manifest_with_forged_digests_names_the_field(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 4, save_at=[2, 4])
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = (ckpt / "LATEST").read_text().split()[0]
    path = ckpt / name / "manifest.json"
    doc = json.loads(path.read_text())
    doc["pipelines"]["train"]["batches"]["digests"][0][0] = "../etc"
    from dvc_dali.format import manifest_schema

    with pytest.raises(Exception) as err:
        manifest_schema.validate(doc, str(path))
    assert "pipelines.train.batches.digests[0]" in str(err.value), err.value


def test_a_manifest_holds_the_first_digests_the_companion_file_all(tmp_path, monkeypatch):
    from tests.helpers import pipelines

    import dvc_dali

    monkeypatch.setattr(batch_digests, "MANIFEST_MAX", 3)
    ckpt = tmp_path / "ckpt"
    ck = dvc_dali.Checkpointer(ckpt)
    fn, kwargs = pipelines.make("source", str(tmp_path))["train"]
    pipe = ck.pipeline("train", fn, **kwargs)
    ck.save(0)
    first = batch_digests.log_id_of(manifest(ckpt))
    for _ in range(5):
        pipe.run()
    ck.save(5)
    ck.close()
    record = manifest(ckpt)["pipelines"]["train"]["batches"]
    assert record["previous"] == first and len(record["digests"]) == 3
    kept = batch_digests.read_companion(companion(ckpt), first)["train"]
    assert len(kept) == 5 and kept[:3] == record["digests"]


def test_a_resumed_checkpointer_let_go_frees_its_directory(tmp_path):
    """Its batch proof keeps no reference to it: dropped without close(), as
    a script's ends, the directory lock goes at once (no cycle for the GC)."""
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 6, save_at=[2],
                     kill_after=4)
    assert proc.returncode == -9, proc.stderr[-3000:]

    import gc

    from tests.helpers import pipelines

    import dvc_dali

    def resumed_step() -> int:
        ck = dvc_dali.Checkpointer(ckpt)
        fn, kwargs = pipelines.make("source", str(tmp_path))["train"]
        ck.pipeline("train", fn, **kwargs)
        return ck.step

    gc.disable()
    try:
        assert resumed_step() == 2
        again = proof_run("source", tmp_path, ckpt, tmp_path / "again.npz", 6)
    finally:
        gc.enable()
    assert again.returncode == 0, again.stderr[-3000:]


def test_the_companion_file_is_closed_at_each_save_at_close_and_when_dropped(tmp_path):
    """A segment's companion file is opened right after its save (by the
    digest thread, not by the save), stays open while the segment lasts (an open
    and a close a batch cost ~60 us of CPU on a loaded machine), and is
    closed at the next save, at close(), and when a Checkpointer dropped
    without close() is collected: never more than one open, none left."""
    import gc
    import os

    from tests.helpers import pipelines

    import dvc_dali

    def held() -> list[str]:
        found = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                 if os.path.exists(f"/proc/self/fd/{fd}")]
        return [t for t in found if t.startswith(str(tmp_path)) and "dvc-dali-batches" in t]

    for close in (True, False):
        ckpt = tmp_path / f"ckpt-{close}"
        ck = dvc_dali.Checkpointer(ckpt)
        fn, kwargs = pipelines.make("source", str(tmp_path))["train"]
        pipe = ck.pipeline("train", fn, **kwargs)
        ck.save(1)
        for _ in range(3):
            pipelines.outputs_of(pipe)
        first = held()
        assert len(first) == 1, first
        ck.save(2)
        assert batch_digests._digest_thread().drain()  # noqa: SLF001 (it made the next one)
        second = held()
        pipelines.outputs_of(pipe)
        ck._batches.wait()  # noqa: SLF001 (the digest in flight, appended)
        assert held() == second
        assert len(second) == 1 and second != first, (first, second)
        log_id = batch_digests.log_id_of(manifest(ckpt))
        assert len(batch_digests.read_companion(companion(ckpt), log_id)["train"]) == 1
        assert len(manifest(ckpt)["pipelines"]["train"]["batches"]["digests"]) == 3
        if close:
            ck.close()
        else:
            # jobs run in order: the thread let go of the last one
            assert batch_digests._digest_thread().drain()  # noqa: SLF001
            del ck, pipe
            gc.collect()
        assert held() == []


def test_a_pipeline_registered_after_the_checkpoint_is_neither_recorded_nor_compared(
        tmp_path, data_dir):
    """Found by a sweep: a pipeline registered after a save had its batches
    recorded into that checkpoint's segment, which does not hold it, and a
    resume from the checkpoint (which starts that pipeline afresh) compared
    them: a different batch size was refused, and unchanged ones were proven
    under step numbers it never ran at. Its batches count from the next save."""
    import dvc_dali
    from tests.helpers import pipelines

    made = pipelines.make("two", str(data_dir))
    ckpt = tmp_path / "ckpt"
    ck = dvc_dali.Checkpointer(ckpt)
    train = ck.pipeline("train", *made["train"][:1], **made["train"][1])
    ck.save(0)
    log_id = batch_digests.log_id_of(manifest(ckpt))
    val = ck.pipeline("val", *made["val"][:1], **made["val"][1])
    for _ in range(3):
        train.run()
        val.run()
    assert set(batch_digests.read_companion(companion(ckpt), log_id)) == {"train"}
    ck.close()
    # resumed from step 0, its validation built otherwise
    ck = dvc_dali.Checkpointer(ckpt)
    assert ck.step == 0
    train = ck.pipeline("train", *made["train"][:1], **made["train"][1])
    other = {**made["val"][1], "batch_size": 3}
    val = ck.pipeline("val", *made["val"][:1], **other)
    for _ in range(3):
        train.run()
        val.run()  # not compared: the checkpoint does not hold it
    ck.save(3)
    record = manifest(ckpt)["pipelines"]
    assert len(record["train"]["batches"]["digests"]) == 3
    assert record["val"]["batches"]["digests"] == []  # registered after step 0's save
    ck.close()


def test_a_resume_that_ends_before_its_digests_ran_out_says_what_it_compared(tmp_path):
    """The runner calls neither a save nor close() at its end (as the
    README's scripts do not): a resume that stopped before the recorded
    digests ran out said nothing of the batches it compared (found by a
    sweep). Said at the interpreter's exit."""
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 8, save_at=[2],
                     kill_after=7)
    assert proc.returncode == -9, proc.stderr[-3000:]
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "resumed.npz", 5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("pipeline 'train': the 3 batches after the checkpoint at step 2 are those the run "
            "it resumes produced") in proc.stderr, proc.stderr
    assert proc.stderr.count("the run it resumes produced") == 1, proc.stderr


def test_a_companion_file_that_fills_the_disk_mid_run_proves_only_what_it_kept(
        tmp_path, data_dir):
    """A full disk (EFBIG here) cuts the companion file's next line short and
    keeps the later ones out: the run trains on, said once; its resume proves
    the batch whose digest was kept and says the rest are not verified."""
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", data_dir, ckpt, tmp_path / "first.npz", 8, save_at=[2],
                     kill_after=6, PROOF_FULL_AFTER="3")
    assert proc.returncode == -9, proc.stderr[-3000:]  # trained on to the kill
    assert proc.stderr.count("batch digests cannot be kept in ") == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr  # (its stderr, a file, is cut by the limit too)
    proc = proof_run("source", data_dir, ckpt, tmp_path / "resumed.npz", 8)
    said = proc.stderr
    assert proc.returncode == 0 and "Traceback" not in said, said[-3000:]
    assert "ends in an incomplete line" in said and "batches past those are not verified" in said
    assert "the batch after the checkpoint at step 2 is the one the run it resumes produced" \
        in said, said[-3000:]
