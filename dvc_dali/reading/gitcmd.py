"""git as a subprocess: the one runner every module uses.

    proc = gitcmd.run(["rev-parse", "HEAD"], cwd)                # RecordError if git fails
    proc = gitcmd.run(args, cwd, check=False)                     # the caller reads returncode
    proc = gitcmd.run(args, cwd, check=False, unrunnable=DvcDaliError)  # no git at all: one line

Rows' commits are built in-process (recording/commit.py, pygit2); this is
for the rest: refs, plumbing, pushes. Callers reach it as ``gitcmd.run``
(an attribute looked up at call time), so the benchmarks can time every
git process in one place.
"""

from __future__ import annotations

import os
import subprocess
from typing import Optional

from ..core.errors import DvcDaliError, RecordError


def run(args: list[str], cwd: str, env: Optional[dict[str, str]] = None, check: bool = True,
        input: Optional[str | bytes] = None, *, text: bool = True,  # noqa: A002
        unrunnable: Optional[type[DvcDaliError]] = None) -> subprocess.CompletedProcess:
    """`git ARGS` in ``cwd``, its output captured. ``check``: a non-zero exit
    raises RecordError naming the command. ``unrunnable``: git missing or
    not executable raises this error (else the OSError itself). ``text``:
    str in and out, else bytes."""
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, env=env, input=input,  # noqa: S603
                              capture_output=True, text=text, check=False)
    except OSError as exc:
        if unrunnable is None:
            raise
        raise unrunnable(f"cannot run git in {cwd}: {exc}") from None
    if check and proc.returncode != 0:
        stderr = proc.stderr if text else proc.stderr.decode(errors="replace")
        raise RecordError(f"`git {' '.join(args)}` failed in '{cwd}' "
                          f"(exit {proc.returncode}): {stderr.strip()}")
    return proc


def reason(stderr: str, most: int = 160) -> str:
    """git's own reason, short and on one line: its first line that is no
    hint or warning (the first says why: ssh's, or git's "'x' does not appear
    to be a git repository"; "Could not read from remote repository" and
    "Please make sure..." follow), without git's "fatal: "/"error: ", cut at
    ``most`` characters. git's whole stderr was printed (found by a
    bad-input sweep)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = next((line for line in lines if not line.startswith(("hint:", "warning:"))),
                "no reason given")
    for prefix in ("fatal: ", "error: "):
        said = said.removeprefix(prefix)
    said = said.rstrip(".")
    return said if len(said) <= most else said[:most - 3] + "..."


def run_counting_cpu(args: list[str], cwd: str, env: Optional[dict[str, str]] = None
                     ) -> tuple[int, str, float]:
    """`git ARGS` with nothing on stdin or stdout: (exit status, stderr, CPU
    seconds of git and the processes it waited for, from wait4)."""
    proc = subprocess.Popen(["git", *args], cwd=cwd, env=env,  # noqa: S603
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:  # reaped elsewhere: no usage to count
        return proc.wait(), err, 0.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, err, usage.ru_utime + usage.ru_stime


def parse_batch(out: bytes, count: int) -> list[bytes | None]:
    """The ``count`` answers of `git cat-file --batch`: a blob's bytes, or None
    for an object that is missing, ambiguous or not a blob."""
    found: list[bytes | None] = []
    pos = 0
    for _ in range(count):
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        pos = end + 1
        if len(header) == 3 and header[2].isdigit():  # <oid> <type> <size>, then the bytes
            size = int(header[2])
            found.append(out[pos:pos + size] if header[1] == b"blob" else None)
            pos += size + 1
        else:  # "<name> missing" / "<name> ambiguous"
            found.append(None)
    return found


def read_blobs(root: str, specs: list[str]) -> list[bytes | None]:
    """Every "<sha>:<path>" in ``specs`` read by one git process (one
    `git show` per row took seconds for a thousand rows)."""
    # A name with a line break would be two questions to git, and every
    # answer after it another name's: such a name is answered None, unasked.
    asked = [s for s in specs if "\n" not in s]
    if not asked:
        return [None] * len(specs)
    proc = run(["cat-file", "--batch"], root, check=False, text=False,
               input="".join(f"{s}\n" for s in asked).encode("utf-8", "surrogateescape"),
               unrunnable=DvcDaliError)
    if proc.returncode != 0:
        raise DvcDaliError(f"`git cat-file --batch` failed in {root} (exit {proc.returncode}): "
                           f"{proc.stderr.decode(errors='replace').strip()}")
    answers = iter(parse_batch(proc.stdout, len(asked)))
    return [next(answers) if "\n" not in s else None for s in specs]
