"""Benchmark 15: the cost of pushing one row (recording/auto_push.py's pusher:
its data to the DVC remote, then its ref to the git remote) to remotes that
already hold 10,000 experiment refs (git) and 10,000 checkpoints' files
(DVC), vs to empty ones, side by side, alternating row by row. The rows are
real ones from one `dvc exp run` of benchmark 8's stage; the busy remotes
are built cheaply: the refs with one `git update-ref --stdin` pointing at a
few commits, then packed (`git pack-refs --all`, as the remote's own
`gc --auto` leaves them), the DVC files written directly in the remote's
layout (files/md5/xx/...). The git remotes are served by `git daemon` on
localhost (git://), so that the server's work (git-receive-pack) is not
counted as the pushing machine's: it is reported apart, from the daemon's
reaped children (/proc/PID/stat)."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from b_push import project, trial
from common import DVC3, Row, fmt_s, median, run, say, yes_no

FILES_PER_CHECKPOINT = 4  # a listing and 3 files, as a small checkpoint has
SPACING_S = 0.5  # between rows, in the steady part (a row every ~50 steps of ~9 ms)


def busy_git(bare: Path, src: Path, refs: int) -> None:
    """``refs`` rows' refs under refs/exps, pointing at the project's commits."""
    run(["git", "push", "-q", bare, "main"], src)
    commits = run(["git", "rev-list", "-n", "4", "main"], src).stdout.split()
    lines = "".join(f"create refs/exps/ab/cdef{i % 50:04d}/busy{i // 1000}-step{i} "
                    f"{commits[i % len(commits)]}\n" for i in range(refs))
    subprocess.run(["git", "update-ref", "--stdin"], cwd=bare, input=lines, text=True,
                   check=True)


def busy_store(store: Path, checkpoints: int) -> None:
    """``checkpoints`` checkpoints' files (small ones) in DVC's remote layout."""
    for i in range(checkpoints * FILES_PER_CHECKPOINT):
        md5 = hashlib.md5(f"busy {i}".encode()).hexdigest()
        name = md5 + (".dir" if i % FILES_PER_CHECKPOINT == 0 else "")
        path = store / "files" / "md5" / name[:2] / name[2:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 64)


def daemon_cpu(pid: int) -> float:
    """CPU seconds of the processes the daemon has reaped (its git-receive-packs)."""
    time.sleep(0.05)  # the daemon reaps its children from its poll loop
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rows_of(path: Path) -> list[tuple[str, str, list[Any]]]:
    """(name, ref, sha) ... and the cached outputs, of every row in the project."""
    import yaml
    from dvc_data.hashfile.hash_info import HashInfo

    out = run(["git", "for-each-ref", "--sort=committerdate",
               "--format=%(objectname) %(refname)", "refs/exps"], path).stdout
    rows = []
    for sha, ref in (line.split() for line in out.splitlines()):
        if "-step" not in ref:
            continue
        lock = yaml.safe_load(run(["git", "show", f"{sha}:dvc.lock"], path).stdout)
        objs = [HashInfo("md5", o["md5"]) for e in lock["stages"].values()
                for o in e.get("outs", []) if o["path"] == "checkpoint"]
        rows.append((ref.rsplit("/", 1)[1], ref, sha, objs))
    return rows


def run_all(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    from dvc_dali.recording import auto_push as push

    refs, checkpoints = 10_000, 10_000
    alone, steady_n = (8, 40) if quick else (20, 80)
    src = project(tmp, "src", False)
    say(f"  15 rows to push: one dvc exp run of {(alone + steady_n + 1) * 10} steps")
    trial(src, (alone + steady_n + 1) * 10, 10, 0)
    rows = rows_of(src)
    t = time.perf_counter()
    remotes = {}
    port = free_port()
    for side in ("empty", "busy"):
        bare, store = tmp / f"{side}.git", tmp / f"{side}-store"
        run(["git", "init", "-q", "--bare", "-b", "main", bare], tmp)
        store.mkdir()
        if side == "busy":
            busy_git(bare, src, refs)
            run(["git", "pack-refs", "--all"], bare)
            busy_store(store, checkpoints)
        run(["git", "remote", "add", side, f"git://127.0.0.1:{port}/{side}.git"], src)
        remotes[side] = (bare, store)
    say(f"  15 busy remotes built in {time.perf_counter() - t:.1f} s")
    os.sync()
    exec_path = run(["git", "--exec-path"], tmp).stdout.strip()  # not git's wrapper: its
    daemon = subprocess.Popen([f"{exec_path}/git-daemon", "--reuseaddr",  # reaped children
                               "--export-all",
                               "--enable=receive-pack", f"--base-path={tmp}",
                               "--listen=127.0.0.1", f"--port={port}", str(tmp)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):  # until it listens
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    cost: dict[str, dict[str, list[float]]] = {
        s: {"cpu": [], "wall": [], "server_cpu": []} for s in remotes}
    steady: dict[str, dict[str, float]] = {}
    cwd = os.getcwd()
    os.chdir(src)  # DVC's remote paths are read from the project's config
    try:
        for side, (bare, store) in remotes.items():
            run([*DVC3, "remote", "add", "-f", side, store], src)
        pushers = {}
        for side in remotes:
            run([*DVC3, "remote", "default", side], src)
            pushers[side] = push.Pusher(str(src), side, "t0")
            name, ref, sha, objs = rows[0]
            pushers[side].push(name, ref, sha, objs)  # the first push opens the remote
            assert pushers[side].wait(120), side
        # each row pushed alone (waited for), to both, alternating which goes first
        for i, (name, ref, sha, objs) in enumerate(rows[1:1 + alone]):
            for side in (("empty", "busy") if i % 2 else ("busy", "empty")):
                p = pushers[side]
                server, before, t = daemon_cpu(daemon.pid), dict(p.stats), time.perf_counter()
                p.push(name, ref, sha, objs)
                assert p.wait(120), (side, name)
                cost[side]["wall"].append(time.perf_counter() - t)
                cost[side]["cpu"].append(p.stats["cpu_s"] - before["cpu_s"])
                cost[side]["server_cpu"].append(daemon_cpu(daemon.pid) - server)
        # as in training: a row every SPACING_S to both, pushed as the pusher spaces them
        say(f"  15 {steady_n} rows, one every {SPACING_S} s, to both")
        before = {side: dict(p.stats) for side, p in pushers.items()}
        for name, ref, sha, objs in rows[1 + alone:1 + alone + steady_n]:
            for p in pushers.values():
                p.push(name, ref, sha, objs)
            time.sleep(SPACING_S)
        for side, p in pushers.items():
            assert p.wait(120), side
            steady[side] = {k: p.stats[k] - before[side][k] for k in ("rows", "pushes", "cpu_s")}
        for p in pushers.values():
            p.close()
    finally:
        os.chdir(cwd)
        daemon.terminate()
        daemon.wait()
    on = {s: len(run(["git", "for-each-ref", "refs/exps"], b).stdout.splitlines())
          for s, (b, _) in remotes.items()}
    med = {s: {k: median(v) for k, v in c.items()} for s, c in cost.items()}
    cpu_x = med["busy"]["cpu"] / med["empty"]["cpu"]
    wall_x = med["busy"]["wall"] / med["empty"]["wall"]
    server_x = med["busy"]["server_cpu"] / max(med["empty"]["server_cpu"], 1e-9)
    per_row = {s: v["cpu_s"] / v["rows"] for s, v in steady.items()}
    steady_x = per_row["busy"] / per_row["empty"]
    out = [Row(f"15 CPU per pushed row, a row every {SPACING_S} s (the pusher's spacing): "
               f"remotes holding {refs:,} refs and {checkpoints:,} checkpoints' files vs empty "
               "ones (git://, DVC remote a directory)", fmt_s(per_row["busy"]),
               fmt_s(per_row["empty"]), f"{steady_x:.2f}x", "<= 1.2x",
               yes_no(steady_x <= 1.2)),
           Row("15 same, each row pushed alone (waited for): CPU on the pushing machine "
               "(pusher thread + git push)", fmt_s(med["busy"]["cpu"]),
               fmt_s(med["empty"]["cpu"]), f"{cpu_x:.2f}x", "<= 1.2x", yes_no(cpu_x <= 1.2)),
           Row("15 same, wall time a row (handed to the pusher to its ref on the git remote, "
               "pushed alone)", fmt_s(med["busy"]["wall"]), fmt_s(med["empty"]["wall"]),
               f"{wall_x:.2f}x", "<= 1.2x", yes_no(wall_x <= 1.2)),
           Row("15 same, the git server's CPU a row (git-receive-pack)",
               fmt_s(med["busy"]["server_cpu"]), fmt_s(med["empty"]["server_cpu"]),
               f"{server_x:.2f}x", "-", "n/a")]
    notes = [f"15 {alone} rows each side pushed alone, alternating; refs on the git "
             f"remotes after: {on}; cpu ms busy "
             f"{[round(x * 1e3, 1) for x in cost['busy']['cpu']]}, empty "
             f"{[round(x * 1e3, 1) for x in cost['empty']['cpu']]}; steady (rows, git pushes, "
             f"CPU s): {steady}"]
    return out, notes, {"cost": cost, "refs_after": on, "steady": steady}
