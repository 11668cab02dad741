"""The writer refuses what the reader would refuse, before any file: a step
the manifest's schema does not take, metadata or params that are not plain
JSON; each in one line (a ConfigError naming the argument)."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from dvc_dali.core.errors import ConfigError
from dvc_dali.format import store

READER_MAX = (1 << 63) - 1  # manifest_schema's integers (what an off_t holds)


def capture(step, metadata=None, params=None, total_steps=None) -> store.Capture:
    return store.Capture(step, {}, {"w": np.ones(2)}, metadata or {}, {},
                         run={"params": params or {}, "total_steps": total_steps})


def save(root, cap: store.Capture) -> store.Snapshot:
    name, md5 = store.write_capture(root, cap)
    store.publish(root, [(name, md5)])
    store.remove_leftovers(root, keep=name)
    return store.read_snapshot(root)


@pytest.mark.parametrize("step", [-1, "1", 1.5, True, None, np.int64(3), 1 << 63, 10 ** 30])
def test_a_step_the_reader_refuses_is_refused_before_any_file(tmp_path, step):
    """2**63 was written, LATEST moved to it and the good checkpoint before
    it was deleted; then every resume refused the manifest."""
    good = save(tmp_path, capture(5))
    with pytest.raises(ConfigError) as err:
        save(tmp_path, capture(step))
    assert str(err.value).startswith(f"step={step!r}: must be an int from 0 to {READER_MAX}")
    assert store.read_snapshot(tmp_path).path == good.path  # LATEST and the snapshot kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([store.LATEST, good.path.name])


def test_the_writers_limit_is_the_readers(tmp_path):
    assert store.MAX_STEP == READER_MAX
    assert save(tmp_path, capture(READER_MAX, total_steps=READER_MAX)).step == READER_MAX


@pytest.mark.parametrize("total_steps", [-1, 1 << 63, "10", True])
def test_total_steps_the_reader_refuses(tmp_path, total_steps):
    with pytest.raises(ConfigError, match=r"^total_steps="):
        save(tmp_path, capture(1, total_steps=total_steps))
    assert not (tmp_path / store.LATEST).exists()


@pytest.mark.parametrize("where,bad", [
    ("metadata", {"x": float("nan")}), ("metadata", {"x": float("inf")}),
    ("metadata", {"x": object()}), ("metadata", {"x": {1, 2}}),
    ("params", {"lr": float("nan")}), ("params", {"f": object()}),
])
def test_metadata_and_params_not_plain_json_are_named(tmp_path, where, bad):
    cap = capture(1, **{where: bad})
    with pytest.raises(ConfigError) as err:
        save(tmp_path, cap)
    message = str(err.value)
    assert message.startswith(f"{where}=") and "\n" not in message, message
    assert "metadata and params must be plain JSON" in message
    assert isinstance(err.value, TypeError)  # what save raised for them before
    assert not (tmp_path / store.LATEST).exists()


def test_check_json_names_the_argument_and_cuts_a_long_value():
    with pytest.raises(ConfigError) as err:
        store.check_json({"x": [0] * 1000 + [float("nan")]}, "metadata")
    assert str(err.value).startswith("metadata={'x': [0, 0,") and len(str(err.value)) < 400
    assert store.check_json({"b": 1, "a": [1.5, None]}, "metadata") == \
        '{"a": [1.5, null], "b": 1}'


@pytest.mark.parametrize("latest, err, says", [
    (True, errno.ENOSPC, "The previous checkpoint in {root} is intact. Free disk space"),
    (False, errno.EACCES, "{root} holds no complete checkpoint. Free disk space"),
    (True, errno.ENOENT, "is intact. A part of {root} was removed while the checkpoint was "
     "written: nothing else may remove"),
    (False, errno.ENOENT, "{root} holds no complete checkpoint. A part of {root} was removed"),
])
def test_a_failed_write_says_intact_only_where_latest_names_a_checkpoint(tmp_path, latest,
                                                                        err, says):
    """A save whose directory was removed while it was written said "the
    previous checkpoint is intact" and "free disk space" (found by a sweep)."""
    root = tmp_path / "ck"
    if latest:
        save(root, capture(1))
    told = store._after_failed_write(OSError(err, os.strerror(err)), root)
    assert says.format(root=root) in told


@pytest.mark.parametrize("latest", [True, False])
def test_a_ranks_failed_write_reads_the_latest_above_its_directory(tmp_path, latest):
    """Several ranks: a rank writes into rank-NNNNN/ and LATEST is beside
    those directories; a rank's failed write said its directory "holds no
    complete checkpoint" though LATEST named one (found by a sweep)."""
    top = tmp_path / "ck"
    (top / "rank-00001").mkdir(parents=True)
    if latest:
        (top / store.LATEST).write_text("rank-00000/step-1 x\nrank-00001/step-1 y\n")
    told = store._after_failed_write(OSError(errno.ENOSPC, "full"), top / "rank-00001",
                                     ranked=True)
    says = (f"The previous checkpoint in {top} is intact." if latest
            else f"{top} holds no complete checkpoint.")
    assert told.startswith(says), told
