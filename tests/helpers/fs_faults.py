"""A stage's training script run with a file-size limit at one instant, for
tests/e2e/test_full_disk.py: the stage's command is

    python <HELPERS>/fs_faults.py train.py [args...]

Env FS_FAULT="<point>:<n>[:transient]": RLIMIT_FSIZE is set to 0 (SIGXFSZ
ignored, so every write that grows a file fails with EFBIG, as a full disk
fails it) right before the n-th call (1-based) of dvc-dali's function at
<point>; ``transient``: lifted again once that call ends (a disk freed
meanwhile). The points:

- ``commit``: the row's git objects (recording/commit.build_commit);
- ``lockfile``: the workspace dvc.lock (recording/lockfile.write_atomic);
- ``cache``: an output copied into the DVC cache (recording/dvc_door.cache_output);

The instants are reached through dvc-dali's own functions, wrapped here (no
DVC, DALI or git code is replaced). Without FS_FAULT: the script as it is.
"""

import os
import resource
import runpy
import signal
import sys

FAULT = os.environ.get("FS_FAULT", "")
LIMITS = resource.getrlimit(resource.RLIMIT_FSIZE)  # the soft one set, the hard one kept


def _wrap(module, name: str, n: int, transient: bool) -> None:
    orig = getattr(module, name)
    calls = [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] != n:
            return orig(*args, **kwargs)
        print(f"fs_faults: files limited to 0 bytes at {name} call {n}", flush=True)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, LIMITS[1]))
        try:
            return orig(*args, **kwargs)
        finally:
            if transient:
                resource.setrlimit(resource.RLIMIT_FSIZE, LIMITS)

    setattr(module, name, wrapped)


def _install(point: str, n: int, transient: bool) -> None:
    from dvc_dali.recording import commit, dvc_door, lockfile

    where = {"commit": (commit, "build_commit"), "lockfile": (lockfile, "write_atomic"),
             "cache": (dvc_door, "cache_output")}
    _wrap(*where[point], n, transient)


if FAULT:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
    _point, _n, *_rest = FAULT.split(":")
    _install(_point, int(_n), _rest == ["transient"])
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
