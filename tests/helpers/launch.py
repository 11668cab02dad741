"""Runner scripts of tests/helpers started in a process of their own, and the
GPU skip mark of the tests that compare what they wrote."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import forked


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


requires_gpu = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")


def run_script(script: str, args: list[str], out: Path) -> dict[str, np.ndarray]:
    """Run a runner script from tests/helpers in a new process (forked.py) and
    load its .npz."""
    proc = forked.run(script, args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def run_runner(kind: str, data: Path, ckpt: Path, out: Path, until: int,
               save_at=(), fresh=False, shuffle=True, device="cpu") -> dict[str, np.ndarray]:
    """resume_runner.py: pipelines driven with pipe.run()."""
    args = [kind, str(data), str(ckpt), str(out), "--until", str(until),
            "--shuffle", str(int(shuffle)), "--device", device]
    if save_at:
        args += ["--save-at", *map(str, save_at)]
    if fresh:
        args.append("--fresh")
    return run_script("resume_runner.py", args, out)


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
