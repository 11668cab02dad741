"""A `dvc-dali init` template project whose trainer waits for a signal at step
PREEMPT_AT, and `dvc exp run` started so that the test can signal it there
(the preemption, load and push tests)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from tests.helpers import child_env
from tests.helpers.dvc_project import run, sigint_default, template_project

# The trainer, at step PREEMPT_AT, says it is ready and waits for the
# signal (or the file preempt-go in DVC_ROOT), so the test knows the step it
# lands on.
WAIT_FOR_SIGNAL = '''
    if step == int(os.environ.get("PREEMPT_AT", "0")):
        import time
        with open("preempt-ready.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace("preempt-ready.tmp", "preempt-ready")
        while ck.preempted is None and not os.path.exists(
                os.path.join(os.environ.get("DVC_ROOT", "."), "preempt-go")):
            time.sleep(0.01)
'''
USER_HANDLER = '''
import signal
signal.signal(signal.SIGUSR1, lambda s, f: open("user-handler-ran", "w").close())
'''

# The user's own exit hook, registered before dvc-dali's (so it runs after
# them): it waits there until the test has sent its signal to the stopping run.
AT_EXIT = '''
import atexit
import time
def _wait_for_the_second_signal():
    open("preempt-ready-at-exit", "w").close()
    while not os.path.exists("preempt-ready-sent"):
        time.sleep(0.01)
atexit.register(_wait_for_the_second_signal)
'''


def preemptible_project(tmp_path: Path, user_handler: bool = False,
                        at_exit: bool = False) -> Path:
    """The template waiting at PREEMPT_AT; ``at_exit``: and at its exit, until
    the file preempt-ready-sent appears (it wrote preempt-ready-at-exit)."""
    project = template_project(tmp_path)
    train = project / "train.py"
    text = train.read_text()
    loop_body = "    x, y = (np.asarray(out.as_tensor()) for out in pipe.run())\n"
    text = text.replace(loop_body, loop_body + WAIT_FOR_SIGNAL.lstrip("\n"))
    if user_handler:
        text = text.replace("import dvc_dali\n", "import dvc_dali\n" + USER_HANDLER)
    if at_exit:
        text = text.replace("import dvc_dali\n", "import dvc_dali\n" + AT_EXIT, 1)
    train.write_text(text)
    (project / ".gitignore").write_text("preempt-ready*\npreempt-go\nuser-handler-ran\n")
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "preemptible"], project)
    return project


def start(project: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(["dvc", "exp", "run", *args], cwd=project, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=child_env(env, this_python=True), start_new_session=True)


def trainer_ready(project: Path, proc: subprocess.Popen) -> int:
    """The trainer's pid, once it waits at PREEMPT_AT (it wrote the file)."""
    ready = project / "preempt-ready"
    while not ready.exists():
        if proc.poll() is not None:
            raise AssertionError(f"dvc exp run ended before the trainer got ready:\n"
                                 f"{proc.stdout.read()}")
        time.sleep(0.02)
    return int(ready.read_text())


def ctrl_c_then(project: Path, second: Callable[[int, int], None]) -> tuple[int, str]:
    """`dvc exp run -n a` (a checkpoint every 5 steps) of a project made with
    ``at_exit``, Ctrl-C'd at step 13 as a terminal does (its whole group),
    then ``second(dvc's pid, the trainer's pid)`` while the run stops (in its
    exit hook): (return code, output)."""
    proc = subprocess.Popen(
        ["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], cwd=project,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env=child_env({"PREEMPT_AT": "13"}, this_python=True), preexec_fn=sigint_default)
    trainer = trainer_ready(project, proc)
    os.killpg(proc.pid, signal.SIGINT)
    while not (project / "preempt-ready-at-exit").exists():  # the run is stopping
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.01)
    second(proc.pid, trainer)
    (project / "preempt-ready-sent").touch()
    out = proc.communicate()[0]
    return proc.returncode, out


def weights(project: Path) -> str:
    return hashlib.sha256((project / "model/weights.npy").read_bytes()).hexdigest()
