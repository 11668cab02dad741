"""Real git + DVC projects in temporary directories, for end-to-end tests."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO


def sigint_default() -> None:
    """A preexec_fn: SIGINT back to its default action in the child.

    A job started in the background of a non-interactive shell (`pytest &` in
    a script) has SIGINT ignored, and every process it starts inherits that:
    Ctrl-C would then do nothing. Tests that send it start their processes so.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(cmd: list[str], cwd: Path, check: bool = True, env: dict | None = None,
        timeout: float = 600, preexec_fn=None) -> subprocess.CompletedProcess:
    # The stage's `python` must be this interpreter, with dvc_dali importable.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    full_env = {**os.environ, "PATH": path, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=full_env,
                          timeout=timeout, preexec_fn=preexec_fn)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def git_init(path: Path) -> None:
    run(["git", "init", "-q", "-b", "main"], path)
    run(["git", "config", "user.email", "test@example.invalid"], path)
    run(["git", "config", "user.name", "dvc-dali tests"], path)


def commit_all(path: Path, message: str = "init") -> None:
    run(["git", "add", "-A"], path)
    run(["git", "commit", "-q", "-m", message], path)


def clone_project(dest: Path) -> Path:
    """This repository's DVC project (example, dvc.yaml, params) as a fresh
    git repo: the files a clone would have, including uncommitted edits."""
    listed = run(["git", "ls-files", "-co", "--exclude-standard"], REPO).stdout.split()
    for rel in listed:
        if rel.startswith((".dvc/", "examples/", "templates/")) or rel in (
                "dvc.yaml", "params.yaml", ".dvcignore", ".gitignore"):
            if (REPO / rel).is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, dest / rel)
    git_init(dest)
    commit_all(dest)
    return dest


def template_project(tmp_path: Path, classes: int = 3, steps: int = 20) -> Path:
    """`dvc-dali init` with generated images, committed, as a new user does."""
    import sys

    import numpy as np
    from PIL import Image

    project = tmp_path / "tpl"
    project.mkdir()
    git_init(project)
    run(["dvc", "init", "-q"], project)
    run([sys.executable, "-m", "dvc_dali.cli", "init"], project)
    rng = np.random.default_rng(0)
    for c in range(classes):
        (project / "data/images" / f"c{c}").mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (20, 20), dtype=np.uint8)).save(
                project / "data/images" / f"c{c}" / f"{i}.png")
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("steps: 100", f"steps: {steps}"))
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "start"], project)
    return project


def queue_status(project: Path) -> dict[str, str] | None:
    """{name: status} from `dvc queue status`; None when it fails, as it
    sometimes does while workers run (DVC reads a JSON file of a running
    task while it is being written: "Expecting value: line 1 column 1"):
    asked again, as a user would."""
    proc = run(["dvc", "queue", "status"], project, check=False)
    if proc.returncode != 0:
        return None
    found = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^\s*\S+\s+(\S+)\s+.*?\b(Queued|Running|Success|Failed|Unknown)\b", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def wait_queue(project: Path, until, what: str, report, ask: bool = True) -> dict[str, str]:
    """Wait for until(status), status being `dvc queue status` as last asked
    (every 2 s: it takes a second; ask=False: not asked while waiting, for
    waits that must see what they wait for at once); stop at a failed run
    with report(status)."""
    deadline = time.monotonic() + 480  # a cap for a stuck queue, not a timing
    status: dict[str, str] = {}
    asked = 0.0
    while not until(status):
        now = time.monotonic()
        if (ask and now - asked >= 2) or now > deadline:
            polled, asked = queue_status(project), now
            status = status if polled is None else polled
            assert "Failed" not in status.values(), report(status)
            assert now < deadline, f"no {what}: {report(status)}"
        time.sleep(0.05)
    return status


def queue_report(project: Path, status: dict[str, str]) -> str:
    """Why queued runs did not end well: the status, each run's own log
    (`dvc queue logs`) and the workers' logs."""
    logs = "".join(f"--- {name} ({state}):\n"
                   + run(["dvc", "queue", "logs", name], project, check=False).stdout[-3000:]
                   for name, state in status.items())
    return f"{status}\n{logs}\n{queue_worker_logs(project)}"


def queue_worker_logs(project: Path, tail: int = 4000) -> str:
    """The end of each `dvc queue` worker's own log (celery's): where a queued
    run that failed before its stage started says why (`dvc queue logs` has
    only the stage's output)."""
    found = sorted((project / ".dvc" / "tmp" / "exps" / "celery").glob("dvc-exp-worker-*.out"))
    return "".join(f"--- {p.name}:\n" + "\n".join(
        ln for ln in p.read_text(errors="replace").splitlines() if "DEBUG/" not in ln)[-tail:]
        + "\n" for p in found) or "no queue worker logs"


def model_sha(path: Path) -> str:
    """The example's final model, as a digest to compare runs bit for bit."""
    return hashlib.sha256((path / "model" / "model.npz").read_bytes()).hexdigest()


def exp_rows(path: Path) -> dict[str, dict]:
    """{experiment name: {"rev", "metrics", "params", "step"}} from `dvc exp show --json`."""
    data = json.loads(run(["dvc", "exp", "show", "--json", "-A"], path).stdout)
    rows = {}

    def walk(node):
        for exp in node.get("experiments") or []:
            for rev in exp.get("revs") or []:
                data = (rev.get("data") or {})
                metrics = {}
                for f in (data.get("metrics") or {}).values():
                    metrics.update(f.get("data") or {})
                rows[rev.get("name") or exp.get("name")] = {
                    "rev": rev.get("rev"), "metrics": metrics, "step": metrics.get("step"),
                    "deps": data.get("deps"), "outs": data.get("outs")}
    for node in data:
        walk(node)
    return rows


def uninterrupted_run(dest: Path, extra: tuple[str, ...] = ()
                      ) -> tuple[str, subprocess.CompletedProcess]:
    """One uninterrupted `dvc exp run -n ref` of the example (60 steps, a row
    every 10) in a fresh project: its final model's sha and its output."""
    project = clone_project(dest)
    out = run(["dvc", "exp", "run", "-n", "ref", *extra], project)
    rows = exp_rows(project)
    assert {rows[f"ref-step{s}"]["step"] for s in range(10, 61, 10)} == set(range(10, 61, 10))
    return model_sha(project), out
