"""A bad environment gets an error naming the file and the fix, and nothing
recorded is lost: full disks, read-only signal dirs, wrong DVC_ROOT, stale
signals, a cache on another filesystem."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import dvc_dali
from dvc_dali.training import signal_file as dvc_signal

from tests.helpers import REPO, child_env
from tests.helpers.dvc_project import make_project, run
from tests.helpers.rows import exp_rows


def _can_mount() -> bool:
    probe = Path(f"/tmp/dvc-dali-mount-probe-{uuid.uuid4().hex[:6]}")
    probe.mkdir()
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", str(probe)], check=True)
        return ok
    except OSError:
        return False
    finally:
        probe.rmdir()


needs_mount = pytest.mark.skipif(os.geteuid() != 0 or not _can_mount(),
                                 reason="needs permission to mount a tmpfs / bind mount")


@contextmanager
def mounted(target: Path, *args: str):
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", *args, str(target)], check=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


SAVE_BIG = """
import resource, signal, sys, numpy as np, dvc_dali
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)    # get EFBIG instead of being killed
ck = dvc_dali.Checkpointer(sys.argv[1])
ck.save(1, arrays={"w": np.ones(1000)})
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # files up to 1 MiB
try:
    ck.save(2, arrays={"w": np.ones(1_000_000)})   # 8 MB: cannot be written
except dvc_dali.CheckpointWriteError as exc:
    print(exc)
"""


def test_file_size_limit_during_save_keeps_the_previous_checkpoint(tmp_path):
    out = subprocess.run([sys.executable, "-c", SAVE_BIG, str(tmp_path / "c")], text=True,
                         capture_output=True, env=child_env())
    assert "cannot write the checkpoint (File too large)" in out.stdout, out.stderr
    assert "The previous checkpoint in" in out.stdout and "is intact" in out.stdout
    back = dvc_dali.Checkpointer(tmp_path / "c")
    assert back.step == 1 and back.arrays["w"].shape == (1000,)
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".tmp-")]


@needs_mount
def test_disk_full_during_save_keeps_the_previous_checkpoint(tmp_path):
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=2m", "tmpfs") as small:
        ck = dvc_dali.Checkpointer(small / "c")
        ck.save(1, arrays={"w": np.ones(1000)})
        with pytest.raises(dvc_dali.CheckpointWriteError, match="No space left on device.*"
                           "previous checkpoint .* is intact. Free disk space"):
            ck.save(2, arrays={"w": np.ones(1_000_000)})
        back = dvc_dali.Checkpointer(small / "c")
        assert back.step == 1 and back.arrays["w"].shape == (1000,)
        assert not [p for p in (small / "c").iterdir() if p.name.startswith(".tmp-")]


@needs_mount
def test_signal_dir_not_writable(tmp_path, monkeypatch):
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    with mounted(tmp_path / ".dvc" / "tmp", "--bind", str(tmp_path / ".dvc" / "tmp")):
        subprocess.run(["mount", "-o", "remount,bind,ro", str(tmp_path / ".dvc" / "tmp")],
                       check=True)
        monkeypatch.setenv("DVC_CHECKPOINT", "1")
        monkeypatch.setenv("DVC_ROOT", str(tmp_path))
        with pytest.raises(dvc_dali.SignalError, match=r"\.dvc/tmp/DVC_CHECKPOINT: cannot "
                           r"create the checkpoint signal .*make .*\.dvc/tmp writable"):
            dvc_signal.make_checkpoint(1)


def test_dvc_root_wrong_or_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_CHECKPOINT", "1")  # DVC 2's protocol
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "nowhere"))
    with pytest.raises(dvc_dali.SignalError, match="nowhere.* is not a DVC repository.*dvc "
                       "exp run"):
        dvc_signal.make_checkpoint(1)
    monkeypatch.delenv("DVC_ROOT")
    with pytest.raises(dvc_dali.SignalError, match="none was found above"):
        dvc_signal.make_checkpoint(1)


def test_dvc_root_wrong_under_dvc3_is_refused_before_training(tmp_path):
    project = make_project(tmp_path, example=True)
    run(["dvc", "exp", "run"], project)  # prepares data/ and shows the stage works
    env = {**os.environ, "PYTHONPATH": str(REPO), "DVC_ROOT": str(tmp_path / "wrong"),
           "DVC_EXP_BASELINE_REV": "0" * 40, "DVC_STAGE": "train", "DVC_EXP_NAME": "x"}
    proc = subprocess.run([sys.executable, "examples/train.py"], cwd=project, env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "is not a DVC repository" in proc.stderr and "step " not in proc.stdout


def test_stale_signal_from_a_crashed_run_is_removed_and_said(tmp_path):
    project = make_project(tmp_path, example=True)
    (project / ".dvc" / "tmp").mkdir(parents=True, exist_ok=True)
    (project / ".dvc" / "tmp" / "DVC_CHECKPOINT").write_text("")
    out = run(["dvc", "exp", "run", "-n", "s"], project)
    assert "DVC_CHECKPOINT, a stale checkpoint signal left by an earlier run" in out.stderr
    assert "s-step60" in exp_rows(project)
    assert not (project / ".dvc" / "tmp" / "DVC_CHECKPOINT").exists()


def test_cache_on_another_filesystem(tmp_path):
    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is not another filesystem here")
    cache = Path("/dev/shm") / f"dvc-dali-cache-{uuid.uuid4().hex[:8]}"
    project = make_project(tmp_path, example=True)
    try:
        run(["dvc", "cache", "dir", str(cache)], project)
        run(["git", "commit", "-qam", "cache elsewhere"], project)
        run(["dvc", "exp", "run", "-n", "c"], project)
        run(["dvc", "exp", "apply", "c-step30"], project)
        assert dvc_dali.Checkpointer(project / "checkpoint").step == 30
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# --------------------------------------------------------------------------
# A bad DVC_DALI_* value, from every entry point: one line naming the
# variable and what it accepts, no traceback; DVC_DALI_DEBUG=1 adds it
# --------------------------------------------------------------------------

BAD_VALUES = {
    "DVC_DALI_KEEP_LAST": "abc",
    "DVC_DALI_KEEP_BEST": "train/loss",  # no :max or :min
    "DVC_DALI_LOCK_TIMEOUT": "soon",
    "DVC_DALI_SIGNAL_TIMEOUT": "-1",
    "DVC_DALI_SIGNAL_FILE": "relative/DVC_CHECKPOINT",
    "DVC_DALI_PUSH_GRACE": "1m",
    "DVC_DALI_DEBUG": "yes",
    "DVC_DALI_RETRAIN": "true",
    "DVC_DALI_RNG": "off",
    "DVC_DALI_CONTENT_DIGEST_MAX": "1GB",
    "DVC_DALI_VERIFY_BATCHES": "some",
    "DVC_DALI_INEXACT": "yes",
    "DVC_DALI_ASYNC": "yes",
}
# DVC_DALI_* variables only dvc-dali itself sets (no value of a user's is "bad")
SET_BY_DVC_DALI = {"DVC_DALI_RECORDS_ITSELF"}

ENTRY_POINTS = {
    "Checkpointer": [sys.executable, "-c", "import dvc_dali; dvc_dali.Checkpointer('c')"],
    "make_checkpoint": [sys.executable, "-c", "import dvc_dali; dvc_dali.make_checkpoint(1)"],
    "dvc-dali run": [sys.executable, "-m", "dvc_dali.cli", "run", "--", sys.executable, "-c",
                     "open('ran', 'w')"],
}


def _clean_env(**extra: str) -> dict:
    """This interpreter's environment without any DVC or dvc-dali variable
    (the suite may itself run in a DVC stage), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    return child_env(extra, base=env)


def _the_line(proc: subprocess.CompletedProcess, name: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    naming = [line for line in out.splitlines() if name in line]
    assert len(naming) == 1, out
    return naming[0]


def _dvc_dali_variables() -> set[str]:
    from dvc_dali.core.context import VARIABLES

    return {v for v in VARIABLES if v.startswith("DVC_DALI_")}


def test_every_dvc_dali_variable_has_a_bad_value_below():
    assert _dvc_dali_variables() - SET_BY_DVC_DALI <= set(BAD_VALUES)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_a_bad_variable_is_one_line_from_every_entry_point(tmp_path, entry, name):
    if name not in _dvc_dali_variables():
        pytest.skip(f"{name} is not read by this version")
    value = BAD_VALUES[name]
    proc = subprocess.run(ENTRY_POINTS[entry], cwd=tmp_path, capture_output=True, text=True,
                          env=_clean_env(**{name: value}))
    line = _the_line(proc, name)
    assert line.startswith("dvc-dali") and f"{name}={value!r}: must be" in line, line
    assert not list(tmp_path.iterdir())  # refused before anything is written or run
    if name != "DVC_DALI_DEBUG":
        debug = subprocess.run(ENTRY_POINTS[entry], cwd=tmp_path, capture_output=True,
                               text=True, env=_clean_env(**{name: value, "DVC_DALI_DEBUG": "1"}))
        assert debug.returncode != 0 and "Traceback" in debug.stderr, debug.stderr
        assert f"{name}={value!r}: must be" in debug.stderr.rstrip().splitlines()[-1]


def test_a_bad_variable_under_dvc_exp_run_is_one_line(tmp_path):
    project = make_project(tmp_path, example=True)
    proc = run(["dvc", "exp", "run", "-S", "train.lr=0.05"], project, check=False,
               env={"DVC_DALI_KEEP_LAST": "0"})
    line = _the_line(proc, "DVC_DALI_KEEP_LAST")
    assert "DVC_DALI_KEEP_LAST='0': must be a positive integer" in line, line
    assert "step " not in proc.stdout and not exp_rows(project)  # before any training step
    # DVC's own behaviour, which docs/reference/messages.md tells: a failed -S run
    # leaves params.yaml changed
    assert "lr: 0.05" in (project / "params.yaml").read_text()


# --------------------------------------------------------------------------
# The example without an extra it needs: one line naming the extra
# --------------------------------------------------------------------------

# A package that is not installed, honestly: no finder has it, and the import
# system raises ModuleNotFoundError (argv: blocked names, then the script's).
WITHOUT = '''
import importlib.abc, os, runpy, sys
blocked = sys.argv[1].split(",")

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@pytest.mark.parametrize("framework,blocked,env,says", [
    ("torch", "torch", {}, ["PyTorch is not installed", "No module named 'torch'",
                            "torch extra", "train.framework"]),
    ("keras", "keras,tensorflow", {}, ["TensorFlow is not installed", "tf extra",
                                        "train.framework"]),
    # TensorFlow without the second pip step (DALI's TF plugin)
    ("keras", "nvidia.dali.plugin.tf", {}, ["ConfigError", "nvidia.dali.plugin.tf",
                                            "nvidia-dali-tf-plugin"]),
    ("numpy", "", {"DVC_DALI_EXAMPLE_KILL_AT_STEP": "abc"},
     ["DVC_DALI_EXAMPLE_KILL_AT_STEP='abc': must be a step number", "unset it"]),
])
def test_the_example_without_what_it_needs_says_so_in_one_line(tmp_path, framework, blocked,
                                                                env, says):
    if framework == "keras" and blocked == "nvidia.dali.plugin.tf":
        pytest.importorskip("tensorflow")
        subprocess.run([sys.executable, str(REPO / "examples" / "prepare.py"), "data/digits"],
                       cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "params.yaml").write_text(f"train:\n  framework: {framework}\n")
    cmd = [sys.executable, "-c", WITHOUT, blocked, str(REPO / "examples" / "train.py")]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True,
                          env=_clean_env(**env))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    said = [line for line in proc.stderr.splitlines() if all(s in line for s in says)]
    assert len(said) == 1, out


@pytest.mark.parametrize("command", [["reset"], ["show"], ["push", "origin", "a"],
                                     ["pull", "origin", "a"], ["remove", "a"]])
def test_a_project_command_outside_a_dvc_project_says_where_to_run_it(tmp_path, command):
    out = subprocess.run([sys.executable, "-m", "dvc_dali.cli", *command], cwd=tmp_path,
                         capture_output=True, text=True, env=child_env())
    assert out.returncode == 1, out
    assert out.stderr.startswith(f"dvc-dali {command[0]}: not inside a DVC repository (no "
                                 f".dvc above {tmp_path}); run `dvc-dali {command[0]}` in the "
                                 "project"), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("broken", ["dvc.lock", "dvc.yaml"])
def test_a_broken_dvc_file_is_named_as_the_one_to_fix(tmp_path, broken):
    """A dvc.lock cut short blamed dvc.yaml ("Fix dvc.yaml")."""
    from tests.helpers.dvc_project import template_project

    project = template_project(tmp_path)
    (project / broken).write_text("stages: [\n")
    for command in (["reset"], ["doctor"]):
        out = subprocess.run([sys.executable, "-m", "dvc_dali.cli", *command], cwd=project,
                             capture_output=True, text=True, env=child_env())
        said = out.stdout + out.stderr
        assert out.returncode == 1 and "Traceback" not in said, said
        assert f"Fix {broken}" in said, said
        assert ("Fix dvc.yaml" not in said) if broken != "dvc.yaml" else True, said


def test_reset_of_an_empty_stage_name_names_no_stage(tmp_path):
    """`dvc-dali reset --stage ""` reset every stage; it is refused as empty."""
    from tests.helpers.dvc_project import template_project

    project = template_project(tmp_path)
    out = subprocess.run([sys.executable, "-m", "dvc_dali.cli", "reset", "--stage", ""],
                         cwd=project, capture_output=True, text=True, env=child_env())
    assert out.returncode == 1 and "--stage '' is empty" in out.stderr, out
    assert "Traceback" not in out.stderr, out


def test_the_main_repos_hooks_do_not_refuse_a_temp_runs_rows(tmp_path):
    """A --temp run's rows were pushed into the main repo through its
    receive-pack, so a pre-receive or reference-transaction hook there refused
    every row (the run died at its first checkpoint, the message blaming a
    lock or permissions), while a workspace run's rows, like DVC's own
    experiment refs, are written without hooks (found by a sweep)."""
    from tests.helpers.dvc_project import template_project

    project = template_project(tmp_path, steps=4)
    for hook in ("pre-receive", "reference-transaction"):
        path = project / ".git" / "hooks" / hook
        path.write_text(f"#!/bin/sh\necho {hook} refuses >&2\nexit 1\n")
        path.chmod(0o755)
    said = run(["dvc", "exp", "run", "--temp", "-n", "t", "-S", "train.checkpoint_every=2"],
               project)
    assert "refuses" not in said.stdout + said.stderr
    assert {"t-step2", "t-step4"} <= set(exp_rows(project))


@needs_mount
def test_a_read_only_dvc_cache_is_refused_before_the_first_step(tmp_path):
    """It failed at the first checkpoint, after the training up to it, with
    advice about another writer of the output (found by a sweep)."""
    from tests.helpers.dvc_project import template_project

    project = template_project(tmp_path, steps=4)
    cache = project / ".dvc" / "cache"
    cache.mkdir(exist_ok=True)
    with mounted(cache, "--bind", str(cache)):
        subprocess.run(["mount", "-o", "remount,ro,bind", str(cache)], check=True)
        refused = run(["dvc", "exp", "run", "-S", "train.checkpoint_every=2"], project,
                      check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "Traceback" not in said
    assert (f"RecordError: the DVC cache {cache} is not writable (a read-only file system), "
            "so no checkpoint could be recorded in it; training was not started.") in said, said
    assert "step 2" not in refused.stdout
    run(["dvc", "exp", "run", "-n", "w", "-S", "train.checkpoint_every=2"], project)
    assert {"w-step2", "w-step4"} <= set(exp_rows(project))


@pytest.mark.parametrize("err, says", [
    (errno.EROFS, "the DVC cache /c cannot be written: free space there or fix"),
    (errno.ENOSPC, "the DVC cache /c cannot be written"),
    (errno.ENOENT, "make sure nothing else writes or deletes that output"),
])
def test_a_failed_caching_names_the_cache_where_the_error_is_the_caches(err, says):
    from dvc_dali.recording.outputs import _cache_advice

    assert says in _cache_advice(OSError(err, os.strerror(err)), "/c")
    assert "nothing else writes" in _cache_advice(ValueError("changed"), "/c")


def test_metrics_git_ignores_are_said_once_not_left_out_of_rows_silently(tmp_path):
    """`dvclive/` in a global excludes file: every row was recorded without
    its metrics, without a word, so show and keep_best found none (found by
    a sweep; DVC's own experiment commit leaves them out alike)."""
    from tests.helpers.dvc_project import template_project

    project = template_project(tmp_path, steps=4)
    with open(project / ".git" / "info" / "exclude", "a") as fh:
        fh.write("dvclive/\n")
    said = run(["dvc", "exp", "run", "-n", "i", "-S", "train.checkpoint_every=2"], project)
    text = said.stdout + said.stderr
    assert text.count("dvc-dali: dvclive/metrics.json, dvclive/plots/metrics: uncached output "
                      "of stage 'train' that git ignores, so no row holds it") == 1, text
    assert "`git check-ignore -v dvclive/metrics.json` names the rule" in text
    assert {"i-step2", "i-step4"} <= set(exp_rows(project))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the project to another user")
def test_a_repository_git_refuses_as_another_users_says_so_not_to_repair_it(tmp_path):
    """A repository owned by another uid (a mounted volume): `show` told the
    user to run `git fsck` and delete refs, `doctor` said all was well
    (found by a sweep). It is git's safe.directory check, named with its fix."""
    from tests.helpers.dvc_project import template_project

    project = template_project(tmp_path, steps=4)
    subprocess.run(["chown", "-R", "12345:12345", str(project)], check=True)
    said = f"git refuses to read {project}: it is owned by another user (git's " \
           "safe.directory check)"
    shown = run(["dvc-dali", "show"], project, check=False)
    assert shown.returncode == 1 and said in shown.stderr, shown.stderr
    assert "git fsck" not in shown.stderr and "update-ref" not in shown.stderr
    doctor = run([sys.executable, "-m", "dvc_dali.cli", "doctor"], project, check=False)
    assert f"BAD  {said}" in doctor.stdout, doctor.stdout


def test_dvc_checkpoint_left_set_under_dvc3_is_refused_before_training(tmp_path):
    """DVC_CHECKPOINT=1 left in the shell (from DVC 2 days) under DVC 3's
    `dvc exp run`: nobody answers the signal, so the first checkpoint waited
    an hour and recorded nothing (found by a sweep). Refused at once."""
    from tests.helpers.dvc_project import template_project

    project = template_project(tmp_path)
    proc = run(["dvc", "exp", "run", "-n", "s"], project, check=False,
               env={"DVC_CHECKPOINT": "1", "DVC_DALI_SIGNAL_TIMEOUT": "120"})
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "DVC_CHECKPOINT=1 is set, but this is DVC 3's `dvc exp run`" in said, said
    assert "step 1" not in said and "Traceback" not in said, said


def test_a_signal_nobody_above_answers_is_said_before_the_wait(tmp_path):
    """DVC_CHECKPOINT left set in a shell, outside any `dvc exp run`: the
    first make_checkpoint() waited up to DVC_DALI_SIGNAL_TIMEOUT (an hour)
    without a word (found by a sweep). One line says so before it waits."""
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    script = "import dvc_dali\ndvc_dali.make_checkpoint(1)\n"
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120,
                          env=child_env({"DVC_CHECKPOINT": "0", "DVC_ROOT": str(tmp_path),
                                         "DVC_DALI_SIGNAL_TIMEOUT": "1"}))
    said = proc.stderr
    assert proc.returncode != 0 and "not removed within 1 s" in said, said
    warned = said.index("no such process runs above this one")
    assert warned < said.index("not removed within"), said
    assert "unset DVC_CHECKPOINT" in said and "Traceback" not in said, said
