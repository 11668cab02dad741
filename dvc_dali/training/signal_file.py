"""The DVC 2 `make_checkpoint()` protocol, and who answers it.

The signal is the empty file `.dvc/tmp/DVC_CHECKPOINT`, created and fsynced;
the caller waits until it is removed. Three answerers:

- DVC 2's own watcher (it sets DVC_CHECKPOINT=1 for checkpoint stages);
- the `dvc-dali run -- CMD` wrapper (it sets DVC_CHECKPOINT=1 too);
- on DVC 3 with a plain `cmd: python train.py`, nobody watches, so this
  process records the checkpoint itself (``recording/pipeline.py``) and removes the file.
Outside `dvc exp run` the checkpoint stays on disk and nothing is recorded.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from . import distributed
from ..core import ancestry, exit_hooks
from ..core.context import SIGNAL_NAME, RunContext, repo_root
from ..core.checked_calls import checked_call
from ..core.errors import ConfigError, SignalError
from ..core.log import logger
from ..core.process_state import STATE
from ..core.record_request import RecordRequest, Retention

def signal_path(ctx: RunContext) -> Path:
    """Where the signal file goes: `dvc-dali run`'s choice, else DVC_ROOT
    (DVC 2), else this run's own repo (for `--temp` runs not DVC_ROOT)."""
    if ctx.signal_file:
        return Path(ctx.signal_file)
    root = ctx.dvc_root if ctx.mode == "watched" else None
    root_path = Path(root) if root else repo_root()
    if root_path is None or not (root_path / ".dvc").is_dir():
        raise SignalError(
            f"DVC_ROOT={root!r} is not a DVC repository (no .dvc directory) and none was "
            f"found above {Path.cwd()}: run the training under `dvc exp run` in the repository, "
            f"or unset DVC_ROOT/{SIGNAL_NAME} to train without recording")
    return in_repo(root_path)


def in_repo(root: Path) -> Path:
    """The signal file of the DVC repository at ``root``."""
    return root / ".dvc" / "tmp" / SIGNAL_NAME


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


def wait_removed(path: Path, timeout: float, parent: ancestry.Starter) -> None:
    """Block until the watcher removes the signal, as DVC 2 did; refused at
    once when ``parent`` (the watcher, taken before the signal was written:
    `dvc-dali run`'s command, DVC 2's, a shell between them looked through)
    ends meanwhile, so the run waited an hour as an orphan, holding `dvc exp
    run`'s output pipe open (found by a sweep)."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while path.exists():
        if ancestry.gone(parent):
            raise SignalError(f"{path}: the process that records checkpoints (pid {parent.pid}, "
                              "DVC 2's `dvc exp run` or `dvc-dali run`) ended while this "
                              "checkpoint waited for it, so nothing recorded it. The checkpoint "
                              "itself is saved on disk: `dvc exp run` resumes from the last "
                              "recorded row.")
        if time.monotonic() > deadline:
            raise SignalError(f"{path}: not removed within {timeout:.0f} s "
                              "(DVC_DALI_SIGNAL_TIMEOUT), so nothing recorded this checkpoint. "
                              "Is `dvc exp run` (DVC 2) or `dvc-dali run` still alive? The "
                              "checkpoint itself is saved on disk.")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def signal_and_wait(path: Path, timeout: float) -> None:
    """DVC 2's protocol: the signal, then the wait for the watcher to remove
    it. The watcher is taken once per process, before its first signal:
    taken later, a watcher that had ended meanwhile (between two
    checkpoints, or before the wait began on a loaded machine) was this
    process's new parent, and the wait went on (CI found it)."""
    if STATE.signal_watcher is None:  # DVC 2 runs the command through $SHELL -c
        STATE.signal_watcher = ancestry.starter()
        if not ancestry.recorder_above():
            # DVC_CHECKPOINT left set in a shell: the wait was silent for an
            # hour (found by a sweep)
            logger.warning(
                "%s is set, so make_checkpoint() signals DVC 2's `dvc exp run` (or `dvc-dali "
                "run`) through %s and waits for it to record the checkpoint, but no such "
                "process runs above this one: it would wait up to %.0f s "
                "(DVC_DALI_SIGNAL_TIMEOUT) for nothing. If this is not such a run, stop it "
                "and unset %s.", SIGNAL_NAME, path, timeout, SIGNAL_NAME)
    write_signal(path)
    wait_removed(path, timeout, STATE.signal_watcher)


def remove_stale(path: Path) -> None:
    if path.exists():
        logger.warning("removing %s, a stale checkpoint signal left by an earlier run that "
                       "was killed", path)
        path.unlink(missing_ok=True)


def _say_not_recording(ctx: RunContext) -> None:
    if not STATE.said_not_recording:
        why = ("this `dvc exp run` did not set DVC_STAGE (DVC 2 without `checkpoint: "
               "true` on the output, or DVC < 3.49)" if ctx.baseline_rev
               else "not running under `dvc exp run`")
        logger.info("%s; checkpoints are saved on disk but not recorded as experiments", why)
        STATE.said_not_recording = True


@checked_call
def make_checkpoint(step: int | None = None, *, out: str | None = None,
                    keep_last: int | None = None, keep_best: str | None = None) -> None:
    """Signal DVC that the checkpoint output is complete, and wait until it is recorded.

    A drop-in for DVC 2's ``dvc.api.make_checkpoint()``: creates
    ``.dvc/tmp/DVC_CHECKPOINT`` and waits until the checkpoint is recorded
    as a row (under DVC 3 by dvc-dali itself; under DVC 2 or `dvc-dali run`
    by whoever answers the signal file). Outside `dvc exp run` it returns at
    once and says once that nothing is recorded. A `Checkpointer`'s own
    `Checkpointer.make_checkpoint` saves first, then calls this.

    Args:
        step: names the row, ``<run>-step<step>`` (default: one more than
            the previous).
        out: the checkpoint output, to find the stage where DVC does not
            name it (DVC < 3.49).
        keep_last: keep only the run's last N rows after recording (default:
            env ``DVC_DALI_KEEP_LAST``; unset keeps every row).
        keep_best: with ``keep_last``, also keep the best row by a DVCLive
            metric such as ``"train/acc:max"`` (default: env
            ``DVC_DALI_KEEP_BEST``).

    Raises:
        ConfigError: a bad ``keep_last``/``keep_best`` or ``DVC_DALI_*``
            value, refused before anything is written.
        ConfigError: ``step`` is not an int from 0, or ``out`` is not a path.
        RecordError: the checkpoint could not be recorded; its files are
            intact.
        SignalError: the signal file could not be written, or DVC 2 or
            `dvc-dali run` did not answer within ``DVC_DALI_SIGNAL_TIMEOUT``.
        UnchangedCheckpointError: an applied row whose run already went on
            from it, rerun with nothing changed.
    """
    exit_hooks.install_hook()  # a bad DVC_DALI_* value: one line, not a traceback
    if step is not None:  # as Checkpointer.make_checkpoint refuses it, in every mode
        from ..format.store import check_step

        check_step(step)
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise ConfigError(f"out={out!r}: must be the checkpoint output's path, a str such as "
                          "'checkpoint'")
    ctx = RunContext.from_environ()
    keep = ctx.retention(keep_last, keep_best)  # refused before anything is written
    exit_hooks.refuse_deleted_run(step)
    signal_checkpoint(ctx, RecordRequest(step, out=out), keep)


def signal_checkpoint(ctx: RunContext, request: RecordRequest, keep: Retention) -> None:
    """make_checkpoint() with what a Checkpointer knows besides (``request``:
    the LATEST it just wrote, whether the run resumed or branched off; ``keep``
    checked already): signal, then wait until the row is recorded."""
    exit_hooks.install(ctx, sigterm=distributed.world()[1] == 1)
    if ctx.mode == "off":
        _say_not_recording(ctx)
        return
    path = signal_path(ctx)
    if ctx.mode == "watched":
        ctx.refuse_stray_signal()
        signal_and_wait(path, ctx.signal_timeout)
        return
    from ..recording import pipeline as recording

    # before the first row: a stage DVC 3 cannot resume is refused; resumed None:
    # a bare script (a Checkpointer started its run itself)
    if recording.start_before_first_row(ctx, request.out, bare=request.resumed is None):
        request = dataclasses.replace(request, branched=True)
    remove_stale(path)
    write_signal(path)
    try:
        recording.record_and_prune(ctx, request, keep)
    finally:
        path.unlink(missing_ok=True)
    exit_hooks.refuse_orphan()
