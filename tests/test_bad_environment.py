"""A bad environment gets an error naming the file and the fix, and nothing
recorded is lost: full disks, read-only signal dirs, wrong DVC_ROOT, stale
signals, a cache on another filesystem."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from dvc_project import clone_project, exp_rows, run

import dvc_dali
from dvc_dali import checkpoint_signal as dvc_signal


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
                         capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
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
    project = clone_project(tmp_path)
    run(["dvc", "exp", "run"], project)  # prepares data/ and shows the stage works
    env = {**os.environ, "PYTHONPATH": str(REPO), "DVC_ROOT": str(tmp_path / "wrong"),
           "DVC_EXP_BASELINE_REV": "0" * 40, "DVC_STAGE": "train", "DVC_EXP_NAME": "x"}
    proc = subprocess.run([sys.executable, "examples/train.py"], cwd=project, env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "is not a DVC repository" in proc.stderr and "step " not in proc.stdout


def test_stale_signal_from_a_crashed_run_is_removed_and_said(tmp_path):
    project = clone_project(tmp_path)
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
    project = clone_project(tmp_path)
    try:
        run(["dvc", "cache", "dir", str(cache)], project)
        run(["git", "commit", "-qam", "cache elsewhere"], project)
        run(["dvc", "exp", "run", "-n", "c"], project)
        run(["dvc", "exp", "apply", "c-step30"], project)
        assert dvc_dali.Checkpointer(project / "checkpoint").step == 30
    finally:
        shutil.rmtree(cache, ignore_errors=True)
