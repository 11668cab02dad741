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


def test_a_failed_row_whose_dvc_lock_cannot_be_put_back_says_what_to_apply(tmp_path):
    """The row failed (a full disk) and the put back fails too (its directory
    gone here): one line, the row's error first, then the row to apply; with
    no row yet in this process, not `dvc-dali reset` (it drops the resume)."""
    import types

    import pytest

    from dvc_dali.core.errors import RecordError
    from dvc_dali.core.record_request import RecordRequest
    from dvc_dali.recording import pipeline

    reset()
    path = str(tmp_path / "gone" / "dvc.lock")
    before = lockfile.Before(path, "train", "stages: {}\n", None)
    lock = pipeline._LockWrite(path, {}, None, ROW20, before, "")
    for kept, says in [((10, "a-step10"), "run `dvc exp apply a-step10` before the next"),
                       (None, "`dvc exp apply` of the run's last row (`dvc-dali show`")]:
        where = types.SimpleNamespace(run=types.SimpleNamespace(kept=kept))
        with pytest.raises(RecordError) as raised:
            with pipeline._lock_put_back_on_failure(where, lock, RecordRequest(step=20)):
                raise OSError(28, "No space left on device")
        said = str(raised.value)
        assert said.startswith("[Errno 28] No space left on device. Also, ") and "\n" not in said
        assert f"{path} could not be put back" in said and "of step 20, which no row" in said
        assert says in said and "reset" not in said, said
    reset()
