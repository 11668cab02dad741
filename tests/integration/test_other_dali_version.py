"""Proof at runtime across a DALI upgrade: a checkpoint saved with the
installed DALI is resumed with the previous minor release, installed from
PyPI into a venv of its own (so the manifest's DALI version really
differs). The resume is not trusted on the version's word: its batches are
compared with those the first run produced; where they differ, the refusal
names the DALI change and what else could explain it."""

from __future__ import annotations

import re
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.helpers import HELPERS, cached_venv, child_env, pipelines
from tests.helpers.proof import perturb_same_size_and_mtime, runner_environ
from tests.helpers.proof import run as proof_run

DALI = "nvidia-dali-cuda120"


def previous_minor(installed: str) -> str | None:
    major, minor = (int(p) for p in installed.split(".")[:2])
    return f"{major}.{minor - 1}.*" if minor > 0 else None


@pytest.fixture(scope="module")
def other_python() -> tuple[Path, str]:
    """A Python with the previous DALI release (and dvc-dali from this tree by
    PYTHONPATH), in a venv kept in ~/.cache/dvc-dali (tests/helpers/cached_venv.py):
    its 400 MB wheel is downloaded once per machine, not on every run."""
    wanted = previous_minor(version(DALI))
    if wanted is None:
        pytest.skip(f"{DALI} {version(DALI)} has no earlier minor release to resume with")
    try:
        venv = cached_venv.ensure(cached_venv.location(f"dali-{wanted.rstrip('.*')}-venv"),
                                  [f"{DALI}=={wanted}", "numpy", "isal"])
    except cached_venv.VenvUnavailable as exc:  # no index reachable: nothing to test here
        pytest.skip(str(exc))
    python = cached_venv.python(venv)
    other = subprocess.run([str(python), "-c", "import nvidia.dali as d; print(d.__version__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert other != version(DALI)
    return python, other


def resume_with(python: Path, data: Path, ckpt: Path, out: Path, **env: str):
    return subprocess.run([str(python), str(HELPERS / "proof_runner.py"), "rotate", str(data),
                           str(ckpt), str(out), "--until", "6"], capture_output=True, text=True,
                          env=child_env(env, base=runner_environ()))


def test_a_resume_with_another_dali_is_proved_by_its_batches(tmp_path, other_python):
    python, other = other_python
    data = pipelines.make_data(tmp_path / "data")
    ckpt = tmp_path / "ckpt"
    off = {"DVC_DALI_CONTENT_DIGEST_MAX": "0"}  # so only the batches can tell the data
    first = proof_run("rotate", data, ckpt, tmp_path / "first.npz", 6, save_at=[2],
                      kill_after=4)
    assert first.returncode == -9, first.stderr[-3000:]

    # the same data: the batches decide, whichever way they come out
    resumed = resume_with(python, data, ckpt, tmp_path / "resumed.npz", **off)
    said = resumed.stdout + resumed.stderr
    assert "Traceback" not in said, said
    if resumed.returncode == 0:
        assert re.search(r"pipeline 'train': the (batch|2 batches) after the checkpoint "
                         r"at step 2 (is the one|are "
                         r"those) the run "
                         r"it resumes produced", said), said
    else:
        assert "BatchMismatchError" in said and f"DALI {version(DALI)} -> {other}" in said, said

    # the data rewritten in place too: refused, the DALI change named among the causes
    for path in (data / "images").rglob("*.jpg"):
        perturb_same_size_and_mtime(path)
    refused = resume_with(python, data, ckpt, tmp_path / "refused.npz", **off)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "Traceback" not in said, said
    assert "pipeline 'train': batch 1 after the checkpoint at step 2 (" \
        in said, said
    assert f"since then: DALI {version(DALI)} -> {other}; " in said, said
    assert "a file rewritten in place with its old size" in said, said
