"""How a run under `dvc exp run` ends when it is interrupted or refused:
one line a person can act on, not a traceback.

- A dvc-dali error (a refusal: another pipeline, a damaged checkpoint, a bad
  setting) prints its message, which names the file and the fix; the
  traceback only with DVC_DALI_DEBUG=1 (as DVC's -v). This part is installed
  by every entry point before it reads the environment (``install_hook``), in
  or out of `dvc exp run`, so a bad DVC_DALI_* value is one line too.
- Under `dvc exp run` only, Ctrl-C (KeyboardInterrupt) and SIGTERM print
  which step is kept, as which row, and that `dvc exp run` resumes from
  it. The exit status stays what the signal gives (130 for Ctrl-C, 143 for
  SIGTERM). So does an error of ours that ends a run `should_save` saw
  preempted (its checkpoint, or the one in flight, failed): one line that
  says the preemption, the error and the row kept, status 128 + the signal.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator, Optional

from .context import RunContext, debug_requested
from .errors import DvcDaliError, RecordError
from .log import logger
from . import ancestry, run
from .process_state import STATE


def last_kept() -> Optional[tuple[int, str]]:
    """(step, row) the run of this process recorded last (run.py), for the
    interruption line."""
    current = run.current()
    return current.kept if current is not None else None


def _elsewhere() -> bool:
    """This run trains in a repository of its own (``--temp``, the queue),
    not in the workspace a plain `dvc exp run` resumes."""
    current = run.current()
    if current is None or not current.dvc_root:
        return False
    from .context import repo_root

    try:
        return repo_root() != Path(current.dvc_root).resolve()
    except OSError:  # its directory is gone (a queued run's, after `dvc queue kill -f`)
        return True


def interruption_line(how: str, recorded: Optional[tuple[int, str]], pushed: str = "",
                      elsewhere: Optional[bool] = None) -> str:
    """What an interrupted run says of what it kept and how to resume it:
    `dvc exp run` in the workspace; a ``--temp`` or queued run's row
    (``elsewhere``; None: found out) through `dvc exp apply` first, as the
    workspace does not hold it (found by a sweep)."""
    elsewhere = _elsewhere() if elsewhere is None else elsewhere
    if recorded is None:
        return (f"{how}: no checkpoint was recorded by this run" + (
            "" if elsewhere else "; `dvc exp run` resumes from the last one in the "
            "workspace, if any"))
    step, row = recorded
    if not row:  # a rank other than 0: rank 0 recorded the row, and names it
        return (f"{how}: step {step} is kept (rank 0 recorded its row)" + (
            "" if elsewhere else "; `dvc exp run` resumes from it"))
    if elsewhere:
        return (f"{how}: step {step} is kept as row {row}{pushed}; `dvc exp apply "
                f"{shlex.quote(row)}` then `dvc exp run` resumes from it")
    return f"{how}: step {step} is kept as row {row}{pushed}; `dvc exp run` resumes from it"


def next_command(row: Optional[str], elsewhere: bool) -> str:
    """What resumes a run whose checkpoint failed, for the error's advice:
    in the workspace `dvc exp run` (dvc.lock names the last row); a
    ``--temp`` or queued run (``elsewhere``) from its last ``row`` only
    after `dvc exp apply`: "`dvc exp run` again" resumed the workspace's
    checkpoint, not this run's (found by a sweep)."""
    if not elsewhere:
        return "`dvc exp run` again: it resumes from the last recorded row"
    if row:
        return f"`dvc exp apply {shlex.quote(row)}` then `dvc exp run`: it resumes from that row"
    return "run it again as it was started: no row of it was recorded"


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held while the block runs (on the main thread;
    elsewhere none reaches it), delivered as they came once it ends. Around
    a row's recording from its dvc.lock write to its ref: a Ctrl-C in
    between left dvc.lock naming a checkpoint that no row holds, said the
    previous row was kept, and the next run resumed that checkpoint under a
    new run name (found by a sweep). The checkpoint in flight is finished
    whole (docs/design/guarantees.md); it takes milliseconds."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if handler is not None:  # None: set outside Python, left alone
            previous[sig] = signal.signal(sig, lambda n, _f: came.append(n))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(came):
            signal.raise_signal(sig)


def _settled() -> None:
    """The asynchronous checkpoint in flight finished (and recorded), so the
    interruption line names what is kept: it named the row before it, and
    the one in flight was recorded after the line (found by a sweep). Not
    on the thread that writes it (it would wait for itself)."""
    pool = STATE.background_pool
    if pool is not None and not threading.current_thread().name.startswith(_WRITER_THREAD):
        with contextlib.suppress(RuntimeError):  # shut down already: nothing in flight
            pool.submit(lambda: None).result()


#: the name of training/checkpointer.py's background writer thread (its prefix)
_WRITER_THREAD = "dvc-dali-checkpoint"


def _lost_saves() -> str:
    """After ``_settled``: the asynchronous checkpoints that failed in flight,
    as sentences for the stopping run's line, taken off the exit's list:
    that said them a second time, with advice for a program that forgot
    ``wait()``, and ended with status 1, not the signal's (found by a
    sweep). Their errors are said (a full disk names what to free), but
    not where the run's directory was deleted: that is their error."""
    lost = [entry for entry in STATE.unread_saves if entry[2].done()
            and not entry[2].cancelled() and entry[2].exception() is not None]
    deleted = bool(lost) and _run_deleted()
    said = ""
    for entry in lost:
        with contextlib.suppress(ValueError):  # joined meanwhile by a wait() on another thread
            STATE.unread_saves.remove(entry)
        step, error = entry[0], entry[2].exception()
        if getattr(error, _ROW_RECORDED, False):  # its row is the one kept: nothing lost
            continue
        why = ("was lost with the directory" if deleted else
               f"failed ({type(error).__name__}: {str(error).rstrip('.')})")
        said += f"; the checkpoint of step {step}, in flight then, {why}: no row holds it"
    return said


def _again(signum: int, _frame: Any) -> None:
    """A Ctrl-C or SIGTERM after the run began to stop: said once, not raised."""
    if signum != signal.SIGINT and os.getpid() != STATE.exit_lines_pid:
        as_if_not_handled(signum)  # a child forked since: not the run
        return
    if not STATE.said_stopping:
        STATE.said_stopping = True
        how = "Ctrl-C again" if signum == signal.SIGINT else signal.Signals(signum).name
        logger.warning("%s: ignored, the run is stopping (what is kept is said above)", how)


def stopping() -> None:
    """The run ends (a Ctrl-C, a SIGTERM, a preemption): one more Ctrl-C or
    SIGTERM (a person pressing it twice, a supervisor's SIGTERM) is not
    raised while the process exits. It was a traceback from wherever the
    exit was: this hook, DVCLive's repo closed at exit, DVC's objects'
    ``__del__``, an `atexit` hook, whose work it cut short; a SIGTERM also
    printed a second line (found by sweeps). `kill -9` still ends it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _again)
        if signal.getsignal(signal.SIGTERM) is on_sigterm:  # not the application's own
            signal.signal(signal.SIGTERM, _again)


def _hook(previous):
    def report(kind: type[BaseException], exc: BaseException,
               tb: Optional[TracebackType]) -> None:
        interrupted = STATE.exit_lines_installed and issubclass(kind, KeyboardInterrupt)
        ours = interrupted or issubclass(kind, DvcDaliError)
        if interrupted:
            stopping()
        # read now, not at install: the error may be the refusal of the environment
        orphaned = None if interrupted or debug_requested() else _orphan_line(kind, exc, ours)
        if orphaned:
            logger.error(orphaned)
            return
        if not ours or debug_requested():
            previous(kind, exc, tb)
        if interrupted:
            _settled()  # the stack is unwound: no lock the save needs is held
            logger.warning(interruption_line("interrupted (Ctrl-C)", last_kept()) + _lost_saves())
        elif ours:
            _say_ours(kind, exc)

    def excepthook(kind: type[BaseException], exc: BaseException,
                   tb: Optional[TracebackType]) -> None:
        try:
            report(kind, exc, tb)
        except KeyboardInterrupt:
            if not issubclass(kind, KeyboardInterrupt):
                raise
            report(kind, exc, tb)  # the second Ctrl-C came before stopping(): once more
    return excepthook


def _say_ours(kind: type[BaseException], exc: BaseException) -> None:
    """An error of ours that ends the program: its message. In a run that
    should_save saw preempted (the checkpoint of the preempted step failed,
    or the one in flight before it, raised by its wait()): the preemption's
    line with that error, the row kept and what resumes it, and the signal's
    exit status (SystemExit from an excepthook is the interpreter's exit,
    its atexit hooks run). It said the error alone, with status 1, and
    "`dvc exp run` again" where a `--temp` run needs `dvc exp apply`
    first (found by a sweep)."""
    signum = STATE.preemption_signal
    if signum is None or not STATE.exit_lines_installed or STATE.exit_lines_pid != os.getpid():
        logger.error("%s: %s", kind.__name__, exc)
        return
    stopping()
    _settled()  # the stack is unwound: no lock the save needs is held
    error = f"{kind.__name__}: {str(exc).rstrip('.')}"
    logger.error(interruption_line(
        f"preempted ({signal.Signals(signum).name}), but its checkpoint could not be made "
        f"({error})", last_kept()) + _lost_saves())
    raise SystemExit(128 + signum)


def install_hook() -> None:
    """Once per process: a dvc-dali error that ends the program prints one
    line (its message), not a traceback; DVC_DALI_DEBUG=1 prints both. Every
    entry point (Checkpointer, make_checkpoint; load, rows, best_row and
    current_row) calls it before it reads the environment or its arguments.
    Other exceptions go to the previous hook unchanged."""
    if not STATE.excepthook_installed:
        STATE.excepthook_installed = True
        sys.excepthook = _hook(sys.excepthook)


def as_if_not_handled(signum: int) -> None:
    """In a child forked after dvc-dali's handler was installed (a
    multiprocessing worker, which is not the run): the signal's default
    action, as without dvc-dali (``Pool.terminate`` ends each worker with
    SIGTERM and waits for it)."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def on_sigterm(signum: int, _frame) -> None:
    if os.getpid() != STATE.exit_lines_pid:
        as_if_not_handled(signum)
        return
    if STATE.preemption_signal is not None:
        # preemption.Flag's handler got this signal first and chained here (a
        # framework had wrapped this handler into its own before the flag
        # could replace it: Lightning's signal connector): the loop asks
        # should_save, so it is one more checkpoint, then the exit. Called
        # directly (that framework put it back), it exits as before.
        return
    # SystemExit unwinds the training loop, so a checkpoint in flight is
    # finished (asynchronous mode) or abandoned whole (its writes are atomic);
    # one in flight is joined at the interpreter's exit, before atexit's hooks:
    # the line waits for it there (here, the training thread may hold a lock
    # the save needs)
    stopping()
    if STATE.unread_saves:
        atexit.register(this_process_only(lambda: logger.warning(
            interruption_line("terminated (SIGTERM)", last_kept()) + _lost_saves())))
    else:
        logger.warning(interruption_line("terminated (SIGTERM)", last_kept()))
    raise SystemExit(128 + signum)


def install(ctx: RunContext, sigterm: bool = True) -> None:
    """The excepthook (``install_hook``) in every mode; once per process and
    under `dvc exp run` only, the Ctrl-C and SIGTERM lines: a handler the application
    installed for SIGTERM is left alone, and so is SIGTERM when ``sigterm``
    is false (torchrun's agent stops the other ranks with it)."""
    install_hook()
    # watched (DVC 2, `dvc-dali run`): the watcher records the rows and says
    # what is kept; this process knows none of them
    if STATE.exit_lines_installed or not ctx.under_exp_run or ctx.watched:
        return
    STATE.exit_lines_installed = True
    STATE.exit_lines_pid = os.getpid()
    STATE.exit_lines_parent = ancestry.starter(through_launchers=True)  # `dvc exp run`
    if (sigterm and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        signal.signal(signal.SIGTERM, on_sigterm)


def _gone_starter() -> Any:
    """The `dvc exp run` that started this run (ancestry.Starter), if it has
    ended while the run goes on; else None."""
    parent = STATE.exit_lines_parent
    if STATE.exit_lines_pid != os.getpid() or parent is None or not ancestry.gone(parent):
        return None
    return parent


def _failed_orphan(kind: type[BaseException], exc: BaseException) -> Optional[str]:
    """The line for an error that ends a run whose `dvc exp run` ended
    before it: the error is most likely that end's (`dvc queue kill -f`
    ends DVC's process, not the training, and deletes the queued run's
    directory under it, so DVCLive's next write failed with a traceback
    that named neither; found by a sweep). None while it lives."""
    parent = _gone_starter()
    if parent is None:
        return None
    error = f"{kind.__name__}: {exc}".splitlines()[0]
    _settled()  # the stack is unwound: no lock the save needs is held
    lost = _lost_saves()
    return interruption_line(f"`dvc exp run` (pid {parent.pid}) ended while this training "
                             f"went on, which then failed ({error})", last_kept()) + lost


def _orphan_line(kind: type[BaseException], exc: BaseException, ours: bool) -> Optional[str]:
    """The line for an error that ends an orphan, in place of the error's
    own: one not ours (``_failed_orphan``), or one of ours that the run's
    deleted directory caused, as ``refuse_deleted_run`` says it: a
    checkpoint in flight there that ``wait()`` raised said "a part of
    checkpoint was removed ... Save again" (found by a sweep). None
    otherwise, and for that refusal itself."""
    if not ours:
        return _failed_orphan(kind, exc)
    if getattr(exc, _SAID_DELETED, False) or not _run_deleted():
        return None
    return _deleted_run_line(None, f" (a {kind.__name__} there)")


def refuse_orphan() -> None:
    """After a row is recorded: where the `dvc exp run` that started this
    process has ended (a SIGTERM to it alone, from a supervisor that signals
    its direct child), the training stops here. It went on as an orphan: DVC's
    hold on the workspace went with that process, so a second `dvc exp run`
    started beside it and checked its outputs out under it (found by a sweep)."""
    parent = _gone_starter()
    if parent is None:
        return
    if STATE.preemption_signal is not None:  # its group got it too: this row is its last
        return
    error = RecordError(interruption_line(
        f"`dvc exp run` (pid {parent.pid}) ended while this training went on, so it stops",
        last_kept()))
    setattr(error, _ROW_RECORDED, True)
    raise error


#: set on refuse_orphan's error: its row was recorded, so it is no failed checkpoint
_ROW_RECORDED = "dvc_dali_row_recorded"


#: set on refuse_deleted_run's error: the excepthook says it as it is
_SAID_DELETED = "dvc_dali_deleted_run"


def refuse_deleted_run(step: Optional[int]) -> None:
    """At every should_save and make_checkpoint under `dvc exp run`: where
    the directory the run trains in (its working directory) was deleted, the
    training stops here. `dvc queue kill --force` ends DVC's process, not the
    training, and deletes the queued run's directory under it: the trainer
    went on (hours, with rare checkpoints) until its next DVCLive write or
    checkpoint failed there (found by a sweep). An orphan whose directory
    stands records its next row first (refuse_orphan)."""
    if _run_deleted():
        error = RecordError(_deleted_run_line(step))
        setattr(error, _SAID_DELETED, True)
        raise error


def _run_deleted() -> bool:
    """This process runs under `dvc exp run` and its working directory was
    deleted. One stat of "." (7 µs a call measured on a loaded machine: it
    runs every step); a deleted directory has no links left."""
    if STATE.exit_lines_pid != os.getpid():
        return False
    try:
        return os.stat(".").st_nlink == 0
    except FileNotFoundError:  # a system whose stat refuses a deleted directory
        return True
    except OSError:  # not known to be gone (a permission): what follows says it if so
        return False


def _deleted_run_line(step: Optional[int], cause: str = "") -> str:
    """What a run whose directory was deleted says as it stops (at ``step``;
    ``cause``: what failed there first), once the checkpoint in flight has
    ended: the row it recorded is named, or its failure said."""
    _settled()
    lost = _lost_saves()
    parent = _gone_starter()
    ended = f"`dvc exp run` (pid {parent.pid}) ended and " if parent else ""
    at = "" if step is None else f" at step {step}"
    return interruption_line(
        f"{ended}the directory this run trains in was deleted while the training went on "
        f"(`dvc queue kill --force` does both), so it stops{at}{cause}", last_kept()) + lost


def this_process_only(hook: Callable[..., Any], *args: Any) -> Callable[[], None]:
    """``hook(*args)`` as an exit hook that does nothing in a child forked
    later: it inherits the hooks, not the run (its threads, pushes, rank and
    params are its parent's, which is still running)."""
    pid = os.getpid()

    def at_exit() -> None:
        if os.getpid() == pid:
            hook(*args)

    return at_exit


def watch_unread_saves() -> None:
    """Once per process, at its first asynchronous Checkpointer (registered
    that early so that what the program registers later still runs first):
    at exit, an asynchronous save that failed and that no ``wait()`` or
    ``close()`` read is said, and the process ends with status 1. Otherwise
    a script that ends without waiting would exit 0 with its last checkpoint
    missing, and `dvc exp run` would record the run as if it held it."""
    if not STATE.unread_hook_installed:
        STATE.unread_hook_installed = True
        atexit.register(this_process_only(_say_unread_failures))


def _say_unread_failures() -> None:
    # the saves in flight were finished before this runs (concurrent.futures
    # joins its workers at interpreter shutdown, before atexit's functions)
    failed = [(step, path, future.exception()) for step, path, future in STATE.unread_saves
              if future.done() and not future.cancelled() and future.exception() is not None]
    if not failed:
        return
    for step, path, exc in failed:
        if getattr(exc, _ROW_RECORDED, False):
            # an orphan's refusal, after its row: said as when it is raised; it
            # was said to have failed, "not saved (nor recorded)" (found by a sweep)
            logger.error("%s: %s", type(exc).__name__, exc)
            continue
        logger.error("%s: the checkpoint of step %s failed in the background and was never "
                     "waited for: %s: %s. It is not saved (nor recorded): the last complete "
                     "checkpoint stands. Call wait() or close() before the program ends to get "
                     "this error where it can be handled; this process ends with status 1.",
                     path, step, type(exc).__name__, str(exc).rstrip("."))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(1)  # the exit status cannot be changed any other way once the program ended

