"""recording/lockfile: a refused asynchronous row puts dvc.lock back as it
was, and the entry this process wrote before it counts as its own again
(so that another command's rewrite of dvc.lock is still recognised)."""

from __future__ import annotations

from dvc_dali.core.process_state import reset
from dvc_dali.recording import lockfile

ROW10 = {"cmd": "python train.py", "outs": [{"path": "checkpoint", "md5": "a" * 32}]}
ROW20 = {"cmd": "python train.py", "outs": [{"path": "checkpoint", "md5": "b" * 32}]}


def test_put_back_restores_the_text_and_the_entry_this_process_wrote(tmp_path):
    reset()
    path = str(tmp_path / "dvc.lock")
    lockfile.write_entry(path, {}, "train", ROW10)
    text10 = (tmp_path / "dvc.lock").read_text()
    before = lockfile.before_write(path, "train")
    lockfile.write_entry(path, lockfile.read(path)[1], "train", ROW20)
    lockfile.put_back(before)
    assert (tmp_path / "dvc.lock").read_text() == text10
    assert not lockfile.replaced(path, "train", ROW10)  # its own again
    assert lockfile.replaced(path, "train", ROW20)  # as another command's would be
    reset()


def test_put_back_of_a_first_entry_leaves_no_file_and_nothing_its_own(tmp_path):
    reset()
    path = str(tmp_path / "dvc.lock")
    before = lockfile.before_write(path, "train")
    lockfile.write_entry(path, {}, "train", ROW10)
    lockfile.put_back(before)
    assert not (tmp_path / "dvc.lock").exists()
    assert not lockfile.replaced(path, "train", ROW20)
    reset()
