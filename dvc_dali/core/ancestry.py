"""The process that started this one, across the shell DVC runs a stage's
command in: `dvc exp run` runs it as ``$SHELL -c``, or ``/bin/sh -c`` where
SHELL is unset. bash and zsh exec a lone command; dash (Debian's /bin/sh)
does not, and stays the training's parent after `dvc exp run` ended."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

SHELLS = frozenset({"sh", "dash", "bash", "zsh", "ksh", "mksh", "ash", "busybox", "fish",
                    "csh", "tcsh"})


@dataclass(frozen=True)
class Starter:
    """A process by pid and start time (a pid reused later is another
    process); ``started`` is "" where /proc is not at hand."""

    pid: int
    started: str


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(name, parent pid, start time) from /proc; None once it ended, or
    without /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fobj:
            text = fobj.read().decode("utf-8", "replace")
    except OSError:
        return None
    # the name is in parentheses and may hold spaces or parentheses itself
    fields = text[text.rindex(")") + 2:].split()
    return text[text.index("(") + 1:text.rindex(")")], int(fields[1]), fields[19]


def started_at(pid: int) -> float | None:
    """When ``pid`` started, in wall-clock seconds, to the clock tick: its
    start in ticks since boot, against the boot clock now. psutil's
    create_time adds that start to /proc/stat's btime, whole seconds, so it
    reads up to a second early (a lock made just before this run started
    was taken as made after it). None without /proc."""
    stat = _stat(pid)
    if stat is None:
        return None
    since_start = (time.clock_gettime(time.CLOCK_BOOTTIME)
                   - int(stat[2]) / os.sysconf("SC_CLK_TCK"))
    return time.time() - since_start


def start_token(pid: int) -> str | None:
    """``pid``'s start, as text naming that one process (a pid the system
    gives again later reads another): its start in clock ticks since boot
    from /proc (exact), else psutil's create_time; None once it ended, or
    where neither tells."""
    stat = _stat(pid)
    if stat is not None:
        return f"ticks:{stat[2]}"
    try:
        import psutil
    except ImportError:
        return None
    try:
        return f"created:{psutil.Process(pid).create_time():.3f}"
    except psutil.Error:
        return None


def chain(start: int, depth: int = 64) -> list[tuple[int, str, str]]:
    """(pid, name, start time) of ``start`` and its ancestors, nearest first."""
    found, pid = [], start
    while pid > 1 and len(found) < depth:
        stat = _stat(pid)
        if stat is None:
            break
        found.append((pid, stat[0], stat[2]))
        pid = stat[1]
    return found


def starter_in(ancestors: list[tuple[int, str, str]]) -> tuple[int, str] | None:
    """The nearest ancestor that is no shell (pid, start time). Pure."""
    for pid, name, started in ancestors:
        if name not in SHELLS:
            return pid, started
    return None


_VALUED = frozenset({"-X", "-W", "--cd"})  # options whose value is the next argument


def _program(argv: list[str]) -> tuple[str, list[str]] | None:
    """The program a command line runs and its arguments: the executable
    itself, or under a Python interpreter its script or ``-m`` module (only
    those: another script's own arguments that hold `dvc exp` are not DVC).
    None for ``-c`` and an interpreter alone. Pure."""
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if not name.startswith("python"):
        return name, argv[1:]
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c"):
        i += 2 if argv[i] in _VALUED else 1
    if i >= len(argv) or argv[i] == "-c":
        return None
    if argv[i] == "-m":
        return (argv[i + 1], argv[i + 2:]) if i + 1 < len(argv) else None
    return os.path.basename(argv[i]), argv[i + 1:]


def _command(args: list[str]) -> str | None:
    """The first argument that is no option (DVC's own, `-v`, `--cd DIR`,
    may come before its command). Pure."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in _VALUED else 1
    return args[i] if i < len(args) else None


def is_dvc_exp(argv: list[str]) -> bool:
    """A command line of DVC's experiments (`dvc exp run`, and `dvc exp
    exec-run`, which trains a --temp or queued run), run as a script or as
    ``python -m dvc``. Pure."""
    found = _program(argv)
    return found is not None and found[0] in ("dvc", "dvc.__main__") \
        and _command(found[1]) == "exp"


_RECORDERS = frozenset({"dvc", "dvc.__main__", "dvc-dali", "dvc_dali", "dvc_dali.cli",
                        "dvc_dali.cli.main"})


def is_recorder(argv: list[str]) -> bool:
    """A command line of a process that answers the checkpoint signal: DVC
    (2: `dvc exp run`, `dvc repro`, a queue worker) or `dvc-dali run`, run
    as a script or with ``python -m``. Pure."""
    found = _program(argv)
    return found is not None and found[0] in _RECORDERS


def recorder_above() -> bool:
    """Whether an ancestor of this process is one (``is_recorder``); True
    where /proc cannot tell."""
    ancestors = chain(os.getppid())
    if not ancestors:
        return True
    return any(is_recorder(_argv(pid)) for pid, _, _ in ancestors)


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fobj:
            return [os.fsdecode(arg) for arg in fobj.read().split(b"\0")[:-1]]
    except OSError:
        return []


def starter(through_launchers: bool = False) -> Starter:
    """This process's starter: its parent, or where shells stand between,
    the first ancestor above them. ``through_launchers``: DVC's experiment
    process where one is an ancestor, whatever stands between (torchrun,
    `timeout`), so that its end is seen from a rank too."""
    parent = os.getppid()
    ancestors = chain(parent)
    if through_launchers:
        dvc = next(((pid, started) for pid, _, started in ancestors
                    if is_dvc_exp(_argv(pid))), None)
        if dvc is not None:
            return Starter(*dvc)
    found = starter_in(ancestors)
    return Starter(*found) if found else Starter(parent, "")


def gone(who: Starter) -> bool:
    """Whether ``who`` has ended (or is no longer this process's ancestor)."""
    if not who.started:
        return os.getppid() != who.pid
    return (who.pid, who.started) not in {(pid, started) for pid, _, started in
                                          chain(os.getppid())}
