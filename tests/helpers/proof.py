"""The proof-at-runtime tests' tools: the proof runner launched in a
process of its own, what it wrote, and data files changed in place with
their size and mtime kept (what DVC and a names-and-sizes listing miss)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

from tests.helpers import forked


def run(kind: str, data: Path, ckpt: Path, out: Path, until: int, save_at=(),
        kill_after=None, **env: str) -> subprocess.CompletedProcess:
    """proof_runner.py KIND over ``data``, with only ``env`` of our variables."""
    args = [kind, str(data), str(ckpt), str(out), "--until", str(until)]
    if save_at:
        args += ["--save-at", *map(str, save_at)]
    if kill_after is not None:
        args += ["--kill-after", str(kill_after)]
    return forked.run("proof_runner.py", args, env, environ=runner_environ())


def runner_environ() -> dict[str, str]:
    """This process's environment without our variables (DVC_*, PROOF_*):
    what a proof runner starts from."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "PROOF_"))}


def companion(ckpt: Path) -> Path:
    """Where a checkpoint outside DVC keeps its batch digests."""
    return ckpt.parent / f".{ckpt.name}.dvc-dali-batches"


def outputs(out: Path) -> dict[str, np.ndarray]:
    with np.load(out, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def same_as_uninterrupted(kind: str, data: Path, tmp: Path, resumed: Path, until: int) -> None:
    """A fresh run of ``kind`` to ``until`` (in ``tmp``/whole) produced every
    sample the resumed run wrote to ``resumed``."""
    whole = run(kind, data, tmp / "whole", tmp / "whole.npz", until)
    assert whole.returncode == 0, whole.stderr[-3000:]
    got, want = outputs(resumed), outputs(tmp / "whole.npz")
    keys = [k for k in got if k[:4].isdigit()]
    assert keys and all(np.array_equal(got[k], want[k]) for k in keys)


def manifest(ckpt: Path) -> dict:
    name = (ckpt / "LATEST").read_text().split()[0]
    return json.loads((ckpt / name / "manifest.json").read_text())


def keep_size_and_mtime(path: Path, raw: bytes) -> None:
    """``raw`` written over ``path``, whose size it must have; mtime kept."""
    before = path.stat()
    path.write_bytes(raw)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def rewrite_same_size_and_mtime(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one byte in the middle of the JPEG's entropy data
    keep_size_and_mtime(path, bytes(raw))


def perturb_same_size_and_mtime(path: Path) -> None:
    """One bit of the JPEG's entropy-coded scan flipped (never into or next
    to a 0xFF marker byte, so it still decodes, to other pixels)."""
    raw = bytearray(path.read_bytes())
    sos = raw.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(raw[sos + 2:sos + 4], "big")
    i = (start + len(raw) - 2) // 2
    while raw[i] >= 0xFE or raw[i - 1] == 0xFF or raw[i + 1] == 0xFF:
        i += 1
    raw[i] ^= 0x01
    keep_size_and_mtime(path, bytes(raw))


def refused_then_inexact(kind: str, data: Path, ckpt: Path, out: Path, who: str,
                         **env: str) -> str:
    """The resume of ``ckpt`` (saved at step 2) refused at step 3 naming
    ``who`` ("pipeline 'train'"), its first output's bytes differing, then run
    on purpose with DVC_DALI_INEXACT=1, said once. The refusal's text."""
    proc = run(kind, data, ckpt, out, 6, **env)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "BatchMismatchError" in text and "Traceback" not in text, text
    assert f"{who}: batch 1 after the checkpoint at step 2 (" in text, text
    assert "output 0: same dtype and shapes, other bytes" in text, text
    assert "output 1:" not in text, text  # the labels (and a random draw) are the same
    assert "DVC_DALI_INEXACT=1" in text and "dvc-dali reset" in text, text
    assert not out.exists()
    # on purpose: it goes on, says so once, and records the new batches
    proc = run(kind, data, ckpt, out, 6, DVC_DALI_INEXACT="1", **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("no longer exact") == 1, proc.stderr
    return text
