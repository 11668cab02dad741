"""The DVC 2 `make_checkpoint()` protocol, and who answers it.

The signal is the empty file `.dvc/tmp/DVC_CHECKPOINT`, created and fsynced;
the caller waits until it is removed. Three answerers:

- DVC 2's own watcher (it sets DVC_CHECKPOINT=1 for checkpoint stages);
- the `dvc-dali run -- CMD` wrapper (it sets DVC_CHECKPOINT=1 too);
- on DVC 3 with a plain `cmd: python train.py`, nobody watches, so this
  process records the checkpoint itself (dvc_recorder) and removes the file.
Outside `dvc exp run` the checkpoint stays on disk and nothing is recorded.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .errors import SignalError

SIGNAL_NAME = "DVC_CHECKPOINT"
# Set by `dvc-dali run` for its child: where to put the signal (each run its own).
SIGNAL_FILE_ENV = "DVC_DALI_SIGNAL_FILE"
WAIT_ENV = "DVC_DALI_SIGNAL_TIMEOUT"
_said_not_recording = False


def repo_root(start: Path | None = None) -> Path | None:
    """The nearest directory holding `.dvc/`: the run's own repo, which for
    `--temp` and queued runs is not DVC_ROOT."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / ".dvc").is_dir():
            return candidate
    return None


def mode() -> str:
    """'watched' (DVC 2 or our wrapper answers), 'self' (DVC 3: record
    in-process) or 'off' (not under `dvc exp run`)."""
    if os.environ.get(SIGNAL_NAME):
        return "watched"
    if os.environ.get("DVC_ROOT") and os.environ.get("DVC_EXP_BASELINE_REV"):
        # DVC 2 sets these for every stage too, but never DVC_STAGE (DVC >= 3.49
        # always does): recording a DVC 3 dvc.lock there would break DVC 2's run.
        return "self" if os.environ.get("DVC_STAGE") else "off"
    return "off"


def signal_path() -> Path:
    explicit = os.environ.get(SIGNAL_FILE_ENV)
    if explicit:
        return Path(explicit)
    root = os.environ.get("DVC_ROOT") if mode() == "watched" else None
    root_path = Path(root) if root else repo_root()
    if root_path is None or not (root_path / ".dvc").is_dir():
        raise SignalError(
            f"DVC_ROOT={root!r} is not a DVC repository (no .dvc directory) and none was "
            f"found above {Path.cwd()}: run the training under `dvc exp run` in the repository, "
            "or unset DVC_ROOT/DVC_CHECKPOINT to train without recording")
    return root_path / ".dvc" / "tmp" / SIGNAL_NAME


def write_signal(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SignalError(f"{path}: cannot create the checkpoint signal ({exc.strerror}); "
                          f"make {path.parent} writable by this user") from None


def wait_removed(path: Path, timeout: float | None = None) -> None:
    """Block until the watcher removes the signal, as DVC 2 did."""
    limit = float(os.environ.get(WAIT_ENV, "3600")) if timeout is None else timeout
    deadline = time.monotonic() + limit
    delay = 0.001
    while path.exists():
        if time.monotonic() > deadline:
            raise SignalError(f"{path}: not removed within {limit:.0f} s, so nothing recorded "
                              "this checkpoint. Is `dvc exp run` (DVC 2) or `dvc-dali run` "
                              "still alive? The checkpoint itself is saved on disk.")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def make_checkpoint(step: int | None = None, *, out: str | None = None,
                    keep_last: int | None = None, keep_best: str | None = None) -> None:
    """Signal DVC that the checkpoint output is complete, and wait until it is recorded.

    A drop-in for DVC 2's ``dvc.api.make_checkpoint()``. Returns at once
    outside ``dvc exp run`` (saying so once). ``step`` names the recorded
    row (default: one more than the previous); ``out`` is the checkpoint
    output, to find the stage when DVC does not say (DVC < 3.49).
    ``keep_last``/``keep_best`` (default: env DVC_DALI_KEEP_LAST and
    DVC_DALI_KEEP_BEST; unset keeps every row) prune older rows of this
    experiment after recording, sparing the best by a DVCLive metric such
    as "train/acc:max".
    """
    global _said_not_recording
    how = mode()
    if how == "off":
        if not _said_not_recording:
            why = ("this `dvc exp run` did not set DVC_STAGE (DVC 2 without `checkpoint: "
                   "true` on the output, or DVC < 3.49)" if os.environ.get("DVC_EXP_BASELINE_REV")
                   else "not running under `dvc exp run`")
            print(f"dvc-dali: {why}; checkpoints are saved on disk but not recorded as "
                  "experiments", file=sys.stderr)
            _said_not_recording = True
        return
    path = signal_path()
    if how == "watched":
        write_signal(path)
        wait_removed(path)
        return
    from . import dvc_recorder

    if path.exists():
        print(f"dvc-dali: removing {path}, a stale checkpoint signal left by an earlier run "
              "that was killed", file=sys.stderr)
        path.unlink()
    write_signal(path)
    try:
        result = dvc_recorder.record_checkpoint(step, out=out)
        dvc_recorder.apply_retention(result.exp_name, *retention(keep_last, keep_best))
    finally:
        path.unlink(missing_ok=True)


def retention(keep_last: int | None, keep_best: str | None) -> tuple[int | None, str | None]:
    """The retention settings, from the arguments or else the environment."""
    if keep_last is None and os.environ.get("DVC_DALI_KEEP_LAST"):
        try:
            keep_last = int(os.environ["DVC_DALI_KEEP_LAST"])
        except ValueError:
            raise SignalError(f"DVC_DALI_KEEP_LAST={os.environ['DVC_DALI_KEEP_LAST']!r} is not "
                              "a number; set it to how many checkpoint rows to keep") from None
    return keep_last, keep_best or os.environ.get("DVC_DALI_KEEP_BEST") or None
