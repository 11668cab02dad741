"""When our hold on DVC's workspace stash queue ends (recording/dvc_door.py):
when the `dvc exp run` that runs the stage is done with its entry, told by
DVC's run info file, or when that process ended."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from dvc_dali.recording.dvc_door import run_info_pid, wait_for_entry_end


@pytest.mark.parametrize("text, pid", [
    (None, None),                      # no file: DVC runs no entry
    ("", None),                        # cut short by a kill
    ("{not json", None),
    ('{"cmd": "dvc"}', None),           # no pid
    ('{"pid": "x"}', None),
    ('{"pid": 4242, "cmd": null}', 4242),
])
def test_the_pid_the_run_info_names(tmp_path, text, pid):
    path = tmp_path / "workspace.json"
    if text is not None:
        path.write_text(text)
    assert run_info_pid(str(path)) == pid
    assert run_info_pid(None) is None


@pytest.fixture
def dvc_like():
    """A live process standing for `dvc exp run` (it ends when told)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    yield proc
    proc.stdin.close()
    proc.wait()


def _waiting(pid: int, info: str) -> threading.Thread:
    thread = threading.Thread(target=wait_for_entry_end, args=(pid, info, 0.01))
    thread.start()
    return thread


def test_the_hold_lasts_while_the_entry_runs_and_ends_when_dvc_moves_on(tmp_path, dvc_like):
    info = tmp_path / "workspace.json"
    info.write_text(json.dumps({"pid": dvc_like.pid}))
    waiter = _waiting(dvc_like.pid, str(info))
    waiter.join(0.2)  # not a timing: it must not have returned at all
    assert waiter.is_alive()
    info.unlink()  # DVC's final commit of the entry is done
    waiter.join()
    assert dvc_like.poll() is None  # returned while `dvc exp run` goes on


def test_another_pid_in_the_run_info_ends_the_hold(tmp_path, dvc_like):
    info = tmp_path / "workspace.json"
    info.write_text(json.dumps({"pid": dvc_like.pid + 1}))
    waiter = _waiting(dvc_like.pid, str(info))
    waiter.join()


def test_the_end_of_the_process_ends_the_hold(tmp_path, dvc_like):
    info = tmp_path / "workspace.json"
    info.write_text(json.dumps({"pid": dvc_like.pid}))  # left by a killed run
    waiter = _waiting(dvc_like.pid, str(info))
    dvc_like.stdin.close()
    waiter.join()
    assert dvc_like.wait() == 0
