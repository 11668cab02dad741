"""dvc_dali.recording (pipeline.py) against real `dvc exp run` in temporary git repos.

No mocks: every test builds a git + DVC repo, runs a small training script
as the stage command, and reads back refs, dvc.lock, the DVC cache and
`dvc exp show --json`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dvc_dali.recording import pipeline as rec
from dvc_dali.core.context import RunContext
from dvc_dali.core.errors import RecordError

from tests.helpers import REPO
from tests.helpers.dvc_project import make_project, queue_report, wait_queue
from tests.helpers.rows import exp_rows
from dvc_dali.core import run as runs
from dvc_dali.core.process_state import reset

TRAIN_PY = textwrap.dedent(
    """\
    import json, os, signal, sys, time
    from dvc_dali.recording.pipeline import record
    from dvclive import Live
    from ruamel.yaml import YAML

    params = YAML(typ="safe").load(open("params.yaml"))
    start = 0
    if os.path.exists("ckpt/state.txt"):
        start = int(open("ckpt/state.txt").read().split()[0])
    os.makedirs("ckpt", exist_ok=True)
    log = open(os.environ["REC_LOG"], "a")
    with Live(resume=True, save_dvc_exp=False) as live:
        for step in range(start + 1, start + params["steps"] + 1):
            with open("ckpt/state.txt", "w") as f:
                f.write(f"{step} lr={params['lr']} " + "x" * step)
            with open("progress.txt", "w") as f:  # tracked, same size each step
                f.write(f"step {step % 10}")
            live.log_metric("loss", params["lr"] / step)
            live.log_metric("step_seen", step)
            live.next_step()
            time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
            gate_step, _, gate = os.environ.get("GATE_AT", "").partition(":")
            while gate_step == str(step) and not os.path.exists(gate):
                time.sleep(0.05)  # the test opens the gate
            r = record(step)
            log.write(json.dumps({
                "exp": os.environ["DVC_EXP_NAME"], "start": start, "step": step,
                "name": r.name, "ref": r.ref, "sha": r.sha, "parent": r.parent,
                "workspace": r.workspace, "ms": r.duration_s * 1000,
                "t": time.time(),
                "phases_ms": {k: v * 1000 for k, v in r.phases.items()},
            }) + "\\n")
            log.flush()
            if os.environ.get("KILL_AT") == str(step):
                os.kill(os.getpid(), signal.SIGKILL)
        while os.environ.get("END_AFTER") and not os.path.exists(os.environ["END_AFTER"]):
            time.sleep(0.05)  # the test says when training may end
    """
)

DVC_YAML = textwrap.dedent(
    """\
    stages:
      train:
        cmd: python train.py
        deps: [train.py]
        params: [lr, steps]
        outs:
          - ckpt:
              persist: true
        always_changed: true
    """
)


def _run(args, cwd, env, check=True, timeout=300):
    proc = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def dvc(repo, *args, env, check=True, timeout=300):
    return _run(
        [sys.executable, "-m", "dvc", *args], repo, env, check=check, timeout=timeout
    )


def git(repo, *args, env=None):
    return _run(["git", *args], repo, env).stdout.strip()


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e.pop("KILL_AT", None)
    for k in ("DVC_ROOT", "DVC_EXP_BASELINE_REV", "DVC_EXP_NAME", "DVC_STAGE"):
        e.pop(k, None)
    e["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [e.get("PYTHONPATH")])]
    )
    e["DVC_NO_ANALYTICS"] = "1"
    e["REC_LOG"] = str(tmp_path / "rec.log")
    return e


@pytest.fixture
def repo(tmp_path, env):
    return make_project(tmp_path / "repo", branch="master", env=env, files={
        "train.py": TRAIN_PY, "dvc.yaml": DVC_YAML, "params.yaml": "lr: 0.1\nsteps: 3\n",
        "progress.txt": "step 0"})


def read_log(env) -> list[dict]:
    path = Path(env["REC_LOG"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def cached_state(cache_root: Path, dir_hash: str) -> str:
    """Content of ckpt/state.txt of a directory output, read from the cache."""
    files = cache_root / "files" / "md5"
    entries = json.loads((files / dir_hash[:2] / dir_hash[2:]).read_text())
    md5 = next(e["md5"] for e in entries if e["relpath"] == "state.txt")
    return (files / md5[:2] / md5[2:]).read_text()


def lock_ckpt_hash(text: str) -> str:
    from ruamel.yaml import YAML

    data = YAML(typ="safe").load(text)
    (out,) = [o for o in data["stages"]["train"]["outs"] if o["path"] == "ckpt"]
    return out["md5"]


def check_rows(repo, env, exp, steps, lr, baseline):
    """Each checkpoint row: its commit's dvc.lock, cache, metrics, params."""
    rows = exp_rows(repo, all_commits=False, env=env)
    cache = repo / ".dvc" / "cache"
    by_name = {}
    for step in steps:
        name = f"{exp}-step{step}"
        assert name in rows, f"no row {name} in {sorted(rows)}"
        data = rows[name]["data"]
        sha = rows[name]["rev"]
        assert git(repo, "rev-parse", f"{sha}^@") == baseline  # only parent
        lock_hash = lock_ckpt_hash(git(repo, "show", f"{sha}:dvc.lock"))
        assert lock_hash == data["outs"]["ckpt"]["hash"]
        assert cached_state(cache, lock_hash).startswith(f"{step} lr={lr} ")
        metrics = data["metrics"]["dvclive/metrics.json"]["data"]
        assert metrics["step_seen"] == step
        assert data["params"]["params.yaml"]["data"]["lr"] == lr
        assert git(repo, "show", f"{sha}:progress.txt") == f"step {step % 10}"
        by_name[name] = sha
    return rows, by_name


def test_workspace_rows_lineage_and_apply(repo, env):
    baseline = git(repo, "rev-parse", "HEAD")
    dvc(repo, "exp", "run", "-n", "ws", env=env)

    rows, shas = check_rows(repo, env, "ws", [1, 2, 3], 0.1, baseline)
    ignored = (repo / ".gitignore").read_text().splitlines()
    assert ignored.count("/ckpt") == 1, ignored  # once, not once per checkpoint
    assert "ws" in rows  # the final experiment of `dvc exp run` itself
    assert len(rows) == 4
    # the user's branch and HEAD are where they were
    assert git(repo, "symbolic-ref", "HEAD") == "refs/heads/master"
    assert git(repo, "rev-parse", "HEAD") == baseline

    log = read_log(env)
    assert [e["step"] for e in log] == [1, 2, 3]
    assert all(e["workspace"] for e in log)
    listed = rec.list_rows(str(repo), "ws")
    assert [(r["step"], r["sha"], r["name"]) for r in listed] == [
        (s, shas[f"ws-step{s}"], f"ws-step{s}") for s in (1, 2, 3)
    ]
    assert [r["parent"] for r in listed] == [
        None,
        shas["ws-step1"],
        shas["ws-step2"],
    ]
    print(
        "\nrecord_checkpoint ms (workspace):",
        [round(e["ms"], 1) for e in log],
        "phases of last:",
        {k: round(v, 1) for k, v in log[-1]["phases_ms"].items()},
    )

    dvc(repo, "exp", "apply", "ws-step2", env=env)
    assert (repo / "ckpt" / "state.txt").read_text().startswith("2 lr=0.1 ")
    dvc(repo, "exp", "apply", "ws-step1", env=env)
    assert (repo / "ckpt" / "state.txt").read_text().startswith("1 lr=0.1 ")


def test_killed_run_resumes_from_last_checkpoint(repo, env):
    baseline = git(repo, "rev-parse", "HEAD")
    (repo / "params.yaml").write_text("lr: 0.1\nsteps: 4\n")
    proc = dvc(repo, "exp", "run", "-n", "k1", env={**env, "KILL_AT": "2"}, check=False)
    assert proc.returncode != 0

    rows, shas = check_rows(repo, env, "k1", [1, 2], 0.1, baseline)
    assert "k1-step3" not in rows and "k1" not in rows
    # the workspace dvc.lock points at the last recorded checkpoint
    ws_hash = lock_ckpt_hash((repo / "dvc.lock").read_text())
    assert ws_hash == rows["k1-step2"]["data"]["outs"]["ckpt"]["hash"]
    assert git(repo, "symbolic-ref", "HEAD") == "refs/heads/master"

    # corrupt the workspace copy: DVC must check out the dvc.lock version
    (repo / "ckpt" / "state.txt").write_text("999 garbage")
    (repo / "params.yaml").write_text("lr: 0.1\nsteps: 2\n")
    dvc(repo, "exp", "run", "-n", "k2", env=env)
    log = read_log(env)
    resumed = [e for e in log if e["exp"] == "k2"]
    assert [(e["start"], e["step"]) for e in resumed] == [(2, 3), (2, 4)]
    _, shas2 = check_rows(repo, env, "k2", [3, 4], 0.1, baseline)
    listed = {r["name"]: r for r in rec.list_rows(str(repo))}
    assert listed["k2-step3"]["parent"] == shas["k1-step2"]
    assert listed["k2-step4"]["parent"] == shas2["k2-step3"]


def test_temp_run_records_into_main_repo(repo, env):
    baseline = git(repo, "rev-parse", "HEAD")
    lock_before = (repo / "dvc.lock").exists()
    dvc(repo, "exp", "run", "--temp", "-n", "tmpx", "-S", "lr=0.5", env=env)

    rows, _ = check_rows(repo, env, "tmpx", [1, 2, 3], 0.5, baseline)
    assert "tmpx" in rows
    log = read_log(env)
    assert [e["workspace"] for e in log] == [False, False, False]
    assert (repo / "dvc.lock").exists() == lock_before  # workspace untouched
    dvc(repo, "exp", "apply", "tmpx-step2", env=env)
    assert (repo / "ckpt" / "state.txt").read_text().startswith("2 lr=0.5 ")


def test_queued_runs_in_parallel_do_not_mix(repo, env, tmp_path):
    baseline = git(repo, "rev-parse", "HEAD")
    dvc(repo, "exp", "run", "--queue", "-n", "qa", "-S", "lr=0.01", env=env)
    dvc(repo, "exp", "run", "--queue", "-n", "qb", "-S", "lr=0.02", env=env)
    gate = tmp_path / "gate"
    workers_env = {**env, "GATE_AT": f"2:{gate}", "STEP_SLEEP": "0.3"}  # workers inherit it

    def logged(step: int) -> set:  # runs that logged this step (whole lines only)
        path = Path(env["REC_LOG"])
        lines = path.read_text().split("\n")[:-1] if path.exists() else []
        return {e["exp"] for e in map(json.loads, lines) if e["step"] == step}

    def start_workers(jobs: str) -> None:
        subprocess.run([sys.executable, "-m", "dvc", "queue", "start", "-j", jobs], cwd=repo,
                       env=workers_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True)

    def report(status: dict) -> str:  # with the rows the runs logged
        rec_log = Path(env["REC_LOG"])
        return (queue_report(repo, status) + "\nrows logged:\n"
                + (rec_log.read_text() if rec_log.exists() else "none"))

    try:
        # One worker first, the second once the first run trains: DVC sets up
        # two queued runs at once with a race of its own that can fail one
        # before its stage starts (treeverse/dvc#10673). What is tested here
        # is recording, so both runs then record steps 2 and 3 at once: each
        # waits at step 2 until both have recorded step 1.
        start_workers("1")
        wait_queue(repo, lambda _: logged(1), "first row", report)
        start_workers("2")
        wait_queue(repo, lambda _: logged(1) == {"qa", "qb"}, "first row of both runs", report)
        gate.touch()
        wait_queue(repo, lambda st: st == {"qa": "Success", "qb": "Success"}, "end of both runs",
                   report)
    finally:
        dvc(repo, "queue", "stop", env=env, check=False)

    for exp, lr in (("qa", 0.01), ("qb", 0.02)):
        rows, shas = check_rows(repo, env, exp, [1, 2, 3], lr, baseline)
        assert exp in rows
        listed = rec.list_rows(str(repo), exp)
        assert [r["step"] for r in listed] == [1, 2, 3]
        assert [r["parent"] for r in listed] == [
            None,
            shas[f"{exp}-step1"],
            shas[f"{exp}-step2"],
        ]
    log = read_log(env)
    assert sorted((e["exp"], e["step"]) for e in log) == [
        (x, s) for x in ("qa", "qb") for s in (1, 2, 3)
    ]
    assert not any(e["workspace"] for e in log)
    spans = {
        x: (min(e["t"] for e in log if e["exp"] == x),
            max(e["t"] for e in log if e["exp"] == x))
        for x in ("qa", "qb")
    }
    assert spans["qa"][0] <= spans["qb"][1] and spans["qb"][0] <= spans["qa"][1], spans
    print("\nrecord ms:", [round(e["ms"], 1) for e in log])


# ---------------------------------------------------------------------------
# direct calls with the env `dvc exp run` gives the stage command
# ---------------------------------------------------------------------------


@pytest.fixture
def stage_env(repo, monkeypatch):
    """Be the stage command of a workspace run: env set, cwd in the repo, and
    this process as new (one run a process: core/run.py)."""
    reset()
    baseline = git(repo, "rev-parse", "HEAD")
    for k in ("KILL_AT",):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("DVC_ROOT", str(repo))
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", baseline)
    monkeypatch.setenv("DVC_EXP_NAME", "direct")
    monkeypatch.setenv("DVC_STAGE", "train")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.chdir(repo)
    (repo / "ckpt").mkdir()
    (repo / "ckpt" / "state.txt").write_text("1 direct")
    yield baseline
    reset()


def test_direct_call_leaves_head_and_index_alone(repo, stage_env):
    (repo / "notes.txt").write_text("staged")
    git(repo, "add", "notes.txt")
    (repo / "progress.txt").write_text("step 7")  # same size, unstaged
    staged_before = git(repo, "diff", "--cached", "--name-only")
    index_before = (repo / ".git" / "index").read_bytes()

    res = rec.record(1)

    assert res.ref.endswith(f"/{stage_env[:2]}/{stage_env[2:]}/direct-step1")
    assert res.workspace and res.parent is None
    assert git(repo, "rev-parse", res.ref) == res.sha
    assert git(repo, "rev-parse", "HEAD") == stage_env
    assert git(repo, "diff", "--cached", "--name-only") == staged_before
    assert (repo / ".git" / "index").read_bytes() == index_before
    files = git(repo, "ls-tree", "-r", "--name-only", res.sha).split()
    assert {"notes.txt", "dvc.lock", "dvc.yaml", "params.yaml", ".gitignore"} <= set(
        files
    )
    assert "ckpt/state.txt" not in files
    assert git(repo, "show", f"{res.sha}:progress.txt") == "step 7"
    assert lock_ckpt_hash((repo / "dvc.lock").read_text()) == lock_ckpt_hash(
        git(repo, "show", f"{res.sha}:dvc.lock")
    )
    assert not list((repo / ".git").glob("dvc-dali-index-*"))

    (repo / "ckpt" / "state.txt").write_text("2 direct")
    res2 = rec.record(2, message="second")
    assert res2.parent == res.sha
    assert git(repo, "log", "-1", "--format=%s", res2.sha) == "second"
    # the same name again gets a distinct ref, nothing is overwritten
    res3 = rec.record(2)
    assert res3.name.startswith("direct-step2-") and res3.ref != res2.ref
    assert git(repo, "rev-parse", res2.ref) == res2.sha

    # step=None: one more than the last checkpoint of this lineage ...
    (repo / "ckpt" / "state.txt").write_text("3 direct")
    res4 = rec.record()
    assert (res4.step, res4.name, res4.parent) == (3, "direct-step3", res3.sha)
    # ... also in a new process, found from the outputs in dvc.lock
    runs.current().tips.clear()
    (repo / "ckpt" / "state.txt").write_text("4 direct")
    res5 = rec.record()
    assert (res5.step, res5.parent) == (4, res4.sha)


def test_errors_name_the_problem(repo, stage_env, monkeypatch):
    monkeypatch.setenv("DVC_STAGE", "nope")
    with pytest.raises(RecordError, match="'nope'"):
        rec.record(1)
    monkeypatch.setenv("DVC_STAGE", "train")

    with pytest.raises(RecordError, match="equals the experiment name"):
        rec.record(1, name="direct")
    with pytest.raises(RecordError, match="not a valid git ref"):
        rec.record(1, name="bad name..x")


    monkeypatch.setenv("DVC_ROOT", str(repo / "ckpt"))
    with pytest.raises(RecordError, match="not a DVC repo"):
        rec.record(1)

    monkeypatch.delenv("DVC_EXP_BASELINE_REV")
    assert not RunContext.from_environ().under_exp_run
    with pytest.raises(RecordError, match="dvc exp run"):
        rec.record(1)


def test_commit_without_git_identity(repo, stage_env, monkeypatch, tmp_path):
    git(repo, "config", "--unset", "user.name")
    git(repo, "config", "--unset", "user.email")
    for k in ("NAME", "EMAIL"):
        for who in ("AUTHOR", "COMMITTER"):
            monkeypatch.delenv(f"GIT_{who}_{k}", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("EMAIL", "")
    res = rec.record(1)
    assert git(repo, "log", "-1", "--format=%an <%ae>", res.sha).startswith("dvc-dali")


def test_uncacheable_output_records_no_row(repo, stage_env):
    """A cache that cannot take the output: a RecorderError naming the output
    and the stage, and no experiment row pointing at outputs it lacks."""
    import shutil

    shutil.rmtree(repo / ".dvc" / "cache", ignore_errors=True)
    (repo / ".dvc" / "cache").write_text("not a directory")
    with pytest.raises(RecordError, match=r"caching output 'ckpt' of stage 'train'"):
        rec.record(1)
    assert git(repo, "for-each-ref", "refs/exps") == ""
    (repo / ".dvc" / "cache").unlink()
    res = rec.record(1)  # fixed: the next checkpoint records
    assert res.name == "direct-step1"


def test_clean_filter_is_applied_as_git_would(repo, stage_env, monkeypatch):
    """A changed file with a clean filter (as git-lfs sets up) is committed
    as git stores it, through the filter, which libgit2 cannot run."""
    git(repo, "config", "filter.upper.clean", "tr a-z A-Z")
    git(repo, "config", "filter.upper.smudge", "cat")
    (repo / ".gitattributes").write_text("progress.txt filter=upper\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-qm", "attributes")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", git(repo, "rev-parse", "HEAD"))
    (repo / "progress.txt").write_text("step 5")
    res = rec.record(1)
    assert git(repo, "show", f"{res.sha}:progress.txt") == "STEP 5"
    assert git(repo, "show", f"{res.sha}:dvc.lock") == (repo / "dvc.lock").read_text().strip()


def test_held_index_lock_does_not_stop_recording(repo, env, tmp_path):
    """Another git process (an editor's `git status`) holding .git/index.lock
    for 8 s while the run records: every row is recorded, training goes on."""
    import threading

    (repo / "params.yaml").write_text("lr: 0.1\nsteps: 6\n")
    git(repo, "commit", "-qam", "6 steps")
    lock, end = repo / ".git" / "index.lock", tmp_path / "end"
    go = dict(env, STEP_SLEEP="0.3", END_AFTER=str(end))
    proc = subprocess.Popen([sys.executable, "-m", "dvc", "exp", "run", "-n", "held"], cwd=repo,
                            env=go, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    held_rows: list[int] = []

    def hold() -> None:
        while not read_log(env) and proc.poll() is None:  # the first row is recorded
            time.sleep(0.05)
        lock.write_text("")
        start, seen = time.monotonic(), len(read_log(env))
        # held at least 8 s, until every later row is recorded (training then
        # waits for `end`, so DVC's own final commit finds the index free)
        while proc.poll() is None and (time.monotonic() - start < 8 or len(read_log(env)) < 6):
            time.sleep(0.05)
        held_rows.extend(e["step"] for e in read_log(env)[seen:])
        lock.unlink()
        end.write_text("")

    holder = threading.Thread(target=hold)
    holder.start()
    out, _ = proc.communicate(timeout=300)
    holder.join()
    assert proc.returncode == 0, out
    assert len(held_rows) >= 3 and held_rows[-1] == 6, (held_rows, out)
    check_rows(repo, env, "held", range(1, 7), 0.1, git(repo, "rev-parse", "HEAD"))


def test_a_checkpoint_changed_under_the_run_is_not_recorded(repo, stage_env):
    """Another command (a second `dvc exp run` in this workspace checks the
    outputs out again before DVC refuses it) replaced the checkpoint the run
    just wrote: no row holds another step's checkpoint; the next one records."""
    (repo / "ckpt" / "LATEST").write_text("step-000000002-aaaaaaaa 0\n")  # what DVC put back
    with pytest.raises(RecordError, match="changed since this run saved its checkpoint"):
        rec.record(3, out="ckpt", expect_latest="step-000000003-bbbbbbbb 0\n")
    assert git(repo, "for-each-ref", "refs/exps") == ""
    (repo / "ckpt" / "LATEST").write_text("step-000000004-cccccccc 0\n")
    res = rec.record(4, out="ckpt", expect_latest="step-000000004-cccccccc 0\n")
    assert res.name == "direct-step4"


def test_tracked_files_changed_between_rows_are_in_the_next_row(repo, stage_env, monkeypatch):
    """Rows hold `git add -u` as at their own step, though only the first
    compares the whole work tree: later ones look at what inotify saw change
    (and compare everything again once a watched directory is gone)."""
    pkg = repo / "src" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text("v1")
    (pkg / "keep.py").write_text("same")
    git(repo, "add", "src")
    git(repo, "commit", "-qm", "a package")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", git(repo, "rev-parse", "HEAD"))
    reset()

    def files(sha: str) -> dict[str, str]:
        names = git(repo, "ls-tree", "-r", "--name-only", sha, "src").split()
        return {n: git(repo, "show", f"{sha}:{n}") for n in names}

    (pkg / "mod.py").write_text("v2 before the first row")
    first = rec.record(1)
    assert files(first.sha) == {"src/pkg/mod.py": "v2 before the first row",
                                "src/pkg/keep.py": "same"}
    (pkg / "mod.py").write_text("v3")  # another size: any stat would see it; inotify must
    (repo / "progress.txt").write_text("step 9")
    (pkg / "new.py").write_text("untracked: git add -u leaves it out")
    second = rec.record(2)
    assert files(second.sha) == {"src/pkg/mod.py": "v3", "src/pkg/keep.py": "same"}
    assert git(repo, "show", f"{second.sha}:progress.txt") == "step 9"
    (pkg / "mod.py").unlink()
    assert files(rec.record(3).sha) == {"src/pkg/keep.py": "same"}
    (pkg / "mod.py").write_text("back")
    assert files(rec.record(4).sha) == {"src/pkg/mod.py": "back", "src/pkg/keep.py": "same"}
    for p in pkg.iterdir():
        p.unlink()
    pkg.rmdir()  # the watched directory itself: from now on, whole comparisons
    assert files(rec.record(5).sha) == {}
    (pkg).mkdir()
    (pkg / "keep.py").write_text("restored")
    assert files(rec.record(6).sha) == {"src/pkg/keep.py": "restored"}
