"""Runs interrupted by what a user or a supervisor sends besides one Ctrl-C
or one SIGTERM: a second signal while the run stops. Real `dvc exp run`, real
DALI: the `dvc-dali init` template, each interruption timed by a file the
trainer writes (no sleeps)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tests.helpers import child_env
from tests.helpers.dvc_project import run, sigint_default
from tests.helpers.preempt import preemptible_project, trainer_ready
from tests.helpers.rows import exp_rows


def test_a_sigterm_while_a_ctrl_c_stops_the_run_is_ignored_and_said(tmp_path):
    """Ctrl-C, then SIGTERM while the run stops (in an exit hook of the
    program's own), in a loop that does not ask should_save: the SIGTERM
    raised SystemExit wherever the exit was, printing a traceback, a second
    'terminated (SIGTERM)' line, and cutting that exit hook short. It is
    ignored now, said once; the row kept resumes."""
    project = preemptible_project(tmp_path, at_exit=True)
    train = project / "train.py"
    train.write_text(train.read_text().replace(
        'ck.should_save(step, p["checkpoint_every"])', 'step % p["checkpoint_every"] == 0'))
    run(["git", "commit", "-qam", "no should_save"], project)
    proc = subprocess.Popen(
        ["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], cwd=project,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env=child_env({"PREEMPT_AT": "13"}, this_python=True), preexec_fn=sigint_default)
    trainer = trainer_ready(project, proc)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    while not (project / "preempt-ready-at-exit").exists():  # the run is stopping
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.01)
    os.kill(trainer, signal.SIGTERM)
    (project / "preempt-ready-sent").touch()
    out = proc.communicate()[0]
    assert proc.returncode != 0, out
    assert "Traceback" not in out and "terminated (SIGTERM)" not in out, out
    assert "dvc-dali: interrupted (Ctrl-C): step 10 is kept as row a-step10" in out, out
    assert out.count("dvc-dali: SIGTERM: ignored, the run is stopping") == 1, out
    assert {r["step"] for r in exp_rows(project).values()} == {5, 10}
    again = run(["dvc", "exp", "run", "-S", "train.checkpoint_every=5"], project)
    assert "resuming at step 10" in again.stdout, again.stdout
