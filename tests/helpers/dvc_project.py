"""Real git + DVC projects in temporary directories, for end-to-end tests:
make_project builds every one of them; run, git and the queue around them."""

from __future__ import annotations

import hashlib
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tests.helpers import REPO, child_env


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
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                          env=child_env(env, this_python=True),
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


# What a `dvc exp run` killed between stashing the workspace and taking its
# entry back leaves: an entry on DVC's workspace stash queue (refs/exps/stash),
# which the next `dvc exp run` runs after its own. Made by DVC's own call.
_LEAVE_ENTRY = """\
import sys
from dvc.repo import Repo

Repo(".").experiments.workspace_queue.put(
    params={"params.yaml": sys.argv[2:]}, name=sys.argv[1])
"""


def leave_stashed_entry(project: Path, name: str, *params: str) -> None:
    """An experiment ``name`` (``params``: DVC's -S values) left on the
    workspace queue, as a `dvc exp run` killed right after its stash leaves it."""
    run([sys.executable, "-c", _LEAVE_ENTRY, name, *params], project)


def example_on_two_ranks(path: Path, script: str, message: str,
                         files: dict[str, str | bytes | Path] | None = None) -> Path:
    """The example project whose train stage runs ``script`` on 2 processes
    under torchrun (gloo on the CPU), committed with ``message``."""
    project = make_project(path, example=True, files=files, prepared=True)
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


def make_project(path: Path, *, example: bool = False, prepared: bool = False,
                 template: bool = False, files: dict[str, str | bytes | Path] | None = None,
                 dvc_init: bool = True, branch: str = "main", env: dict | None = None,
                 message: str | None = "init") -> Path:
    """A git + DVC project at ``path`` (made if absent), for end-to-end tests.

    In this order: ``example``: this repository's DVC project copied in, as a
    clone has it (it brings its own .dvc/: no `dvc init`); ``prepared`` (with
    ``example``): its DVC cache as after one run of the `prepare` stage (see
    _prepared_cache); a git repository on ``branch``; `dvc init` by this
    interpreter's DVC (unless ``dvc_init`` is false, or the example brought
    one); ``template``: what `dvc-dali init` writes; ``files``: {relative
    path: text, bytes, or a file to copy}; then everything committed with
    ``message`` (None: nothing committed, for callers that add more first).
    ``env``: extra variables for each command.

    The steps before ``files`` are made once per test run for each
    combination and copied (_base): `dvc init` and `dvc-dali init` each cost
    a Python start with DVC's imports, and git init three more commands.
    """
    if prepared and not example:
        raise ValueError("prepared: the example's data; pass example=True")
    if env is None and not (path / ".git").exists():
        base = _base(example, template, dvc_init, branch)
        # .dvc/tmp is DVC's own per-repository scratch (btime names the repo): made anew
        shutil.copytree(base, path, symlinks=True, dirs_exist_ok=True,
                        ignore=lambda d, names: ["tmp"] if Path(d) == base / ".dvc" else [])
    else:  # extra variables may change what the commands write; a clone keeps its .git
        _build_base(path, example, template, dvc_init, branch, env)
    if prepared:  # copied, not linked: a test may damage its cache or its data/digits
        shutil.copytree(_prepared_cache(), path / ".dvc" / "cache", dirs_exist_ok=True)
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


# Where the bases and the prepared cache are made: tests/conftest.py points it
# at a directory of the pytest run's own, which its xdist workers share (pytest
# deletes it with that run's other temporary directories, as it deletes all
# but the last three runs'); None: a directory of this process's own.
TEMPLATES: Callable[[], Path] | None = None
_MADE: dict[str, Path] = {}


def _once(name: str, build: Callable[[Path], None]) -> Path:
    """The directory ``name`` that build(path) makes, made by the first
    process of the run that asks for it while the others wait (a lock), and
    published whole (a rename): a failed build leaves no half of it."""
    if name not in _MADE:
        import fcntl
        import tempfile

        global TEMPLATES
        if TEMPLATES is None:  # outside pytest: this process's own, removed at exit
            import atexit

            own = Path(tempfile.mkdtemp(prefix="dvc-dali-templates-"))
            atexit.register(shutil.rmtree, own, True)
            TEMPLATES = lambda: own  # noqa: E731
        where = TEMPLATES()
        where.mkdir(parents=True, exist_ok=True)
        done = where / name
        with open(where / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                part = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=where))
                build(part / name)
                (part / name).rename(done)
                shutil.rmtree(part)
        _MADE[name] = done
    return _MADE[name]


def _base(example: bool, template: bool, dvc_init: bool, branch: str) -> Path:
    """The project _build_base makes for these arguments, made once per
    test run (_once); each test gets a copy, never sharing a file with
    another."""
    name = "base-" + hashlib.sha1(repr((example, template, dvc_init, branch)).encode()
                                  ).hexdigest()[:12]
    return _once(name, lambda p: _build_base(p, example, template, dvc_init, branch, None))


def _prepared_cache() -> Path:
    """The example's DVC cache after a real `dvc repro prepare` by this
    interpreter's DVC, made once per test run (_once): data/digits's files
    and DVC's run-cache entry for the stage. A project given a copy of it
    (make_project's ``prepared``) and no other change has no data/digits
    and no dvc.lock in its workspace or commits; its first `dvc exp run`
    finds the run-cache entry ("Stage 'prepare' is cached - skipping run,
    checking out outputs"), checks data/digits out of the cache and writes
    the dvc.lock a run of examples/prepare.py writes: about 3 s and 1.7
    CPU-seconds less per project on 2 cores. A changed prepare.py, `prepare`
    param or cache directory misses it: the stage runs, as without it."""
    def build(cache: Path) -> None:
        scratch = cache.parent / "project"
        shutil.copytree(_base(True, False, True, "main"), scratch, symlinks=True)
        run([sys.executable, "-m", "dvc", "repro", "-q", "prepare"], scratch)
        (scratch / ".dvc" / "cache").rename(cache)
        shutil.rmtree(scratch)

    return _once("prepared-cache", build)


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
    every 10) in a fresh project, its data prepared in the DVC cache: its
    final model's sha and its output."""
    from tests.helpers.rows import exp_rows  # rows.py runs its commands with run() above

    project = make_project(dest, example=True, prepared=True)
    out = run(["dvc", "exp", "run", "-n", "ref", *extra], project)
    rows = exp_rows(project)
    assert {rows[f"ref-step{s}"]["step"] for s in range(10, 61, 10)} == set(range(10, 61, 10))
    return model_sha(project), out
