"""The dvc-dali command against real DVC projects."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import dvc_dali

from tests.helpers import child_env
from tests.helpers.dvc_project import commit_all, make_project, run
from tests.helpers.rows import exp_refs, exp_rows

DVC_DALI = [sys.executable, "-m", "dvc_dali.cli"]
KILL = "DVC_DALI_EXAMPLE_KILL_AT_STEP"


SUBCOMMANDS = ["init", "show", "run", "remove", "reset", "doctor"]


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_subcommand_has_help(tmp_path, sub):
    out = run([*DVC_DALI, sub, "--help"], tmp_path)
    assert out.stdout.startswith("usage: dvc-dali " + sub)


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_subcommand_help_has_a_description(tmp_path, sub):
    paragraphs = run([*DVC_DALI, sub, "--help"], tmp_path).stdout.split("\n\n")
    assert paragraphs[0].startswith("usage: dvc-dali " + sub)
    assert not paragraphs[1].startswith(("positional arguments", "options")), paragraphs[1]
    assert len(paragraphs[1].split()) >= 8  # a sentence, not a stub


def test_python_dash_m_dvc_dali_is_the_command(tmp_path):
    """`python -m dvc_dali`, what a new user types first, is `dvc-dali` too."""
    for cmd in ([sys.executable, "-m", "dvc_dali", "--version"], [*DVC_DALI, "--version"]):
        assert run(cmd, tmp_path).stdout == f"dvc-dali {dvc_dali.__version__}\n", cmd
    refused = run([sys.executable, "-m", "dvc_dali", "nosuch"], tmp_path, check=False)
    assert refused.returncode == 2 and "invalid choice: 'nosuch'" in refused.stderr


def test_init_writes_a_project_that_runs_and_refuses_to_overwrite(tmp_path):
    from PIL import Image

    make_project(tmp_path, message=None)
    run([*DVC_DALI, "init"], tmp_path)
    refused = run([*DVC_DALI, "init"], tmp_path, check=False)
    assert refused.returncode == 1 and "--force" in refused.stderr
    (tmp_path / "train.py").write_text("# edited\n" + (tmp_path / "train.py").read_text())
    run([*DVC_DALI, "init", "--force"], tmp_path)
    assert not (tmp_path / "train.py").read_text().startswith("# edited")
    rng = np.random.default_rng(0)
    for c in range(3):
        (tmp_path / "data/images" / str(c)).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (20, 20), dtype=np.uint8)).save(
                tmp_path / "data/images" / str(c) / f"{i}.png")
    params = tmp_path / "params.yaml"
    params.write_text(params.read_text().replace("steps: 100", "steps: 30"))
    commit_all(tmp_path)
    run(["dvc", "exp", "run", "-n", "tpl"], tmp_path)
    rows = exp_rows(tmp_path)
    assert [rows[f"tpl-step{s}"]["step"] for s in (10, 20, 30)] == [10, 20, 30]


def test_init_then_init_digits_as_its_last_line_says_writes_the_samples(tmp_path):
    """`dvc-dali init` ends with "or `dvc-dali init --digits` for samples";
    run then, it was refused (the templates exist) and only --force, which
    overwrites the user's files, wrote them (found by a sweep). Untouched
    templates are no obstacle now; an edited one still is. In another
    directory, the next line starts with its `cd`."""
    first = run([*DVC_DALI, "init", "p r"], tmp_path).stdout.splitlines()[-1]
    assert first.startswith("next: put images in data/images/<class>/ (or `dvc-dali init "
                            "--digits 'p r'` for samples), then `cd 'p r' && git init && "), first
    digits = run([*DVC_DALI, "init", "--digits", "p r"], tmp_path)
    assert (tmp_path / "p r" / "data" / "images" / "7").is_dir(), digits.stdout
    train = tmp_path / "p r" / "train.py"
    train.write_text(train.read_text() + "# mine\n")
    shutil.rmtree(tmp_path / "p r" / "data")
    refused = run([*DVC_DALI, "init", "--digits", "p r"], tmp_path, check=False)
    assert refused.returncode == 1 and "p r/train.py already exists; nothing written" in (
        refused.stderr)
    assert train.read_text().endswith("# mine\n")


def _failed_run(project, *args):
    """A `dvc exp run` that must fail in one line; params.yaml put back (DVC
    leaves a -S value in it, and git may not see the change: same size,
    same second)."""
    params = (project / "params.yaml").read_text()
    proc = run(["dvc", "exp", "run", *args], project, check=False)
    (project / "params.yaml").write_text(params)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


def test_the_init_template_without_images_says_what_to_do(tmp_path):
    """A new user's first `dvc exp run` before the images are in place, or
    with a params.yaml value the template cannot use: one line each, no
    traceback (each was DALI's or Python's traceback)."""
    make_project(tmp_path, message=None)
    run([*DVC_DALI, "init"], tmp_path)
    (tmp_path / "data/images").mkdir(parents=True)
    commit_all(tmp_path)
    assert "train.py: params.yaml train.lr is 'fast', not a number: set it (`dvc exp run -S " \
        "train.lr=...` or in params.yaml), then rerun" in _failed_run(tmp_path, "-S",
                                                                       "train.lr=fast")
    no_class = run(["dvc", "exp", "run"], tmp_path, check=False)
    assert no_class.returncode != 0 and "Traceback" not in no_class.stderr, no_class.stderr
    assert "train.py: data/images holds no <class>/ folders: put your images in " \
        "data/images/<class>/" in no_class.stderr, no_class.stderr
    (tmp_path / "data/images/cat").mkdir()
    no_file = run(["dvc", "exp", "run"], tmp_path, check=False)
    assert no_file.returncode != 0 and "Traceback" not in no_file.stderr, no_file.stderr
    assert "PipelineBuildError: DALI could not build pipeline 'train' in its CPU operator " \
        "nvidia.dali.fn.readers.file (made at train.py, line " in no_file.stderr, no_file.stderr
    assert "): No files found. Fix the pipeline's arguments or the files it reads" \
        in no_file.stderr, no_file.stderr
    assert "PipelineBuildError: DALI could not build pipeline 'train': Invalid batch size: 0." \
        in _failed_run(tmp_path, "-S", "train.batch_size=0")


def test_show_draws_the_checkpoints_by_step_with_a_branch(project):
    run(["dvc", "exp", "run", "-n", "a"], project)
    run(["dvc", "exp", "apply", "a-step30"], project)
    run(["dvc", "exp", "run", "-n", "b", "-S", "train.lr=0.05"], project)
    rows = json.loads(run([*DVC_DALI, "show", "--json"], project).stdout)
    a = [r for r in rows if r["exp"] == "a"]
    assert [r["step"] for r in a] == [10, 20, 30, 40, 50, 60]
    assert all("train/acc" in r["metrics"] for r in rows)
    b40 = next(r for r in rows if r["name"] == "b-step40")
    assert b40["parent"] == next(r for r in a if r["step"] == 30)["sha"]  # resumed from a-step30
    text = run([*DVC_DALI, "show"], project).stdout
    assert "a  (baseline" in text and "b  (baseline" in text
    assert text.index("a-step10") < text.index("a-step20") < text.index("a-step60")
    assert "b  (baseline" in text and "3 checkpoints, resumed from a-step30)" in text
    assert "train/acc=" in text


HOLD = """
import sys, dvc_dali
ck = dvc_dali.Checkpointer("checkpoint")  # a run training into it holds it so
print("held", flush=True)
sys.stdin.read()
"""


GATED = """
import os, pathlib, time, dvc_dali
gate = pathlib.Path(os.environ["GATE"])
ck = dvc_dali.Checkpointer("checkpoint", total_steps=2)
ck.make_checkpoint(1)
(gate / f"at1-{os.getpid()}").touch()
while not (gate / "go").exists():  # held here, between two rows, until the test lets go
    time.sleep(0.05)
ck.make_checkpoint(2)
"""


def _wait_for(found, what: str) -> None:
    """Until found() (an event in files); the cap is for a stuck run, not a timing."""
    deadline = time.monotonic() + 480
    while not found():
        assert time.monotonic() < deadline, f"no {what}"
        time.sleep(0.05)


def test_remove_refuses_a_temp_or_queued_run_in_training(tmp_path):
    """`dvc-dali remove` of a `--temp` or queued run still training: refused
    (it removed its rows, and the run recorded the next ones and DVC's
    experiment under the same name: the run came back); once they end, done."""
    from tests.helpers.dvc_project import queue_report, wait_queue

    project, gate = tmp_path / "p", tmp_path / "gate"
    gate.mkdir()
    make_project(project, message=None)
    (project / "dvc.yaml").write_text(
        "stages:\n  train:\n    cmd: python train.py\n    deps: [train.py]\n    outs:\n"
        "      - checkpoint: {persist: true, checkpoint: true}\n    always_changed: true\n")
    (project / "train.py").write_text(GATED)
    commit_all(project, "gated")
    env = {"GATE": str(gate)}
    temp = subprocess.Popen(["dvc", "exp", "run", "--temp", "-n", "t"], cwd=project, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=child_env(env, this_python=True))
    try:
        run(["dvc", "exp", "run", "--queue", "-n", "q"], project, env=env)
        # the worker inherits its output: not a pipe (run() would wait for the worker)
        subprocess.run(["dvc", "queue", "start"], cwd=project, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=child_env(env, this_python=True),
                       check=True)
        _wait_for(lambda: len(list(gate.glob("at1-*"))) == 2, "first checkpoint of both runs")
        _wait_for(lambda: {"t-step1", "q-step1"} <= set(exp_rows(project)), "rows of step 1")
        refused = {name: run([*DVC_DALI, "remove", name], project, check=False)
                   for name in ("t", "q")}
    finally:
        (gate / "go").touch()
        said = temp.communicate()[0]
    assert temp.returncode == 0, said[-3000:]
    wait_queue(project, lambda st: st.get("q") == "Success", "end of the queued run",
               lambda st: queue_report(project, st))
    for name, proc in refused.items():
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc
        assert f"run {name} is training in process " in proc.stderr, proc.stderr
        assert "nothing removed" in proc.stderr, proc.stderr
    rows = exp_rows(project)
    assert {"t-step1", "t-step2", "q-step1", "q-step2"} <= set(rows), sorted(rows)
    removed = run([*DVC_DALI, "remove", "t", "q"], project)
    assert "removed 2 rows of t" in removed.stdout and "removed 2 rows of q" in removed.stdout, \
        removed.stdout
    assert not {"t-step1", "q-step1"} & set(exp_rows(project))


def test_reset_starts_over(project):
    import subprocess

    from tests.helpers import child_env

    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={KILL: "30"})
    # while a process holds the checkpoint (a run training), nothing is reset
    holder = subprocess.Popen([sys.executable, "-c", HOLD], cwd=project, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env())
    try:
        assert holder.stdout.readline() == "held\n"
        refused = run([*DVC_DALI, "reset"], project, check=False)
        # nor are the rows of the run it trains removed under it
        kept = run([*DVC_DALI, "remove", "a"], project, check=False)
    finally:
        holder.communicate("")
    assert kept.returncode != 0 and "a-step30" in exp_rows(project)
    assert (f"run a is training in process {holder.pid} (it holds the checkpoint and records "
            "its rows): nothing removed") in kept.stderr, kept
    assert refused.returncode != 0 and (project / "checkpoint" / "LATEST").exists()
    assert (f"checkpoint is in use by process {holder.pid} (a run training into it): nothing "
            "was reset. Stop that run first") in refused.stdout + refused.stderr, refused
    assert "Traceback" not in refused.stderr
    shutil.rmtree(project / "checkpoint")  # deleted by hand: dvc.lock still names it
    out = run([*DVC_DALI, "reset"], project)
    assert "removed dvc.lock:train" in out.stdout, out.stdout
    again = run(["dvc", "exp", "run", "-n", "fresh"], project)
    assert "train: starting on " in again.stdout and "resuming" not in again.stdout
    assert "a-step30" in exp_rows(project)  # recorded rows are kept


def test_doctor_finds_stale_signal_and_bad_stage(project):
    run(["dvc", "exp", "run", "-n", "a"], project)
    good = run([*DVC_DALI, "doctor"], project)
    assert "ok   stage train: checkpoint output checkpoint is persisted" in good.stdout
    assert (project / ".dvc/tmp/rwlock").is_file() and "rwlock" not in good.stdout
    (project / ".dvc/tmp/DVC_CHECKPOINT").write_text("")
    (project / ".dvc/tmp/rwlock").write_text("")  # as a kill mid-write leaves it
    run_info = project / ".dvc/tmp/exps/run/workspace/workspace.run"
    run_info.parent.mkdir(parents=True, exist_ok=True)
    run_info.write_text("")  # DVC's info file of a workspace run, as a kill leaves it
    (project / ".git/refs/exps/exec").mkdir(parents=True, exist_ok=True)
    (project / ".git/refs/exps/exec/EXEC_BRANCH.lock").write_text("")
    (project / ".git/packed-refs.lock").write_text("")
    (project / "params.yaml").write_text("")  # as a kill of DVC's rewrite for -S leaves it
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("always_changed: true",
                                                     "always_changed: false"))
    bad = run([*DVC_DALI, "doctor"], project, check=False)
    assert bad.returncode == 1
    assert "BAD  " in bad.stdout and "stale checkpoint signal" in bad.stdout
    assert "always_changed: true" in bad.stdout
    assert "EXEC_BRANCH.lock: a git lock left by a killed `dvc exp run`" in bad.stdout
    assert "packed-refs.lock: a git lock left by a killed `dvc exp run`" in bad.stdout
    assert "rwlock: unreadable (JSONDecodeError), left by a killed DVC command" in bad.stdout
    assert "workspace.run: unreadable (JSONDecodeError), left by a killed DVC" in bad.stdout
    assert "params.yaml: empty, while the committed one is not" in bad.stdout, bad.stdout
    assert f"`git checkout HEAD -- '{project / 'params.yaml'}'`" in bad.stdout, bad.stdout


def test_a_dvc_lock_cut_short_by_a_kill_is_named_with_the_row_that_resumes(project):
    """DVC rewrites dvc.lock in place at the end of a stage: a kill meanwhile
    leaves it cut short, and every later `dvc exp run` fails on it, with
    nothing said of the rows (the kill fuzz met it in CI). doctor names the
    newest row on the commit; applied, the next run resumes from it."""
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={KILL: "30"})
    lock = project / "dvc.lock"
    text = lock.read_text()
    # as a kill leaves it: right after DVC's open "w" (CI's case), or mid-dump
    for cut, why in [("", "required key not provided @ data['schema']"),
                     (text[:text.index("outs:") + len("outs:\n    - ")], "expected a dictionary")]:
        lock.write_text(cut)
        failed = run(["dvc", "exp", "run", "-n", "b"], project, check=False)
        assert failed.returncode != 0 and "dvc.lock' validation failed" in failed.stderr, failed
        doctor = run([*DVC_DALI, "doctor"], project, check=False)
        assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor
        assert f"BAD  {lock}: DVC cannot read it ({why}" in doctor.stdout, doctor
        assert "put the newest row on this commit back with `dvc exp apply a-step30` (step " \
            "30 of run a;" in doctor.stdout, doctor.stdout
        assert "cannot load the stages" not in doctor.stdout + doctor.stderr  # said once
    from tests.helpers.fuzz_harness import doctor_fix  # the kill fuzz's user, as here

    assert doctor_fix(project, "dvc.lock: DVC cannot read it") == "dvc exp apply a-step30"
    again = run(["dvc", "exp", "run", "-n", "b"], project)
    assert "train: resuming from step 30 " in again.stdout, again.stdout


def test_retention_keeps_last_n_and_the_best(project):
    run(["dvc", "exp", "run", "-n", "r"], project,
        env={"DVC_DALI_KEEP_LAST": "2", "DVC_DALI_KEEP_BEST": "train/loss:max"})
    names = {n for n in exp_rows(project) if n.startswith("r-")}
    # loss falls as training goes on: the max-loss row is the first one
    assert names == {"r-step10", "r-step50", "r-step60"}


SHELL_TRAINER = """#!/bin/sh
# A non-Python trainer following DVC 2's protocol.
set -e
mkdir -p checkpoint
for step in 1 2 3; do
  echo "state at step $step" > checkpoint/state.txt
  echo "{\\"step\\": $step}" > metrics.json
  touch "$DVC_ROOT/.dvc/tmp/DVC_CHECKPOINT"
  while [ -e "$DVC_ROOT/.dvc/tmp/DVC_CHECKPOINT" ]; do sleep 0.01; done
done
"""


def shell_project(path: Path) -> Path:
    """A DVC project whose stage is SHELL_TRAINER under `dvc-dali run`: three
    rows in about a second."""
    dvc_yaml = (f"stages:\n  train:\n    cmd: {sys.executable} -m dvc_dali.cli run -- ./train.sh\n"
                "    outs:\n      - checkpoint:\n          persist: true\n"
                "    metrics:\n      - metrics.json:\n          cache: false\n"
                "    always_changed: true\n")
    make_project(path, files={"train.sh": SHELL_TRAINER, "dvc.yaml": dvc_yaml}, message=None)
    (path / "train.sh").chmod(0o755)  # before the commit: git records the mode
    commit_all(path)
    return path


def test_run_wrapper_records_a_non_python_trainer(tmp_path):
    shell_project(tmp_path)
    # an empty lock where a row goes, as a kill inside git's ref write leaves
    # it: removed at the run's start (recording/cut_short.py), not in its way
    base = head_sha(tmp_path)
    lock = tmp_path / ".git" / "refs" / "exps" / base[:2] / base[2:] / "sh-step2.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    out = run(["dvc", "exp", "run", "-n", "sh"], tmp_path)
    assert "sh-step2.lock: removed, a lock left by a killed run" in out.stderr
    assert out.stderr.count("dvc-dali: recorded sh-step") == 3
    rows = exp_rows(tmp_path)
    assert [rows[f"sh-step{s}"]["step"] for s in (1, 2, 3)] == [1, 2, 3]
    run(["dvc", "exp", "apply", "sh-step2"], tmp_path)
    assert (tmp_path / "checkpoint/state.txt").read_text() == "state at step 2\n"
    assert not (tmp_path / ".dvc/tmp/DVC_CHECKPOINT").exists()


@pytest.mark.parametrize("declared", [False, True])
def test_run_wrapper_refuses_a_checkpoint_path_that_is_not_the_stages_output(tmp_path, declared):
    """`dvc-dali run --checkpoint nosuchdir`: refused before the command
    starts, whether the stage's output is declared `checkpoint: true` (where
    `import dvc_dali` started the run from that output) or not."""
    shell_project(tmp_path)
    dvc_yaml = (tmp_path / "dvc.yaml").read_text().replace(
        "run -- ./train.sh", "run --checkpoint nosuchdir -- ./train.sh")
    if declared:
        dvc_yaml = dvc_yaml.replace("persist: true", "persist: true\n          checkpoint: true")
    (tmp_path / "dvc.yaml").write_text(dvc_yaml)
    commit_all(tmp_path)
    out = run(["dvc", "exp", "run", "-n", "sh"], tmp_path, check=False)
    assert out.returncode != 0, out.stderr
    assert "'nosuchdir' is not one of its outputs" in out.stderr, out.stderr
    assert "recorded sh-step" not in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "checkpoint").exists()  # the command never ran


def test_run_wrapper_kills_the_command_when_a_row_cannot_be_recorded(tmp_path):
    """DVC 2 killed the stage's command when a checkpoint failed: the trainer
    would otherwise wait for the signal file to go, for ever (and hold the
    output `dvc exp run` reads)."""
    shell_project(tmp_path)
    base = head_sha(tmp_path)
    # git's lock on the ref of row sh-step2, dated after the run's start, as a
    # live writer's would be: left alone (recording/cut_short.py), so the ref
    # cannot be created
    lock = tmp_path / ".git" / "refs" / "exps" / base[:2] / base[2:] / "sh-step2.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    os.utime(lock, (time.time() + 86400,) * 2)
    out = run(["dvc", "exp", "run", "-n", "sh"], tmp_path, check=False, timeout=300)
    assert out.returncode != 0
    assert "the training command (pid " in out.stderr and ") was killed" in out.stderr
    assert "could not create experiment ref" in out.stderr
    assert not (tmp_path / ".dvc/tmp/DVC_CHECKPOINT").exists()
    assert "sh-step1" in exp_refnames(tmp_path) and "sh-step3" not in exp_refnames(tmp_path)


# --------------------------------------------------------------------------
# show, remove and messages on rows made by hand: commits carrying the
# lineage line the recorder writes, under refs/exps/<b[:2]>/<b[2:]>/<row>
# --------------------------------------------------------------------------


@pytest.fixture
def bare_project(tmp_path) -> Path:
    """A git + DVC repository with one commit and no stage."""
    return make_project(tmp_path)


def head_sha(repo: Path) -> str:
    return run(["git", "rev-parse", "HEAD"], repo).stdout.strip()


def add_rows(repo: Path, exp: str, steps, times=None, baseline: str | None = None,
             resumed_from: str | None = None, chain: bool = True,
             under: str = "") -> list[str]:
    """Rows of run ``exp`` at ``steps`` (committed at ``times``, unix seconds),
    each with a DVCLive metrics file (in folder ``under``: a stage's wdir),
    chained as the recorder chains them (``chain=False``: each row on its
    own, as after resumes from elsewhere). Returns their shas."""
    import pygit2

    repo_ = pygit2.Repository(str(repo))
    base = baseline or head_sha(repo)
    parent, shas = resumed_from, []
    for i, step in enumerate(steps):
        when = times[i] if times else 1_700_000_000 + i
        metrics = json.dumps({"step": step, "train": {"acc": step / 1000}}).encode()
        sub = repo_.TreeBuilder()
        sub.insert("metrics.json", repo_.create_blob(metrics), pygit2.GIT_FILEMODE_BLOB)
        top = repo_.TreeBuilder(repo_[base].peel(pygit2.Tree))
        live = sub.write()
        if under:
            wdir = repo_.TreeBuilder()
            wdir.insert("dvclive", live, pygit2.GIT_FILEMODE_TREE)
            top.insert(under, wdir.write(), pygit2.GIT_FILEMODE_TREE)
        else:
            top.insert("dvclive", live, pygit2.GIT_FILEMODE_TREE)
        who = pygit2.Signature("dvc-dali tests", "test@example.invalid", when, 0)
        message = (f"dvc-dali checkpoint {exp} step {step}\n\ndvc-dali-checkpoint: exp={exp} "
                   f"step={step} parent={parent or 'none'} stage=dvc.yaml:train "
                   f"outs={'0123456789abcdef'}\n")
        ref = f"refs/exps/{base[:2]}/{base[2:]}/{exp}-step{step}"
        shas.append(str(repo_.create_commit(ref, who, who, message, top.write(), [base])))
        parent = shas[-1] if chain else resumed_from
    return shas


def exp_refnames(repo: Path) -> set[str]:
    return {ref.rsplit("/", 1)[-1] for _, ref in exp_refs(repo, dvc_exec=True)}


def test_show_orders_runs_newest_first_and_marks_each_runs_latest_row(bare_project):
    add_rows(bare_project, "alpha", [1, 2], times=[1000, 1001])
    add_rows(bare_project, "beta", [5], times=[3000])
    # recorded within one second: the times tie, the steps must not reorder
    add_rows(bare_project, "gamma", range(1, 13), times=[2000] * 12)
    add_rows(bare_project, "delta", [2, 10, 9, 1], times=[1500] * 4, chain=False)
    text = run([*DVC_DALI, "show"], bare_project).stdout
    heads = [text.index(f"{exp}  (") for exp in ("beta", "gamma", "delta", "alpha")]
    assert heads == sorted(heads), text  # by newest row, not by name
    assert "beta  (baseline" in text and "1 checkpoint)" in text and "1 checkpoints" not in text
    assert "gamma  (baseline" in text and "12 checkpoints)" in text

    def steps(exp):
        return [int(line.split()[2]) for line in text.splitlines() if f" {exp}-step" in line]
    assert steps("gamma") == list(range(1, 13)) and steps("delta") == [1, 2, 9, 10]
    latest = [line.split()[3] for line in text.splitlines() if line.endswith("latest")]
    assert latest == ["beta-step5", "gamma-step12", "delta-step10", "alpha-step2"]
    assert "train/acc=0.012" in text  # metrics read from the rows' commits
    rows = json.loads(run([*DVC_DALI, "show", "--json"], bare_project).stdout)
    assert [r["name"] for r in rows if r["latest"]] == latest
    assert [r["step"] for r in rows if r["exp"] == "gamma"] == list(range(1, 13))


def test_show_draws_in_ascii_where_the_output_cannot_encode_its_tree(bare_project):
    """PYTHONIOENCODING=ascii (a locale that is not UTF-8): the tree in
    ASCII, the names escaped; it was a UnicodeEncodeError traceback (found
    by a sweep)."""
    add_rows(bare_project, "caf\u00e9", [1, 2], times=[1000, 1001])
    proc = run([*DVC_DALI, "show"], bare_project, env={"PYTHONIOENCODING": "ascii"})
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "|- step       1  caf\\xe9-step1" in proc.stdout, proc.stdout
    assert "`- step       2  caf\\xe9-step2" in proc.stdout and "<- latest" in proc.stdout, \
        proc.stdout


def test_show_reads_every_metrics_file_with_one_git_process(bare_project, tmp_path_factory):
    add_rows(bare_project, "many", range(1, 41))
    wrap = tmp_path_factory.mktemp("bin")
    log = wrap / "calls.log"
    (wrap / "git").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {shutil.which("git")} "$@"\n')
    (wrap / "git").chmod(0o755)
    path = f"{wrap}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    text = run([*DVC_DALI, "show"], bare_project, env={"PATH": path}).stdout
    assert "40 checkpoints" in text and "many-step40" in text and "train/acc=0.04" in text
    calls = log.read_text().splitlines()
    assert sum("cat-file" in c.split() for c in calls) == 1, calls
    assert not any("show" in c.split() for c in calls), calls
    assert len(calls) <= 5, calls  # not one process per row


def test_show_metrics_file_with_odd_bytes_or_a_line_break_finds_no_row(bare_project):
    """--metrics-file of non-UTF-8 bytes was a traceback; one with a line
    break was two questions to `git cat-file --batch`, so a row got the
    answer meant for another name (here: the real metrics of a row, shown
    for a file no row holds). Both are answered: no row holds it."""
    shas = add_rows(bare_project, "a", [1, 2])
    for name in ("\udcff.json", f"nosuch.json\n{shas[1]}:dvclive/metrics.json"):
        out = run([*DVC_DALI, "show", "--metrics-file", name], bare_project, check=False)
        assert out.returncode == 1 and out.stdout == "", out.stdout
        assert out.stderr.startswith("dvc-dali show: no row holds "), out.stderr
        assert "Traceback" not in out.stderr and "train/acc" not in out.stderr, out.stderr


def test_show_best_by_a_metric_no_row_has_exits_1(bare_project):
    """As `show nosuch`: the rows are listed, the question is not answered,
    so the exit status says so (it was 0)."""
    add_rows(bare_project, "a", [1, 2])
    out = run([*DVC_DALI, "show", "--best", "nosuch:max"], bare_project, check=False)
    assert out.returncode == 1 and "a-step2" in out.stdout, out
    assert out.stderr == ("dvc-dali show: --best nosuch:max: no row has nosuch (their metrics: "
                          "train/acc; nested names take '/', as train/acc)\n"), out.stderr
    assert run([*DVC_DALI, "show", "--best", "train/acc:max"], bare_project).returncode == 0
    found = run([*DVC_DALI, "show", "--json", "--best", "train/acc:max"], bare_project)
    assert found.stderr == "" and [r["name"] for r in json.loads(found.stdout)
                                   if r.get("best")] == ["a-step2"], found


def test_show_best_names_where_it_read_the_metrics_when_no_row_has_any(bare_project):
    """Metrics under a folder no dvc.yaml declares: `--best` said no row
    has the metric, with none listed and nothing to do (found by a sweep);
    it says where it read them and the option that reads another file.
    Where the rows' dvc.yaml gives the stage a `wdir`, its metrics are read
    there, as `dvc exp show` reads them (they were not: found by a sweep)."""
    add_rows(bare_project, "w", [1, 2], under="work")
    out = run([*DVC_DALI, "show", "--best", "train/acc:max"], bare_project, check=False)
    assert out.returncode == 1, out
    assert "they were read from dvclive/metrics.json at the repository's root, as no dvc.yaml " \
        "of theirs declares a JSON metrics file: another file takes --metrics-file <its path>" \
        in out.stderr, out.stderr
    found = run([*DVC_DALI, "show", "--best", "train/acc:max", "--metrics-file",
                 "work/dvclive/metrics.json"], bare_project)
    assert "best by train/acc:max: w-step2" in found.stdout, found.stdout
    assert "metrics read from" not in found.stdout, found.stdout
    (bare_project / "dvc.yaml").write_text(
        "stages:\n  train:\n    cmd: python train.py\n    wdir: work\n"
        "    metrics:\n      - dvclive/metrics.json:\n          cache: false\n")
    commit_all(bare_project, "a stage with wdir")
    add_rows(bare_project, "v", [1, 2], under="work")  # the rows' commits hold that dvc.yaml
    found = run([*DVC_DALI, "show", "v", "--best", "train/acc:max"], bare_project)
    assert "train/acc=0.002  " in found.stdout and "best by train/acc:max: v-step2" in \
        found.stdout, found.stdout
    assert "metrics read from work/dvclive/metrics.json, as dvc.yaml declares them " \
        "(--metrics-file reads another)\n" in found.stdout, found.stdout


def test_a_missing_command_is_called_command_and_every_usage_lists_migrate(bare_project):
    out = run([*DVC_DALI], bare_project, check=False)
    assert out.returncode == 2 and "required: COMMAND" in out.stderr, out.stderr
    out = run([*DVC_DALI, "show", "nosuch", "--bogus"], bare_project, check=False)
    assert out.returncode == 2 and "unrecognized arguments: --bogus" in out.stderr, out.stderr
    out = run([*DVC_DALI, "shw"], bare_project, check=False)  # the choices, from show's parser too
    assert out.returncode == 2 and "'migrate'" in out.stderr, out.stderr


def test_show_into_head_ends_quietly(bare_project):
    add_rows(bare_project, "long", range(1, 1501))  # ~150 KB, more than a pipe holds
    shell = (f"{sys.executable} -m dvc_dali.cli show | head -n 2; "
             'echo "show exited ${PIPESTATUS[0]}" >&2')
    out = run(["bash", "-c", shell], bare_project)
    assert out.stdout.startswith("long  (baseline") and len(out.stdout.splitlines()) == 2
    # what `git log | head` gives: killed by SIGPIPE, 128 + 13, and not a word
    assert out.stderr == "show exited 141\n"


def test_show_unknown_experiment_exits_1(bare_project):
    add_rows(bare_project, "a", [1])
    out = run([*DVC_DALI, "show", "nosuch"], bare_project, check=False)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("dvc-dali show: ") and "'nosuch'" in out.stderr
    out = run([*DVC_DALI, "show", "nosuch", "--json"], bare_project, check=False)
    assert out.returncode == 1 and "'nosuch'" in out.stderr
    empty = run([*DVC_DALI, "show"], bare_project)  # asked for nothing in particular: fine
    assert "a  (baseline" in empty.stdout


def test_a_dvc_project_without_git_has_no_rows_and_says_why(tmp_path):
    """`dvc init --no-scm`: no git, so no experiment refs; not "repair git"."""
    run(["dvc", "init", "--no-scm", "-q"], tmp_path)
    out = run([*DVC_DALI, "show"], tmp_path, check=False)
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert out.stderr.startswith(f"dvc-dali show: {tmp_path} is not in a git repository, so "
                                 "it has no recorded rows"), out.stderr
    assert "--no-scm" in out.stderr and "git fsck" not in out.stderr, out.stderr
    assert dvc_dali.current_row("checkpoint", repo=tmp_path) is None
    with pytest.raises(dvc_dali.DvcDaliError, match="not in a git repository"):
        dvc_dali.rows(repo=tmp_path)


def test_show_says_when_git_fails(bare_project, tmp_path_factory):
    add_rows(bare_project, "a", [1, 2])
    ref = bare_project / ".git" / "refs/exps" / head_sha(bare_project)[:2]
    broken = next(ref.rglob("a-step2"))
    broken.write_text("not a sha\n")  # git skips such a ref with a warning, and exits 0
    out = run([*DVC_DALI, "show"], bare_project, check=False)
    assert out.returncode == 1 and "no dvc-dali checkpoints" not in out.stdout
    assert out.stderr.startswith("dvc-dali show: git could not read the experiment refs")
    assert "broken ref" in out.stderr and "dvc_dali:" not in out.stderr
    broken.unlink()
    wrap = tmp_path_factory.mktemp("bin")
    (wrap / "git").write_text("#!/bin/sh\necho 'git: something broke' >&2\nexit 3\n")
    (wrap / "git").chmod(0o755)
    path = f"{wrap}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    out = run([*DVC_DALI, "show"], bare_project, check=False, env={"PATH": path})
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("dvc-dali show: ") and "something broke" in out.stderr
    assert "Traceback" not in out.stderr


def test_remove_deletes_whole_runs_on_every_baseline(bare_project):
    first = head_sha(bare_project)
    add_rows(bare_project, "a", [1, 2, 3])
    add_rows(bare_project, "b", [1, 2])
    own = run(["git", "commit-tree", "-p", first, "-m", "dvc's own", f"{first}^{{tree}}"],
              bare_project).stdout.strip()  # what `dvc exp run -n a` leaves at the end
    run(["git", "update-ref", f"refs/exps/{first[:2]}/{first[2:]}/a", own], bare_project)
    (bare_project / "more.txt").write_text("x\n")
    commit_all(bare_project, "second baseline")
    second = head_sha(bare_project)
    add_rows(bare_project, "a", [4, 5], baseline=second)
    before = exp_refnames(bare_project)

    for args, why in ([["nosuch"], "no run named nosuch"], [["b", "nosuch"], "nosuch"],
                      [["a-step1"], "a-step1 is one checkpoint row of run a"]):
        out = run([*DVC_DALI, "remove", *args], bare_project, check=False)
        assert out.returncode == 1 and why in out.stderr, out.stderr
        assert out.stderr.startswith("dvc-dali remove: ") and "dvc_dali:" not in out.stderr
        assert exp_refnames(bare_project) == before  # all or nothing
    out = run([*DVC_DALI, "remove", "a"], bare_project)
    assert f"removed 3 rows of a and DVC's experiment a (baseline {first[:7]})" in out.stdout
    assert f"removed 2 rows of a (baseline {second[:7]})" in out.stdout
    assert "`dvc gc`" in out.stdout
    assert exp_refnames(bare_project) == {"b-step1", "b-step2"}
    assert "a  (" not in run([*DVC_DALI, "show"], bare_project).stdout
    out = run([*DVC_DALI, "remove", "b"], bare_project)
    assert f"removed 2 rows of b (baseline {first[:7]})" in out.stdout
    assert exp_refnames(bare_project) == set()


def test_remove_a_recorded_run(tmp_path):
    project = shell_project(tmp_path)
    run(["dvc", "exp", "run", "-n", "sh"], project)
    # resumes run sh: its rows keep the name (sh-step4..6); `kept` is DVC's own ref
    run(["dvc", "exp", "run", "-n", "kept"], project)

    def names(prefix):
        return {n for n in exp_rows(project) if n and n.startswith(prefix)}
    assert names("sh") == {"sh", *(f"sh-step{i}" for i in range(1, 7))}
    assert names("kept") == {"kept"}
    out = run([*DVC_DALI, "remove", "sh"], project)
    assert "removed 6 rows of sh and DVC's experiment sh (baseline" in out.stdout
    assert names("sh") == set() and names("kept") == {"kept"}


def test_errors_carry_one_prefix(bare_project):
    (bare_project / "dvc.yaml").write_text("stages:\n  train:\n    cmd: echo hi\n")
    out = run([*DVC_DALI, "reset", "--stage", "nosuch"], bare_project, check=False)
    assert out.returncode == 1 and out.stderr.startswith("dvc-dali reset: ")
    assert "'nosuch'" in out.stderr and "dvc_dali:" not in out.stderr
    assert not out.stderr.startswith(("dvc-dali reset: dvc-dali", "dvc-dali reset: dvc_dali"))


def test_doctor_says_when_no_stage_has_a_checkpoint_output(bare_project):
    (bare_project / "dvc.yaml").write_text(
        "stages:\n  train:\n    cmd: echo hi\n    outs:\n      - model\n")
    out = run([*DVC_DALI, "doctor"], bare_project, check=False)
    assert out.returncode == 1
    assert "BAD  no stage in " in out.stdout and "has a checkpoint output" in out.stdout
    # --verify ROW said nothing of ROW (found by a sweep): it is named, with why
    for asked, named in ((["a-step10"], "a-step10"), ([], "the workspace's checkpoint")):
        out = run([*DVC_DALI, "doctor", "--verify", *asked], bare_project, check=False)
        assert out.returncode == 1, out
        assert f"BAD  --verify: {named} not verified: no stage declares a checkpoint " \
            "output, so there is no checkpoint to replay" in out.stdout, out.stdout
    (bare_project / "dvc.lock").write_text("schema: '2.0'\nstages: [cut\n")  # a kill's
    out = run([*DVC_DALI, "doctor", "--verify", "a-step10"], bare_project, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out
    assert "BAD  --verify: a-step10 not verified: cannot load the stages of the DVC repo " \
        in out.stdout, out.stdout


def test_init_refuses_what_it_cannot_write_before_writing_anything(tmp_path):
    """A file as the directory (a traceback-like "[Errno 17]"), and a
    directory where a template file goes (--force wrote part of the
    template, then failed)."""
    (tmp_path / "afile").write_text("")
    for target in ("afile", "afile/sub"):
        out = run([*DVC_DALI, "init", target], tmp_path, check=False)
        assert out.returncode == 1 and "afile is a file, not a directory" in out.stderr, out
    (tmp_path / "p" / "params.yaml").mkdir(parents=True)
    out = run([*DVC_DALI, "init", "--force", "p"], tmp_path, check=False)
    assert out.returncode == 1 and "a directory where the template writes a file" in out.stderr
    assert sorted(f.name for f in (tmp_path / "p").iterdir()) == ["params.yaml"]  # nothing


CTRL_C_TRAINER = """
import os, signal, sys, time
from pathlib import Path

got = []
signal.signal(signal.SIGINT, lambda n, f: got.append(n))


def checkpoint(step):
    Path("checkpoint").mkdir(exist_ok=True)
    Path("checkpoint/state.txt").write_text(f"state at step {step}")
    flag = Path(os.environ["DVC_ROOT"]) / ".dvc" / "tmp" / "DVC_CHECKPOINT"
    flag.touch()
    while flag.exists():
        time.sleep(0.01)


for step in range(1, 6):
    if step == 3:
        os.killpg(os.getpgid(0), signal.SIGINT)  # a terminal's Ctrl-C: the whole group
    if got:
        checkpoint(step)  # the last one, then out
        print(f"trainer: {len(got)} SIGINT, last checkpoint at step {step}", flush=True)
        sys.exit(130)
    checkpoint(step)
"""


def run_python_trainer(path: Path, trainer: str, name: str) -> str:
    """``trainer`` as shell_project's command under `dvc-dali run`, `dvc exp
    run -n name` in a process group of its own (the trainer signals it
    whole); what it said."""
    shell_project(path)
    (path / "train.py").write_text(trainer)
    dvc_yaml = (path / "dvc.yaml").read_text().replace(
        "./train.sh", f"{sys.executable} train.py")
    (path / "dvc.yaml").write_text(dvc_yaml)
    commit_all(path)
    proc = subprocess.run(["dvc", "exp", "run", "-n", name], cwd=path, capture_output=True,
                          text=True, env=child_env(this_python=True), start_new_session=True,
                          timeout=300)
    return proc.stdout + proc.stderr


def test_run_wrapper_lets_one_ctrl_c_reach_the_command_once(tmp_path):
    """A terminal's Ctrl-C signals the whole process group, the command
    included: `dvc-dali run` passed it on as well, so the command got it
    twice and, as DVC 2's users wrote it, was killed while saving its last
    checkpoint (found by a sweep). Once now, and that checkpoint recorded."""
    said = run_python_trainer(tmp_path, CTRL_C_TRAINER, "c")
    assert "trainer: 1 SIGINT, last checkpoint at step 3" in said, said
    assert "Traceback" not in said, said
    assert {f"c-step{s}" for s in (1, 2, 3)} <= set(exp_rows(tmp_path)), said
    assert "dvc-dali: interrupted (Ctrl-C): step 3 is kept as row c-step3" in said, said


BARE_TERM_TRAINER = """
import os, signal
from pathlib import Path
import dvc_dali

for step in range(1, 6):
    if step == 3:
        os.killpg(os.getpgid(0), signal.SIGTERM)  # a SLURM-like stop: the whole group
    Path("checkpoint").mkdir(exist_ok=True)
    Path("checkpoint/state.txt").write_text(f"state at step {step}")
    dvc_dali.make_checkpoint(step)
"""


def test_run_wrapper_says_what_it_kept_and_its_command_no_false_line(tmp_path):
    """A bare make_checkpoint() under `dvc-dali run`, SIGTERM to the group
    after two rows: the command, which records nothing itself, said "no
    checkpoint was recorded by this run" (as under DVC 2; found by a
    sweep); the wrapper, which recorded them, now says which is kept."""
    said = run_python_trainer(tmp_path, BARE_TERM_TRAINER, "t")
    assert "no checkpoint was recorded" not in said, said
    assert "dvc-dali: terminated (SIGTERM): step 2 is kept as row t-step2" in said, said


def test_a_checkpoint_path_differing_only_in_unicode_normalization_is_named_so(tmp_path):
    """dvc.yaml declares 'ckü' (NFC), the command passes it in NFD (macOS,
    some editors): refused, and the two names, which print alike, are told
    apart (found by a sweep)."""
    shell_project(tmp_path)
    nfc, nfd = "ck\u00fc", "cku\u0308"
    dvc_yaml = (tmp_path / "dvc.yaml").read_text().replace(
        "run -- ./train.sh", f"run --checkpoint {nfd} -- ./train.sh").replace(
        "- checkpoint:", f"- {nfc}:")
    (tmp_path / "dvc.yaml").write_text(dvc_yaml, encoding="utf-8")
    commit_all(tmp_path)
    out = run(["dvc", "exp", "run", "-n", "sh"], tmp_path, check=False)
    assert out.returncode != 0, out.stderr
    assert ("it differs from the declared 'ck\\xfc' only in Unicode normalization: "
            "'cku\\u0308'") in out.stderr, out.stderr


# --------------------------------------------------------------------------
# bad input, as a new user or an attacker gives it: one line naming the
# input, what is wrong and what to do, exit 1 (found by a bad-input sweep)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory) -> Path:
    """Rows a-step1, a-step2 that hold, besides their DVCLive metrics, files
    that are no metrics file; a bare git repository as origin, a local
    directory as the default DVC remote."""
    top = tmp_path_factory.mktemp("odd")
    project = make_project(top / "p", files={
        "notes.yaml": "stages: {}\n", "blob.bin": b"\x00\xff\xfe\x89PNG",
        "list.json": "[1, 2]\n", "steps.json": '{"step": 3}\n', "sub/keep.txt": "x\n",
        "not-exec.sh": "#!/bin/sh\ntouch ran\n"})
    add_rows(project, "a", [1, 2])
    run(["git", "init", "-q", "--bare", str(top / "origin.git")], top)
    run(["git", "remote", "add", "origin", str(top / "origin.git")], project)
    run(["dvc", "remote", "add", "-d", "store", str(top / "store")], project)
    (top / "not-git").mkdir()
    return project


def _refused(project: Path, *args: str) -> str:
    out = run([*DVC_DALI, *args], project, check=False)
    assert out.returncode == 1 and out.stdout == "", (args, out.stdout, out.stderr)
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    return out.stderr


@pytest.mark.parametrize("name, says", [
    ("notes.yaml", "no row's notes.yaml holds metrics: it is not JSON"),
    ("blob.bin", "no row's blob.bin holds metrics: it is not JSON"),
    ("list.json", "no row's list.json holds metrics: it is JSON, but not an object of metrics"),
    ("sub", "no row holds sub, a directory here"),
])
def test_show_metrics_file_that_holds_no_metrics_is_refused(odd_files, name, says):
    """A file the rows hold that is no metrics file (dvc.yaml, a binary
    file) listed the rows without metrics and exited 0; refused now, as a
    file no row holds was, with the default to give instead."""
    said = _refused(odd_files, "show", "--metrics-file", name)
    assert said.startswith(f"dvc-dali show: {says}"), said
    assert said.endswith("(--metrics-file: a DVCLive metrics file, relative to the DVC "
                         "project; default dvclive/metrics.json)\n"), said


def test_show_metrics_file_of_the_step_alone_lists_the_rows_and_says_so(odd_files):
    """A DVCLive file before its first metric: the rows, and why they show
    none (nothing was said)."""
    out = run([*DVC_DALI, "show", "--metrics-file", "steps.json"], odd_files)
    assert "a-step2" in out.stdout and "=" not in out.stdout, out.stdout
    assert out.stderr.startswith("dvc-dali show: no row's steps.json holds a metric: it holds "
                                 "no number (the step aside); the rows are listed without "
                                 "metrics (--metrics-file: "), out.stderr


@pytest.mark.parametrize("args, says", [
    (["--keep-last", "-3"], "--keep-last=-3: must be a positive integer"),
    (["--keep-last", "0"], "--keep-last=0: must be a positive integer"),
    (["--keep-best", "garbage"], "--keep-best='garbage': must be '<metric>:max' or"),
    (["--keep-best", "acc:maxx"], "--keep-best='acc:maxx': must be '<metric>:max' or"),
    (["--checkpoint", "/"], "--checkpoint / is outside the DVC project"),
    (["--checkpoint", "."], "--checkpoint . is the DVC project itself"),
])
def test_run_outside_dvc_exp_run_refuses_what_dvc_exp_run_refuses(odd_files, args, says):
    """Outside `dvc exp run`, `dvc-dali run` runs the command without
    recording: its options passed unchecked, to be refused only later in
    the stage. Refused before the command starts, in both places."""
    said = _refused(odd_files, "run", *args, "--", "touch", "ran")
    assert said.startswith(f"dvc-dali run: {says}"), said
    assert not (odd_files / "ran").exists()


@pytest.mark.parametrize("program, says", [
    ("./nope", "'./nope' (the training command after --): no such file in "),
    ("nope-no-such-command", "'nope-no-such-command' (the training command after --): no such "
                             "command on PATH"),
    ("./sub", "'./sub' (the training command after --): a directory, not a program"),
    ("./not-exec.sh", "'./not-exec.sh' (the training command after --): not executable; "
                      "`chmod +x ./not-exec.sh`"),
])
def test_run_names_a_program_it_cannot_start(odd_files, program, says):
    """It was Python's `[Errno 2] No such file or directory: './nope'`."""
    said = _refused(odd_files, "run", "--", program)
    assert said.startswith(f"dvc-dali run: {says}") and "Nothing was run" in said, said
    assert "Errno" not in said and not (odd_files / "ran").exists()


def test_run_under_dvc_exp_run_refuses_a_program_it_cannot_start(tmp_path):
    """Under `dvc exp run` too: before the run starts, in one line."""
    project = shell_project(tmp_path)
    dvc_yaml = (project / "dvc.yaml").read_text().replace("-- ./train.sh", "-- ./trian.sh")
    (project / "dvc.yaml").write_text(dvc_yaml)
    commit_all(project)
    out = run(["dvc", "exp", "run", "-n", "sh"], project, check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "dvc-dali run: './trian.sh' (the training command after --): no such file in " \
        f"{project}; give the training program's path. Nothing was run" in out.stderr, out.stderr
    assert "Errno" not in out.stderr and "sh-step" not in out.stderr, out.stderr


@pytest.mark.parametrize("args, says", [
    (["show", ""], "experiment name '' is empty: give a run's name"),
    (["show", "--metrics-file", ""], "--metrics-file '' is empty: give a DVCLive metrics file"),
    (["show", "--best", "acc:maxx"], "--best='acc:maxx': must be '<metric>:max' or"),
    (["remove", "a", " "], "experiment name ' ' is empty"),
    (["push", "", "a"], "git remote '' is empty: give a remote `git remote -v` lists"),
    (["init", ""], "directory '' is empty: give the project's directory"),
])
def test_blank_arguments_are_refused_not_taken_for_none(odd_files, args, says):
    """`show ''` said no checkpoints were recorded (exit 0), `--metrics-file
    ''` read the default, `init ''` wrote into ., `--best acc:maxx` named
    `best=`."""
    said = _refused(odd_files, *args)
    assert said.startswith(f"dvc-dali {args[0]}: {says}"), said
    assert exp_refnames(odd_files) == {"a-step1", "a-step2"}
    assert not (odd_files / "dvc.yaml").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_init_into_a_directory_it_cannot_make_says_so(tmp_path):
    """It was Python's "[Errno 2] No such file or directory: '/proc/x/p'"."""
    said = _refused(tmp_path, "init", "/proc/nosuch/p")
    assert said == ("dvc-dali init: cannot make the directory /proc/nosuch/p: No such file or "
                    "directory; give one you can write; nothing written.\n"), said


def test_init_names_a_path_that_is_not_utf8_and_an_os_error_as_people_read_them(tmp_path):
    """A directory named with byte 0xff showed as w\\udcff, and a template's
    name that is a dangling link was Python's "[Errno 2] No such file or
    directory: ..." (found by a sweep); --force replaces the link (it wrote
    through it, and stopped there with the templates half written)."""
    project = tmp_path / os.fsdecode(b"w\xff")
    project.mkdir()
    (project / "dvc.yaml").symlink_to("nowhere/x")
    said = _refused(tmp_path, "init", project.name)
    assert said == ("dvc-dali init: w\\xff/dvc.yaml already exists; nothing written. Use "
                    "--force to overwrite them.\n"), said
    # its lines printed the name's raw byte, as no other message does; and
    # where stdout is strict UTF-8 (a UTF-8 locale other than C.UTF-8), a
    # UnicodeEncodeError traceback after the first template (found by a sweep)
    replaced = " (replacing the link to nowhere/x)"
    for io in ("utf-8:surrogateescape", "utf-8:strict"):
        forced = subprocess.run([*DVC_DALI, "init", "--force", project.name], cwd=tmp_path,
                                capture_output=True,  # bytes: the raw byte is not "\\xff"
                                env=child_env({"PYTHONIOENCODING": io}, this_python=True))
        assert forced.returncode == 0, forced.stderr
        assert forced.stdout == (
            f"wrote w\\xff/dvc.yaml{replaced}\nwrote w\\xff/train.py\nwrote w\\xff/params.yaml\n"
            "next: put images in data/images/<class>/ (or `dvc-dali init --digits 'w\\xff'` for "
            "samples), then `cd 'w\\xff' && git init && dvc init && git add . && git commit -m "
            "start && dvc exp run`\n").encode(), forced.stdout
        replaced = ""  # the link is gone now
    assert sorted(p.name for p in project.iterdir()) == ["dvc.yaml", "params.yaml", "train.py"]
    assert not (project / "dvc.yaml").is_symlink()


@pytest.mark.parametrize("command", ["pull", "push"])
def test_push_and_pull_say_what_git_could_not_do_in_one_line(odd_files, command):
    """A git remote that does not exist, or is no git repository: git's
    whole stderr was printed ("Please make sure you have the correct access
    rights..."); one line now, naming the remote, the run and the fix."""
    verb = "pulled" if command == "pull" else "pushed"
    said = _refused(odd_files, command, "orign", "a")
    assert said == (f"dvc-dali {command}: git remote 'orign': no remote of that name here "
                    "(configured: origin), nor a URL or a path; give one `git remote -v` lists, "
                    f"or add it with `git remote add orign <url>`; nothing {verb} of a\n"), said
    not_git = str(odd_files.parent / "not-git")
    said = _refused(odd_files, command, not_git, "a")
    reason = f"'{not_git}' does not appear to be a git repository"
    if command == "pull":
        assert said == (f"dvc-dali pull: cannot fetch a from git remote {not_git}: {reason}; "
                        f"nothing pulled. Check the remote (`git ls-remote {not_git}`, `git "
                        "remote -v`), then run the command again\n"), said
    else:
        assert said == (f"dvc-dali push: git push of a to {not_git} failed: {reason}. Nothing "
                        f"was pushed, the data neither; check the git remote (`git ls-remote "
                        f"{not_git}`), then run the command again.\n"), said


def test_push_without_a_dvc_remote_says_so_in_one_line(bare_project):
    add_rows(bare_project, "a", [1])
    said = _refused(bare_project, "push", str(bare_project), "a")
    assert said.startswith("dvc-dali push: DVC remote (the default): config file error: no "
                           "remote specified in "), said
