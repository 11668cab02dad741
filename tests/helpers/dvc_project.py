"""Real git + DVC projects in temporary directories, for end-to-end tests:
make_project builds every one of them; run, git and the queue around them."""

from __future__ import annotations

import hashlib
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


def git_init(path: Path, branch: str = "main", env: dict | None = None) -> None:
    """A git repository at ``path`` (again, for a clone: its identity only),
    with the identity the rows are committed under and no commit signing."""
    run(["git", "init", "-q", "-b", branch], path, env=env)
    run(["git", "config", "user.email", "test@example.invalid"], path, env=env)
    run(["git", "config", "user.name", "dvc-dali tests"], path, env=env)
    run(["git", "config", "commit.gpgsign", "false"], path, env=env)


def commit_all(path: Path, message: str = "init", env: dict | None = None) -> None:
    run(["git", "add", "-A"], path, env=env)
    run(["git", "commit", "-q", "-m", message], path, env=env)


def example_on_two_ranks(path: Path, script: str, message: str,
                         files: dict[str, str | bytes | Path] | None = None) -> Path:
    """The example project whose train stage runs ``script`` on 2 processes
    under torchrun (gloo on the CPU), committed with ``message``."""
    project = make_project(path, example=True, files=files)
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace(
        "cmd: python examples/train.py",
        f"cmd: {sys.executable} -m torch.distributed.run --standalone --nproc_per_node 2 "
        f"{script}"))
    commit_all(project, message)
    return project


# What a clone of this repository holds of its own DVC project (the example).
EXAMPLE_DIRS = (".dvc/", "examples/", "templates/")
EXAMPLE_FILES = ("dvc.yaml", "params.yaml", ".dvcignore", ".gitignore")


def _copy_example(dest: Path) -> None:
    """This repository's DVC project (example, dvc.yaml, params, .dvc/): the
    files a clone would have, including uncommitted edits."""
    listed = run(["git", "ls-files", "-co", "--exclude-standard"], REPO).stdout.split()
    for rel in listed:
        if rel.startswith(EXAMPLE_DIRS) or rel in EXAMPLE_FILES:
            if (REPO / rel).is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, dest / rel)


def make_project(path: Path, *, example: bool = False, template: bool = False,
                 files: dict[str, str | bytes | Path] | None = None, dvc_init: bool = True,
                 branch: str = "main", env: dict | None = None,
                 message: str | None = "init") -> Path:
    """A git + DVC project at ``path`` (made if absent), for end-to-end tests.

    In this order: ``example``: this repository's DVC project copied in, as a
    clone has it (it brings its own .dvc/: no `dvc init`); a git repository
    on ``branch``; `dvc init` by this interpreter's DVC (unless ``dvc_init``
    is false, or the example brought one); ``template``: what `dvc-dali init`
    writes; ``files``: {relative path: text, bytes, or a file to copy}; then
    everything committed with ``message`` (None: nothing committed, for
    callers that add more first). ``env``: extra variables for each command.

    The steps before ``files`` are made once per test process for each
    combination and copied (_base): `dvc init` and `dvc-dali init` each cost
    a Python start with DVC's imports, and git init three more commands.
    """
    if env is None and not (path / ".git").exists():
        base = _base(example, template, dvc_init, branch)
        # .dvc/tmp is DVC's own per-repository scratch (btime names the repo): made anew
        shutil.copytree(base, path, symlinks=True, dirs_exist_ok=True,
                        ignore=lambda d, names: ["tmp"] if Path(d) == base / ".dvc" else [])
    else:  # extra variables may change what the commands write; a clone keeps its .git
        _build_base(path, example, template, dvc_init, branch, env)
    for rel, content in (files or {}).items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copy2(content, target)
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    if message is not None:
        commit_all(path, message, env)
    return path


def _build_base(path: Path, example: bool, template: bool, dvc_init: bool, branch: str,
                env: dict | None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if example:
        _copy_example(path)
    git_init(path, branch, env)
    if dvc_init and not example:
        run([sys.executable, "-m", "dvc", "init", "-q"], path, env=env)
    if template:
        run([sys.executable, "-m", "dvc_dali.cli", "init"], path, env=env)


_BASES: dict[tuple, Path] = {}


def _base(*key) -> Path:
    """The project _build_base makes for ``key``, built on first use in a
    directory of this process's own (removed at exit): pytest-xdist workers
    each have theirs, and a test's copy never shares a file with another."""
    if key not in _BASES:
        import atexit
        import tempfile

        where = Path(tempfile.mkdtemp(prefix="dvc-dali-base-"))
        atexit.register(shutil.rmtree, where, True)
        _build_base(where / "p", *key, env=None)
        _BASES[key] = where / "p"
    return _BASES[key]


def template_project(tmp_path: Path, classes: int = 3, steps: int = 20) -> Path:
    """`dvc-dali init` with generated images, committed, as a new user does."""
    import numpy as np
    from PIL import Image

    project = make_project(tmp_path / "tpl", template=True, message=None)
    rng = np.random.default_rng(0)
    for c in range(classes):
        (project / "data/images" / f"c{c}").mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (20, 20), dtype=np.uint8)).save(
                project / "data/images" / f"c{c}" / f"{i}.png")
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("steps: 100", f"steps: {steps}"))
    commit_all(project, "start")
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


def uninterrupted_run(dest: Path, extra: tuple[str, ...] = ()
                      ) -> tuple[str, subprocess.CompletedProcess]:
    """One uninterrupted `dvc exp run -n ref` of the example (60 steps, a row
    every 10) in a fresh project: its final model's sha and its output."""
    from tests.helpers.rows import exp_rows  # rows.py runs its commands with run() above

    project = make_project(dest, example=True)
    out = run(["dvc", "exp", "run", "-n", "ref", *extra], project)
    rows = exp_rows(project)
    assert {rows[f"ref-step{s}"]["step"] for s in range(10, 61, 10)} == set(range(10, 61, 10))
    return model_sha(project), out
