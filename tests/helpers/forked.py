"""Runner scripts of tests/helpers, each in a fresh process forked from a
zygote that has already imported the script's heavy libraries
(tests/helpers/zygote.py): one zygote per pytest process and library set, started
at its first use and ended with that process. A TensorFlow runner's process
took about 6 CPU-s to import TensorFlow, Keras and DALI's plugin, a torch
one 2; forked, it starts in milliseconds. What the child shares with its
siblings is only what PRELOAD names (third-party modules, never dvc_dali)
and the zygote's hash seed; `dvc exp run` end-to-end tests keep starting
real interpreters.

DVC_DALI_TEST_NO_ZYGOTE=1 runs every runner as `python SCRIPT ARGS` instead.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Mapping

from tests.helpers import HELPERS, child_env, tf_env

# What each runner imports before its first line of test, and how: the
# environment it imports with (tf_runner.py's, tf_env.py; elsewhere one BLAS
# thread, as OpenBLAS would otherwise start its pool at import, and a zygote
# forks with one thread only) and the modules it makes absent ("-name").
_ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1"}
PRELOAD: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "tf_runner.py": (tf_env.ENV, tuple(f"-{name}" for name in tf_env.ABSENT) + (
        "numpy", "keras", "tensorflow", "nvidia.dali.fn", "nvidia.dali.plugin.tf")),
    "iter_runner.py": (_ONE_BLAS_THREAD, ("numpy", "torch", "nvidia.dali.fn",
                                          "nvidia.dali.plugin.pytorch")),
    "resume_runner.py": (_ONE_BLAS_THREAD, ("numpy", "nvidia.dali.fn")),
    # its pipelines and readers are seeded: nothing drawn from the generators
    # the siblings share (rng_runner.py, which tests those, starts afresh)
    "proof_runner.py": (_ONE_BLAS_THREAD, ("numpy", "nvidia.dali.fn",
                                           "nvidia.dali.experimental.dynamic")),
}

_lock = threading.Lock()
_zygotes: dict[str, tuple[subprocess.Popen, Path]] = {}


def run(script: str | Path, args: list[str], env: dict[str, str] | None = None,
        preload: tuple[dict[str, str], tuple[str, ...]] | None = None,
        environ: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python HELPERS/script args` with ``env`` added to ``environ`` (default
    this process's environment) and PYTHONPATH the repository: its status,
    stdout, stderr. ``preload``: the zygote's (environment, modules);
    default PRELOAD's for the script (none: a plain process)."""
    argv = [str(HELPERS / script), *args]
    full_env = child_env(env, base=environ)
    preload = preload or PRELOAD.get(Path(script).name)
    if preload is None or os.environ.get("DVC_DALI_TEST_NO_ZYGOTE") == "1":
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                              env=full_env)
    with _lock, tempfile.TemporaryDirectory(prefix="forked-") as tmp:
        zygote, log = _zygote(preload)
        request = {"argv": argv, "env": full_env, "cwd": os.getcwd(),
                   "stdout": f"{tmp}/stdout", "stderr": f"{tmp}/stderr"}
        zygote.stdin.write(json.dumps(request) + "\n")
        zygote.stdin.flush()
        started = _answer(zygote, log)  # the pid, or why it would not be fresh
        if "unfit" in started:
            raise AssertionError(f"the zygote for {script} would not fork a fresh process: "
                                 f"{started['unfit']}")
        returncode = _answer(zygote, log)["returncode"]
        out = Path(f"{tmp}/stdout").read_text(errors="replace")
        err = Path(f"{tmp}/stderr").read_text(errors="replace")
    return subprocess.CompletedProcess([sys.executable, *argv], returncode, out, err)


def _zygote(preload: tuple[dict[str, str], tuple[str, ...]]) -> tuple[subprocess.Popen, Path]:
    key = json.dumps(preload, sort_keys=True)
    if key not in _zygotes:
        env, modules = preload
        log = Path(tempfile.mkstemp(prefix="zygote-", suffix=".log")[1])
        with open(log, "w") as err:
            zygote = subprocess.Popen(
                [sys.executable, str(HELPERS / "zygote.py"), *modules], text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                env=child_env(env))
        _zygotes[key] = zygote, log
    return _zygotes[key]


def _answer(zygote: subprocess.Popen, log: Path) -> dict:
    line = zygote.stdout.readline()
    if not line:
        raise AssertionError(f"the zygote ended (status {zygote.wait()}): "
                             f"{log.read_text(errors='replace')[-3000:]}")
    return json.loads(line)


@atexit.register
def _end() -> None:
    for zygote, log in _zygotes.values():
        zygote.stdin.close()  # it exits at the end of its input
        zygote.wait()
        log.unlink(missing_ok=True)
