"""Proof at runtime, the data's contents: a file rewritten in place with its
old size and mtime, between a kill and the resume, is refused by name
(names, sizes and DVC see nothing); an untouched data set, and one copied
afresh with new mtimes, resume. Real DALI pipelines over real image files,
a process killed with SIGKILL between two checkpoints."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import proof
from tests.helpers.proof import manifest, outputs, rewrite_same_size_and_mtime

REWRITTEN = "class1/003.jpg"


def run(data: Path, ckpt: Path, out: Path, until: int, save_at=(), kill_after=None,
        **env: str):
    return proof.run("rotate", data, ckpt, out, until, save_at, kill_after, **env)


@pytest.fixture
def killed(tmp_path, data_dir):
    """A data set of our own and a run of it killed at step 4, saved at 2."""
    data = tmp_path / "data"
    shutil.copytree(data_dir / "images", data / "images")
    ckpt = tmp_path / "ckpt"
    proc = run(data, ckpt, tmp_path / "first.npz", 6, save_at=[2], kill_after=4)
    assert proc.returncode == -9, proc.stderr[-3000:]
    return data, ckpt


def test_a_file_rewritten_with_its_size_and_mtime_is_refused_by_name(tmp_path, killed):
    data, ckpt = killed
    record = manifest(ckpt)["pipelines"]["train"]["contents"]["reader.file_root"]
    assert record["files"] == 24 and len(record["crc32"]) == 8 * 24
    rewrite_same_size_and_mtime(data / "images" / REWRITTEN)

    proc = run(data, ckpt, tmp_path / "resumed.npz", 6)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "PipelineMismatchError" in text and "Traceback" not in text, text
    assert f"reader.file_root ({data}/images): changed {REWRITTEN}" in text, text
    assert "dvc-dali reset" in text and "DVC_DALI_INEXACT=1" in text, text
    assert not (tmp_path / "resumed.npz").exists()

    # on purpose: it resumes, and says the run is no longer exact
    proc = run(data, ckpt, tmp_path / "resumed.npz", 6, DVC_DALI_INEXACT="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no longer exact" in proc.stderr and REWRITTEN in proc.stderr, proc.stderr
    assert int(outputs(tmp_path / "resumed.npz")["restored_step"]) == 2


def test_untouched_data_resumes_exactly(tmp_path, killed):
    data, ckpt = killed
    proc = run(data, ckpt, tmp_path / "resumed.npz", 6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "contents" not in proc.stderr, proc.stderr
    whole = run(data, tmp_path / "whole", tmp_path / "whole.npz", 6)
    assert whole.returncode == 0, whole.stderr[-3000:]
    resumed, reference = outputs(tmp_path / "resumed.npz"), outputs(tmp_path / "whole.npz")
    assert int(resumed["restored_step"]) == 2
    keys = [k for k in resumed if k[:4].isdigit()]
    assert keys and all(np.array_equal(resumed[k], reference[k]) for k in keys)


def test_a_fresh_machine_copy_with_new_mtimes_resumes(tmp_path, killed):
    data, ckpt = killed
    images = data / "images"
    moved = tmp_path / "elsewhere"
    shutil.move(images, moved)
    shutil.copytree(moved, images, copy_function=shutil.copyfile)  # new mtimes, same bytes
    for path in images.rglob("*.jpg"):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    proc = run(data, ckpt, tmp_path / "resumed.npz", 6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(outputs(tmp_path / "resumed.npz")["restored_step"]) == 2


def test_over_the_threshold_names_and_sizes_only_said_once(tmp_path, data_dir):
    data = tmp_path / "data"
    shutil.copytree(data_dir / "images", data / "images")
    ckpt = tmp_path / "ckpt"
    proc = run(data, ckpt, tmp_path / "first.npz", 6, save_at=[2, 4], kill_after=4,
               DVC_DALI_CONTENT_DIGEST_MAX="1000")
    assert proc.returncode == -9, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "DVC_DALI_CONTENT_DIGEST_MAX" in line]
    assert len(said) == 1 and "names and sizes, not their contents" in said[0], proc.stderr
    assert "contents" not in manifest(ckpt)["pipelines"]["train"]
    # a manifest without contents (as older ones) resumes under the default threshold
    rewrite_same_size_and_mtime(data / "images" / REWRITTEN)
    proc = run(data, ckpt, tmp_path / "resumed.npz", 6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(outputs(tmp_path / "resumed.npz")["restored_step"]) == 4


def test_a_reader_naming_its_files_one_by_one_is_checked_too(tmp_path, data_dir):
    """webdataset's `paths` (a tar rewritten in place): refused by name."""
    shutil.copytree(data_dir / "shards", tmp_path / "shards")
    tar = tmp_path / "shards" / "data.tar"
    killed = proof.run("webdataset", tmp_path, tmp_path / "ck", tmp_path / "a.npz", 6,
                       save_at=[2], kill_after=2)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert manifest(tmp_path / "ck")["pipelines"]["train"]["contents"]["reader.paths"][
        "files"] == 1
    raw = bytearray(tar.read_bytes())
    raw[raw.index(b"\xff\xda") + 40] ^= 0x01  # in the first JPEG member's scan
    proof.keep_size_and_mtime(tar, bytes(raw))

    resumed = proof.run("webdataset", tmp_path, tmp_path / "ck", tmp_path / "b.npz", 6)
    said = resumed.stderr
    assert resumed.returncode != 0 and "PipelineMismatchError" in said, said
    assert f"reader.paths ({tar}): changed {tar}" in said, said


def test_checks_turned_off_for_a_resume_are_said_not_skipped_silently(tmp_path, killed):
    """A checkpoint recorded with its data's contents and batch digests,
    resumed with both checks off on rewritten data: each says, once, that
    it did not compare (the resume trained on other batches without a word)."""
    data, ckpt = killed
    rewrite_same_size_and_mtime(data / "images" / REWRITTEN)
    proc = run(data, ckpt, tmp_path / "resumed.npz", 6, DVC_DALI_CONTENT_DIGEST_MAX="0",
               DVC_DALI_VERIFY_BATCHES="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stderr.splitlines()
    assert len([line for line in said if "are not checked (DVC_DALI_CONTENT_DIGEST_MAX=0)"
                in line]) == 1, proc.stderr
    assert len([line for line in said if "not compared with those the run it resumes produced "
                "(DVC_DALI_VERIFY_BATCHES=0): this resume is not verified" in line]) == 1, \
        proc.stderr


def test_digests_that_cannot_be_kept_are_said_while_recording_and_resuming(tmp_path, data_dir):
    """The companion directory blocked (a file where it goes): the recording
    said nothing (a debug line) and the resume after a kill compared nothing
    without a word."""
    data = tmp_path / "data"
    shutil.copytree(data_dir / "images", data / "images")
    ckpt = tmp_path / "ckpt"
    blocked = tmp_path / ".ckpt.dvc-dali-batches"  # companion_dir beside the checkpoint
    blocked.write_text("")
    proc = run(data, ckpt, tmp_path / "first.npz", 6, save_at=[2], kill_after=4)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert proc.stderr.count("batch digests cannot be kept in") == 1, proc.stderr
    blocked.unlink()
    proc = run(data, ckpt, tmp_path / "resumed.npz", 6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("no digests of the batches after the checkpoint at step 2 were found"
            in proc.stderr and "those batches are not verified" in proc.stderr), proc.stderr


def test_a_directory_a_reader_names_its_files_and_a_manifests_audio_are_checked(tmp_path):
    """Found by a sweep: caffe's LMDB directory (``path``), the video
    reader's ``filenames`` and the audio files a nemo_asr manifest names were
    not checked at all (a directory was "could not read"), so data replaced
    after a kill right after a checkpoint was trained on without a word."""
    import json

    from dvc_dali.proof import data_contents

    (tmp_path / "db").mkdir()
    for name in ("data.mdb", "lock.mdb", "a.webm", "b.webm", "x.wav", "y.wav"):
        where = tmp_path / ("db" if name.endswith(".mdb") else "") / name
        where.write_bytes(name.encode() * 100)
    (tmp_path / "m.json").write_text("".join(json.dumps({"audio_filepath": f, "text": "t"})
                                             + "\n" for f in ("x.wav", "y.wav")))
    ops = {"caffe": {"path": str(tmp_path / "db")},
           "video": {"filenames": [str(tmp_path / "a.webm"), str(tmp_path / "b.webm")]},
           "nemo": {"manifest_filepaths": [str(tmp_path / "m.json")]}}
    description = {"operators": {k: {"type": k, "args": v, "inputs": []} for k, v in ops.items()}}

    def contents():
        found = data_contents.start("p", description, 1 << 30)
        found.result()
        return found

    saved = contents().result()
    assert set(saved) == {"caffe.path", "video.filenames", "nemo.manifest_filepaths"}
    assert saved["caffe.path"]["files"] == 1  # lock.mdb holds readers' slots, not data
    (tmp_path / "db" / "lock.mdb").write_bytes(b"another reader")
    assert contents().changed(saved) == []
    for name in ("db/data.mdb", "b.webm", "y.wav"):
        (tmp_path / name).write_bytes(b"other data")
    changed = contents().changed(saved)
    assert [line.split(":")[0].split(" (")[0] for line in changed] == [
        "caffe.path", "nemo.manifest_filepaths", "video.filenames"], changed
    assert changed[0].endswith("/db/data.mdb") and changed[1].endswith("changed y.wav")
    assert "changed " in changed[2] and "b.webm" in changed[2], changed


def test_linked_folders_dangling_links_and_names_not_utf8_are_digested(tmp_path, data_dir):
    """As DALI's file reader walks file_root: a class folder that is a link
    is followed (its files were left out: a file changed there resumed
    silently, not exact), a dangling link and a name that is not UTF-8 are
    listed (both ended the run in a traceback), a FIFO is listed, never
    opened (the run hung). Found by a sweep."""
    data = tmp_path / "data"
    shutil.copytree(data_dir / "images", data / "images")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(data / "images" / "class1", outside / "class1")
    (data / "images" / "class1").symlink_to(outside / "class1", target_is_directory=True)
    (data / "images" / "class0" / "notes.txt").symlink_to(tmp_path / "nonexistent.txt")
    os.mkfifo(data / "images" / "class0" / "pipe")  # its open blocked the first save for ever
    odd = data / "images" / "class0" / os.fsdecode(b"\xff.jpg")
    shutil.copyfile(data / "images" / "class0" / "000.jpg", odd)
    ckpt = tmp_path / "ckpt"
    proc = run(data, ckpt, tmp_path / "first.npz", 6, save_at=[2], kill_after=4)
    assert proc.returncode == -9 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    record = manifest(ckpt)["pipelines"]["train"]["contents"]["reader.file_root"]
    assert record["files"] == 27, record  # 24 images, the link, the FIFO, the odd name

    rewrite_same_size_and_mtime(outside / REWRITTEN)
    rewrite_same_size_and_mtime(odd)
    proc = run(data, ckpt, tmp_path / "resumed.npz", 6)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in text, text
    assert f"reader.file_root ({data}/images): changed class0/\\xff.jpg, {REWRITTEN}" in text, \
        text


def test_a_file_rewritten_with_another_size_is_named_where_dvc_cannot(tmp_path, killed):
    """Its size changed, so the description's digest of names and sizes
    refuses first: outside DVC (data outside the repository, or behind a
    link) that refusal named no file and said "Run with the saved settings"
    (found by a sweep). The content digests name the file."""
    data, ckpt = killed
    path = data / "images" / REWRITTEN
    path.write_bytes(path.read_bytes() + b"\0")
    proc = run(data, ckpt, tmp_path / "resumed.npz", 6)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "PipelineMismatchError" in text, text
    assert f"reader.file_root ({data}/images): changed {REWRITTEN}" in text, text
    assert "Restore the data as it was" in text and "saved settings" not in text, text
