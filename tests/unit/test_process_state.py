"""process_state: every field of STATE back to its initial value on reset(),
and a forked child starting without its parent's threads, locks and handles."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from types import SimpleNamespace

import pytest

from dvc_dali.core import process_state
from dvc_dali.core.process_state import STATE, ProcessState, reset


def _dirty() -> dict[str, object]:
    """A value unlike the initial one for every field, set on STATE."""
    fresh = ProcessState()
    changed: dict[str, object] = {}
    for f in fields(ProcessState):
        initial = getattr(fresh, f.name)
        if isinstance(initial, bool):
            value: object = not initial
        elif isinstance(initial, int):
            value = initial + 7
        elif isinstance(initial, str):
            value = initial + "x"
        elif f.name == "start_changes":  # a watcher to close
            value = {"top": SimpleNamespace(watcher=SimpleNamespace(close=lambda: None))}
        elif f.name == "held_dir_locks":  # a descriptor to close
            value = {"lock": [os.open(os.devnull, os.O_RDONLY), 1, 1]}
        elif isinstance(initial, dict):
            value = {"k": "v"}
        elif isinstance(initial, set):
            value = {"v"}
        elif f.name in ("write_pool", "background_pool"):
            value = ThreadPoolExecutor(1)
        elif f.name == "record_lock":
            value = threading.Lock()
        else:  # an Optional left None
            value = object()
        changed[f.name] = value
        setattr(STATE, f.name, value)
    return changed


def _initial(name: str) -> bool:
    value, fresh = getattr(STATE, name), getattr(ProcessState(), name)
    if name == "record_lock":
        return type(value) is type(fresh) and not value.locked()
    return value == fresh


@pytest.fixture(autouse=True)
def clean():
    reset()
    yield
    reset()


def test_reset_returns_every_field_to_its_initial_value():
    changed = _dirty()
    lock = STATE.record_lock
    lock.acquire()  # held by a thread that is gone: a new lock comes back
    reset()
    assert STATE.record_lock is not lock
    left = [name for name in changed if not _initial(name)]
    assert not left, f"reset() left {left} as they were"


def test_reset_releases_the_checkpoint_directory_locks(tmp_path):
    from dvc_dali.format import dirlock

    dirlock.acquire(tmp_path / "ckpt")
    reset()
    other = os.fork()  # a second process takes the lock: the first let it go
    if other == 0:
        try:
            dirlock.acquire(tmp_path / "ckpt")
        except BaseException:
            os._exit(1)
        os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(other, 0)[1]) == 0


def test_a_forked_child_does_not_hold_its_parents_directory_lock(tmp_path):
    """A child made by os.fork() inherited the parent's lock table, so its own
    Checkpointer on the parent's directory was let in and overwrote the
    parent's checkpoint (found by a sweep); now it is refused, and the
    parent still holds the lock after the child ended."""
    from dvc_dali.core.errors import CheckpointLockedError
    from dvc_dali.format import dirlock

    held = dirlock.acquire(tmp_path / "ckpt")
    try:
        child = os.fork()
        if child == 0:
            try:
                dirlock.acquire(tmp_path / "ckpt")
            except CheckpointLockedError:
                os._exit(0)
            except BaseException:
                os._exit(2)
            os._exit(1)  # let in
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
        assert dirlock.holder(tmp_path / "ckpt") is None  # ours, still held here
        other = os.fork()  # a process of its own is refused too: the lock outlived the child
        if other == 0:
            process_state.reset()
            os._exit(0 if _refused(tmp_path / "ckpt") else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(other, 0)[1]) == 0
    finally:
        held.release()


def _refused(path) -> bool:
    from dvc_dali.core.errors import CheckpointLockedError
    from dvc_dali.format import dirlock

    try:
        dirlock.acquire(path)
    except CheckpointLockedError:
        return True
    return False


def test_a_forked_child_starts_without_its_parents_threads_locks_and_handles():
    changed = _dirty()
    STATE.record_lock.acquire()  # as if another thread were recording at the fork
    fork_reset = {f.name for f in fields(ProcessState) if f.metadata.get("fork") == "reset"}
    assert {"pusher", "write_pool", "background_pool", "record_lock", "git_repos",
            "dvc_repos"} <= fork_reset
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report which fields are initial, then leave at once
        os.close(read)
        report = ",".join(sorted(name for name in changed if _initial(name)))
        os.write(write, report.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        clean_in_child = set(filter(None, pipe.read().split(",")))
    os.waitpid(pid, 0)
    STATE.record_lock.release()
    # reset in the child: what no thread there runs or owns; inherited: the rest
    assert clean_in_child == fork_reset
    assert process_state.STATE is STATE
