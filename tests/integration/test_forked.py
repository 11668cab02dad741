"""The runner processes forked from a zygote (tests/helpers/forked.py,
zygote.py) behave as `python SCRIPT ARGS` does where the tests look: the
exit status (a signal's as negative), stdout and stderr, the environment
and cwd asked for, atexit and non-daemon threads at the end, a traceback
and status 1 for what escapes; and each zygote holds no thread and no
dvc_dali module when it forks, so a child starts as fresh as a new
interpreter for everything the product does."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.helpers import REPO, forked

SCRIPT = r'''
import atexit, json, os, signal, sys, threading, time
cfg = json.loads(sys.argv[1])
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("FORKED_TEST"))
print("stderr line", file=sys.stderr)
modules = sorted(m for m in sys.modules if m.split(".")[0] in ("dvc_dali", "dvc"))
print("modules", json.dumps(modules))
print("threads", json.dumps(sorted(os.listdir("/proc/self/task"))), "pid", os.getpid())
atexit.register(lambda: print("atexit ran", flush=True))
if cfg.get("thread"):  # a non-daemon thread: the interpreter joins it before exiting
    threading.Thread(target=lambda: (time.sleep(0.05), print("thread joined"))).start()
if cfg.get("kill"):
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
if cfg.get("raise"):
    raise ValueError("escaped")
sys.exit(cfg.get("exit", 0))
'''

LIGHT = ({"OPENBLAS_NUM_THREADS": "1"}, ("json", "numpy"))


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "case.py"
    path.write_text(SCRIPT)
    return path


def lines(text: str, head: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(head)]


def test_a_forked_runner_is_a_process_of_its_own(script, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = forked.run(script, [json.dumps({"thread": True, "exit": 3})],
                      {"FORKED_TEST": "yes"}, preload=LIGHT)
    assert proc.returncode == 3, proc
    assert lines(proc.stdout, "argv") == [
        f"argv ['{json.dumps({'thread': True, 'exit': 3})}'] cwd {tmp_path} env yes"]
    assert proc.stderr == "stderr line\n"
    assert "thread joined" in proc.stdout and proc.stdout.endswith("atexit ran\n"), proc.stdout
    assert lines(proc.stdout, "modules") == ["modules []"]
    again = forked.run(script, ["{}"], preload=LIGHT)
    assert again.returncode == 0 and lines(again.stdout, "argv")[0].endswith("env None")
    pids = {line.split()[-1] for line in lines(proc.stdout + again.stdout, "threads")}
    assert lines(proc.stdout, "threads")[0].startswith('threads ["')
    assert len(pids) == 2 and str(os.getpid()) not in pids


def test_a_signal_and_an_exception_end_it_as_they_end_python(script):
    killed = forked.run(script, [json.dumps({"kill": True})], preload=LIGHT)
    assert killed.returncode == -9 and "atexit ran" not in killed.stdout, killed
    raised = forked.run(script, [json.dumps({"raise": True})], preload=LIGHT)
    assert raised.returncode == 1, raised
    assert "Traceback" in raised.stderr and "ValueError: escaped" in raised.stderr
    assert raised.stdout.endswith("atexit ran\n")


@pytest.mark.parametrize("runner", sorted(forked.PRELOAD))
def test_each_runners_zygote_forks_fresh_children(script, runner):
    """What the runners share: third-party modules imported, nothing started
    (the zygote checks it before each fork)."""
    pytest.importorskip("tensorflow" if runner == "tf_runner.py" else "numpy")
    proc = forked.run(script, ["{}"], preload=forked.PRELOAD[runner])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lines(proc.stdout, "modules") == ["modules []"]


@pytest.mark.parametrize("module,why", [("dvc_dali.core.errors", ".*dvc_dali.core.errors"),
                                        ("starts_a_thread", "2 threads")])
def test_a_zygote_that_would_not_fork_fresh_children_refuses(script, tmp_path, module, why):
    """A dvc_dali module or a second thread in the zygote: no child at all."""
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n")
    preload = ({"PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}", "OPENBLAS_NUM_THREADS": "1"},
               ("json", module))
    with pytest.raises(AssertionError, match=f"would not fork a fresh process: {why}"):
        forked.run(script, ["{}"], preload=preload)


def test_without_the_zygote_the_same(script, monkeypatch):
    monkeypatch.setenv("DVC_DALI_TEST_NO_ZYGOTE", "1")
    proc = forked.run(script, [json.dumps({"exit": 3})], {"FORKED_TEST": "x"}, preload=LIGHT)
    assert proc.returncode == 3 and proc.args[0] == sys.executable
    assert lines(proc.stdout, "argv")[0].endswith("env x")
