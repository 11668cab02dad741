"""Launching tests/helpers/tf_runner.py (a TensorFlow pipeline saved and
resumed in a process of its own) and comparing what it saw: shared by
tests/integration/test_tf.py and test_tf_proof.py."""

from __future__ import annotations

import json
import subprocess

import numpy as np

from tests.helpers import forked


def runner(cfg: dict, data, ckpt, out, ok: bool = True, **env: str
           ) -> tuple[dict, subprocess.CompletedProcess]:
    proc = forked.run("tf_runner.py", [json.dumps(cfg), str(data), str(ckpt), str(out)], env)
    if not ok:
        return {}, proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}, proc


def same_from(reference: dict, resumed: dict, start: int) -> None:
    later = sorted(k for k in reference if int(k[:4]) > start)
    assert later and sorted(resumed) == later, "the resumed run saw other steps"
    for key in later:
        assert np.array_equal(reference[key], resumed[key]), f"{key} differs after the restore"
