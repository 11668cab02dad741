"""Ranks started without a launcher: each a plain process with the
environment torchrun gives it (RANK, WORLD_SIZE, MASTER_ADDR, ...).

For tests that expect every rank to fail and say why: torchrun stops the
other ranks as soon as one fails, so a slower rank may be killed before it
says anything. Here no rank is stopped for another's failure."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests.helpers import child_env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(cmd: list[str], cwd: Path, n: int = 2, env: dict | None = None,
              timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """``cmd`` as ranks 0..n-1 of one world on this machine: each rank's
    status, stdout and stderr."""
    port = str(free_port())
    procs = []
    for rank in range(n):
        world = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
                 "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      env=child_env({**(env or {}), **world},
                                                    this_python=True)))
    done = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done
