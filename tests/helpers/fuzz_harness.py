"""Helpers for the kill-fuzz and concurrency tests: real `dvc exp run` processes
started in their own session, found, signalled and waited for with psutil, and
the checks a recorded experiment row must pass (its data is in the cache, its
checkpoint is complete, its model is the model of that step)."""

from __future__ import annotations

import atexit
import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import psutil
import yaml

from tests.helpers import child_env
from tests.helpers.dvc_project import sigint_default

TRAIN_SCRIPT = "examples/train.py"


def dvc_env(extra: dict | None = None) -> dict:
    """The environment dvc_project.run uses: the stage's `python` is this
    interpreter and dvc_dali is importable."""
    env = child_env(extra, this_python=True)
    for var in ("DVC_ROOT", "DVC_EXP_BASELINE_REV", "DVC_EXP_NAME", "DVC_STAGE",
                "DVC_CHECKPOINT"):
        env.pop(var, None)
    return env


def git(project: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=project, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {proc.stderr}")
    return proc.stdout


def _alive(p: psutil.Process) -> bool:
    """Running, or still exiting: a SIGKILLed multi-threaded process (the
    trainer: DALI's threads) shows as a zombie as soon as its main thread is
    gone, but holds its files (the checkpoint lock) until its last thread is."""
    try:
        if not p.is_running():
            return False
        if p.status() != psutil.STATUS_ZOMBIE:
            return True
        return len(os.listdir(f"/proc/{p.pid}/task")) > 1
    except (psutil.Error, OSError):
        return False


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group ``pgid``: a `dvc exp run`
    started with start_new_session=True and everything it started, even after
    it died and they were re-parented."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and _alive(p):
                found.append(p)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return found


def is_train(p: psutil.Process) -> bool:
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return False
    return bool(cmd) and os.path.basename(cmd[0]).startswith("python") and TRAIN_SCRIPT in cmd


def trainer_below(pid: int) -> psutil.Process:
    """The one training process below `pid`: a `python examples/train.py`
    whose parent is not one too. A child the trainer forked carries its
    command line, and a child that ended may be a zombie until reaped; both
    are passed over."""
    found = [k for k in psutil.Process(pid).children(recursive=True) if is_train(k) and _alive(k)]
    pids = {k.pid for k in found}
    top = [k for k in found if k.ppid() not in pids]
    assert len(top) == 1, f"not one trainer below {pid}: {top}"
    return top[0]


class ExpRun:
    """One `dvc exp run ...` in a new session, output to a log file (not a
    pipe: an orphaned trainer or queue worker would keep a pipe open)."""

    def __init__(self, project: Path, args: list[str], log: Path, cmd=("dvc", "exp", "run"),
                 env: dict | None = None):
        self.project, self.log_path = project, log
        self.args = [*cmd, *args]
        self._log = open(log, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.args, cwd=project, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=dvc_env(env), start_new_session=True,
                                     preexec_fn=sigint_default)  # Ctrl-C cases signal it
        self.pgid = self.proc.pid
        self.ps = psutil.Process(self.proc.pid)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def poll(self):
        return self.proc.poll()

    def train(self) -> psutil.Process | None:
        """The training process (`python examples/train.py`), a descendant of
        `dvc exp run` ($SHELL -c execs it, but look at every level)."""
        try:
            kids = self.ps.children(recursive=True)
        except psutil.Error:
            kids = []
        for k in kids:
            if is_train(k) and _alive(k):
                return k
        return None

    def wait_train(self, timeout: float = 120) -> psutil.Process | None:
        """The training process once it exists; None if the run ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.train()
            if t is not None:
                return t
            if self.poll() is not None:
                return None
            time.sleep(0.01)
        raise AssertionError(f"{' '.join(self.args)}: no training process after {timeout} s")

    def wait(self, timeout: float = 300) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            self.proc.wait()
            raise AssertionError(f"{' '.join(self.args)} did not end in {timeout} s:\n"
                                 + self.output()[-3000:]) from None
        self._log.flush()
        return rc

    def kill_group(self, sig=signal.SIGKILL) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass

    def leftovers(self) -> list[psutil.Process]:
        return group_members(self.pgid)

    def wait_leftovers(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.leftovers():
                return True
            time.sleep(0.05)
        return False

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill_group()
            self.proc.wait()
        self._log.close()


def reset(project: Path) -> None:
    """`dvc-dali reset`: the next `dvc exp run` trains from step 0 (a finished
    run is otherwise resumed with nothing left to train)."""
    proc = subprocess.run([sys.executable, "-m", "dvc_dali.cli", "reset"], cwd=project,
                          capture_output=True, text=True, env=dvc_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr


def doctor_fix(project: Path, about: str) -> str | None:
    """Does what `dvc-dali doctor` says to fix ``about`` (its BAD line names
    it): `dvc exp apply <row>` or `git checkout HEAD -- <file>`, as a user
    would. Returns the command run; None where doctor names no fix."""
    import re
    import shlex

    proc = subprocess.run([sys.executable, "-m", "dvc_dali.cli", "doctor"], cwd=project,
                          capture_output=True, text=True, env=dvc_env())
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BAD") and about in ln),
                "")
    found = re.search(r"`(dvc exp apply [^`]+|git checkout HEAD -- [^`]+)`", line)
    if not found:
        return None
    subprocess.run(shlex.split(found.group(1)), cwd=project, capture_output=True, text=True,
                   env=dvc_env(), check=True)
    return found.group(1)


# ---------------------------------------------------------------------------
# checks on what was recorded
# ---------------------------------------------------------------------------

def cache_path(project: Path, md5: str) -> Path:
    return project / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]


def _uncached(dvc_yaml: dict) -> set[str]:
    """Paths declared `cache: false` (outs, metrics, plots) in a dvc.yaml."""
    found = set()
    for stage in (dvc_yaml.get("stages") or {}).values():
        for key in ("outs", "metrics", "plots"):
            for item in stage.get(key) or []:
                if isinstance(item, dict):
                    for path, opts in item.items():
                        if isinstance(opts, dict) and opts.get("cache") is False:
                            found.add(path)
    return found


_CAT_FILE: dict[str, subprocess.Popen] = {}


def show(project: Path, sha: str, path: str) -> str | None:
    """`git show <sha>:<path>` (None when absent), through one long-lived
    `git cat-file --batch` per repository: thousands of rows stay fast."""
    proc = _CAT_FILE.get(str(project))
    if proc is None or proc.poll() is not None:
        proc = subprocess.Popen(["git", "cat-file", "--batch"], cwd=project,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        _CAT_FILE[str(project)] = proc
        atexit.register(proc.kill)
    proc.stdin.write(f"{sha}:{path}\n".encode())
    proc.stdin.flush()
    header = proc.stdout.readline().decode().split()
    if len(header) != 3 or header[1] != "blob":
        return None
    data = proc.stdout.read(int(header[2]))
    proc.stdout.read(1)  # the newline after the contents
    return data.decode()


def dir_listing(project: Path, md5: str) -> list[dict]:
    return json.loads(cache_path(project, md5).read_text())


_COMPLETE_DIRS: set[tuple[str, str]] = set()


def check_row_data(project: Path, sha: str) -> dict[str, str]:
    """Every cached output in the dvc.lock of commit ``sha`` is in the cache
    (a `.dir` manifest and every file it lists). Returns {out path: md5}."""
    lock_text = show(project, sha, "dvc.lock")
    assert lock_text, f"{sha}: no dvc.lock in the commit"
    lock = yaml.safe_load(lock_text)
    uncached = _uncached(yaml.safe_load(show(project, sha, "dvc.yaml") or "{}") or {})
    found = {}
    for sname, stage in (lock.get("stages") or {}).items():
        for out in stage.get("outs") or []:
            path, md5 = out["path"], out.get("md5")
            found[path] = md5
            if path in uncached:
                continue
            assert md5, f"{sha}: stage {sname} out {path} has no md5 in dvc.lock"
            obj = cache_path(project, md5)
            assert obj.is_file(), f"{sha}: {path} ({md5}) is not in the cache ({obj})"
            if md5.endswith(".dir") and (str(project), md5) not in _COMPLETE_DIRS:
                for entry in dir_listing(project, md5):
                    f = cache_path(project, entry["md5"])
                    assert f.is_file(), (f"{sha}: {path}/{entry['relpath']} ({entry['md5']}) "
                                         f"is not in the cache ({f})")
                _COMPLETE_DIRS.add((str(project), md5))  # the cache only grows here
    return found


def _digest(data: bytes, length: int) -> str:
    """The manifest digest as dvc-dali writes it: md5 (32 hex digits; sha256,
    64, before the md5 switch)."""
    return (hashlib.md5 if length == 32 else hashlib.sha256)(data).hexdigest()


def cached_checkpoint_step(project: Path, md5: str) -> int:
    """Read a cached checkpoint directory (.dir md5) the way dvc-dali would:
    LATEST -> snapshot(s) -> manifest, every file's digest and size checked,
    nothing else in the directory. Returns the manifest's step."""
    entries = {e["relpath"]: e["md5"] for e in dir_listing(project, md5)}
    assert "LATEST" in entries, f"cached checkpoint {md5} has no LATEST: {sorted(entries)}"
    steps, names = set(), []
    for line in cache_path(project, entries["LATEST"]).read_text().splitlines():
        name, digest = line.split()
        names.append(name)
        key = f"{name}/manifest.json"
        assert key in entries, (f"cached checkpoint {md5}: LATEST names {name}, which it "
                                f"does not hold ({sorted(entries)[:8]}...)")
        raw = cache_path(project, entries[key]).read_bytes()
        assert _digest(raw, len(digest)) == digest, \
            f"cached checkpoint {md5}: {key} differs from the digest in LATEST"
        manifest = json.loads(raw)
        for rel, want in manifest["files"].items():
            if rel == "manifest.json":
                continue
            assert f"{name}/{rel}" in entries, f"cached checkpoint {md5}: no {name}/{rel}"
            data = cache_path(project, entries[f"{name}/{rel}"]).read_bytes()
            # recorded under dvc exp run: md5, DVC's own (handed to it, not re-read),
            # and the CRC-32 that reads check
            assert {"md5", "crc32"} <= set(want), f"cached checkpoint {md5}: {name}/{rel}: {want}"
            assert f"{zlib.crc32(data):08x}" == want["crc32"], \
                f"cached checkpoint {md5}: {name}/{rel} does not match its CRC-32"
            assert want["md5"] == entries[f"{name}/{rel}"], \
                f"cached checkpoint {md5}: DVC cached {name}/{rel} under another md5"
            assert (len(data) == want["size"] and hashlib.md5(data).hexdigest() == want["md5"]), \
                f"cached checkpoint {md5}: {name}/{rel} does not match its manifest"
        steps.add(manifest["step"])
    assert len(steps) == 1, f"cached checkpoint {md5}: LATEST names steps {sorted(steps)}"
    stray = [r for r in entries
             if r != "LATEST" and not any(r.startswith(n + "/") for n in names)]
    assert not stray, f"cached checkpoint {md5} holds stray files {stray}"
    return steps.pop()


def load_checkpoint(path: Path) -> int:
    """Load a checkpoint directory with dvc_dali.Checkpointer (every digest
    verified) and return its step. The params and total_steps given are the
    snapshot's own with room to train further, so a finished run loads too
    instead of being set aside for a new run."""
    import dvc_dali
    from dvc_dali.format import store

    snap = store.read_snapshot(Path(path))
    assert snap is not None, f"{path}: no checkpoint"
    ck = dvc_dali.Checkpointer(path, params=snap.manifest.get("run", {}).get("params"),
                               total_steps=10**9)
    assert ck.resumed and ck.step == snap.step, (ck.resumed, ck.step, snap.step)
    return ck.step


def stale_files(project: Path) -> list[str]:
    """Files of ours (and git locks) a killed run may leave behind."""
    git_dir = Path(git(project, "rev-parse", "--absolute-git-dir").strip())
    found = []
    found += glob.glob(str(project / ".dvc" / "tmp" / "DVC_CHECKPOINT"))
    # recording.commit: GIT_INDEX_FILE=<git dir>/dvc-dali-index-<pid>-<uuid>
    found += glob.glob(str(git_dir / "dvc-dali-index-*"))
    found += glob.glob(str(project / "checkpoint" / ".tmp-*"))
    found += glob.glob(str(project / "dvc.lock.dvc-dali-*.tmp"))
    found += glob.glob(str(git_dir / "index.lock"))
    found += glob.glob(str(git_dir / "refs" / "exps" / "**" / "*.lock"), recursive=True)
    return sorted(found)


def model_digest(project: Path) -> str | None:
    path = project / "model" / "model.npz"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def wait_for_phase(project: Path, alive, where: str, nth: int, timeout: float,
                   prefix: str = ".tmp-step", interval: float = 0.0005) -> bool:
    """Until the nth checkpoint recording (`.dvc/tmp/DVC_CHECKPOINT` appears,
    where="record") or snapshot write (an entry starting with prefix in
    checkpoint/) seen from here is under way. False when alive() turned
    False or timeout seconds passed first."""
    sig = project / ".dvc" / "tmp" / "DVC_CHECKPOINT"
    ckpt = project / "checkpoint"
    seen, was = 0, False
    deadline = time.monotonic() + timeout
    while alive() and time.monotonic() < deadline:
        if where == "record":
            now = sig.exists()
        else:
            try:
                now = any(n.startswith(prefix) for n in os.listdir(ckpt))
            except FileNotFoundError:
                now = False
        if now and not was:
            seen += 1
            if seen >= nth:
                return True
        was = now
        time.sleep(interval)
    return False
