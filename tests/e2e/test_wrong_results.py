"""Paths that once ended with `dvc exp run` reporting success while the rows
or the model were wrong: each now gives the right rows or a clear refusal.
Real `dvc exp run` in temporary git + DVC repositories."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.dvc_project import (leave_stashed_entry, make_project, queue_report, run,
                                       template_project, wait_queue)
from tests.helpers.rows import exp_refs

BARE_TRAIN = textwrap.dedent("""\
    import os, sys, yaml
    from dvc_dali import make_checkpoint

    steps = yaml.safe_load(open("params.yaml"))["steps"]
    os.makedirs("checkpoint", exist_ok=True)
    state = "checkpoint/state.txt"
    start = int(open(state).read()) if os.path.exists(state) else 0
    for step in range(start + 1, steps + 1):
        open(state, "w").write(str(step))
        make_checkpoint()
        if os.environ.get("KILL_AT") == str(step):
            os._exit(9)
    """)

DVC2_STAGE = textwrap.dedent("""\
    stages:
      train:
        cmd: python train.py
        params: [steps]
        outs:
          - checkpoint:
              checkpoint: true
    """)


def bare_project(tmp_path: Path, dvc_yaml: str) -> Path:
    return make_project(tmp_path / "p", files={
        "train.py": BARE_TRAIN, "dvc.yaml": dvc_yaml, "params.yaml": "steps: 4\n"})


@pytest.mark.parametrize("yaml_text", [
    DVC2_STAGE,  # no persist, no always_changed: DVC 2's own form
    DVC2_STAGE.replace("checkpoint: true", "checkpoint: true\n          persist: true"),
    DVC2_STAGE.replace("    outs:", "    always_changed: true\n    outs:"),
], ids=["dvc2-as-is", "persist-only", "always-changed-only"])
def test_bare_make_checkpoint_refuses_a_stage_dvc3_cannot_resume(tmp_path, yaml_text):
    """A DVC 2 project ported by changing only the import: refused at the
    first make_checkpoint(), before any row, with the YAML to add."""
    project = bare_project(tmp_path, yaml_text)
    proc = run(["dvc", "exp", "run", "-n", "port"], project, check=False)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "cannot resume from checkpoints under DVC 3" in err
    assert "persist: true" in err and "always_changed: true" in err
    assert exp_refs(project) == []


def test_the_refusal_names_the_checkpoint_output_beside_a_persisted_metrics_file(tmp_path):
    """Found by a sweep: with a persisted metrics file beside the DVC 2
    checkpoint output, the refusal named the metrics file as the output and
    only the missing always_changed, and told the script to pass the
    checkpoint it already used."""
    yaml_text = DVC2_STAGE + "    metrics:\n      - m.json:\n          cache: false\n" \
        "          persist: true\n"
    project = bare_project(tmp_path, yaml_text)
    proc = run(["dvc", "exp", "run", "-n", "port"], project, check=False)
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "output 'checkpoint' is not `persist: true`" in err, err
    assert "m.json" not in err and "always_changed: true" in err, err
    assert exp_refs(project) == []


def test_bare_make_checkpoint_with_a_resumable_stage_records_and_resumes(tmp_path):
    yaml_text = DVC2_STAGE.replace("checkpoint: true", "checkpoint: true\n          persist: true"
                                   ).replace("    outs:", "    always_changed: true\n    outs:")
    project = bare_project(tmp_path, yaml_text)
    killed = run(["dvc", "exp", "run", "-n", "port"], project, check=False,
                 env={"KILL_AT": "2"})
    assert killed.returncode != 0
    run(["dvc", "exp", "run", "-n", "port2"], project)
    assert (project / "checkpoint" / "state.txt").read_text() == "4"
    names = {r.rsplit("/", 1)[-1] for _, r in exp_refs(project)}
    assert {"port-step1", "port-step2"} <= names, names
    assert json.loads(run(["dvc", "exp", "show", "--json"], project).stdout)


RESUMABLE = DVC2_STAGE.replace("checkpoint: true", "checkpoint: true\n          persist: true"
                               ).replace("    outs:", "    always_changed: true\n    outs:")


def row_names(project: Path) -> dict[str, set[str]]:
    """{baseline sha: row names} of the experiment rows."""
    out: dict[str, set[str]] = {}
    for _, ref in exp_refs(project):
        _, _, a, b, name = ref.split("/")
        out.setdefault(a + b, set()).add(name)
    return out


def test_retention_prunes_only_its_own_runs_rows(tmp_path):
    """DVC_DALI_KEEP_LAST=2 keeps the run's last 2 rows, and never reaches
    the rows of an experiment of the same name on another baseline."""
    project = bare_project(tmp_path, RESUMABLE)
    first = run(["git", "rev-parse", "HEAD"], project).stdout.strip()
    run(["dvc", "exp", "run", "-n", "same"], project)
    (project / "params.yaml").write_text("steps: 8\n")
    run(["git", "commit", "-qam", "more steps"], project)
    second = run(["git", "rev-parse", "HEAD"], project).stdout.strip()
    run(["dvc", "exp", "run", "-n", "same"], project, env={"DVC_DALI_KEEP_LAST": "2"})
    rows = row_names(project)
    assert {n for n in rows[first] if "-step" in n} == {f"same-step{s}" for s in range(1, 5)}
    assert {n for n in rows[second] if "-step" in n} == {"same-step7", "same-step8"}


def restart_keeping_one(project: Path, how: str, *args: str, env: dict | None = None
                        ) -> tuple[dict, dict, str]:
    """Run a finished, then `dvc exp run -n a -f <args>` (in the workspace,
    --temp, or queued and run by `dvc queue start`) under
    DVC_DALI_KEEP_LAST=1 (and ``env``): (a's rows before, every row after,
    the output)."""
    before = {ref: sha for sha, ref in exp_refs(project) if "-step" in ref}
    keep = {"DVC_DALI_KEEP_LAST": "1", **(env or {})}
    restart = ["dvc", "exp", "run", "-n", "a", "-f", *args]
    if how == "queue":
        run([*restart[:3], "--queue", *restart[3:]], project)
        run(["dvc", "queue", "start"], project, env=keep)
        wait_queue(project, lambda s: s.get("a") in ("Success", "Failed"), "queued run a done",
                   lambda s: queue_report(project, s))
        text = run(["dvc", "queue", "logs", "a"], project).stdout
    else:
        out = run([*restart[:3], *(["--temp"] if how == "temp" else []), *restart[3:]],
                  project, env=keep)
        text = out.stdout + out.stderr
    return before, {ref: sha for sha, ref in exp_refs(project) if "-step" in ref}, text


@pytest.mark.parametrize("how", ["workspace", "temp", "queue"])
def test_a_finished_run_restarted_under_its_name_leaves_its_rows_to_retention(tmp_path, how):
    """`dvc exp run -n a -f` with other params after run a finished: a new
    run from step 0 under a's name, said with "the finished one stays
    recorded", and DVC_DALI_KEEP_LAST=1 then deleted the finished run's rows
    as if they were the new run's (found by a sweep). The new run prunes
    only its own rows: those whose lineage line names its start (the
    manifest's run.started), --temp and queued runs alike."""
    project = template_project(tmp_path)
    every = ["-S", "train.checkpoint_every=5", "-S", "train.steps=10"]
    run(["dvc", "exp", "run", "-n", "a", *every], project)
    before, after, text = restart_keeping_one(project, how, *every, "-S", "train.lr=0.05")
    assert len(before) == 2, before
    assert "starting a new run from step 0 (the finished one stays recorded)" in text, text
    assert before.items() <= after.items(), (before, after, text)
    assert len(after) == 3, (after, text)  # and the new run's last row alone


def test_an_unfinished_run_branched_off_under_its_name_leaves_its_rows_to_retention(tmp_path):
    """`dvc exp run -n a -f -S train.lr=...` after run a was killed: a run
    of its own that resumes a's last row (rows a-step30...), which carried
    a's start and so, under DVC_DALI_KEEP_LAST=1, deleted a's rows."""
    project = make_project(tmp_path, example=True, prepared=True)
    run(["dvc", "exp", "run", "-n", "a"], project, check=False,
        env={"DVC_DALI_EXAMPLE_KILL_AT_STEP": "20"})
    before, after, text = restart_keeping_one(project, "workspace", "-S", "train.lr=0.05",
                                              "-S", "train.steps=40")
    assert {ref.rsplit("/", 1)[1] for ref in before} == {"a-step10", "a-step20"}, before
    assert "resuming from step 20" in text, text
    assert before.items() <= after.items(), (before, after, text)
    assert len(after) == 3, (after, text)  # and the new run's last row alone


@pytest.mark.parametrize("name,value", [
    ("DVC_DALI_KEEP_LAST", "-1"), ("DVC_DALI_KEEP_LAST", "0"), ("DVC_DALI_KEEP_LAST", "abc"),
    ("DVC_DALI_KEEP_BEST", "nonsense"), ("DVC_DALI_LOCK_TIMEOUT", "soon")])
def test_bad_settings_are_refused_before_any_row(tmp_path, name, value):
    """-1 once deleted every row; now no value that is not a count gets in."""
    project = bare_project(tmp_path, RESUMABLE)
    proc = run(["dvc", "exp", "run", "-n", "bad"], project, check=False,
               env={name: value, "DVC_DALI_KEEP_LAST": "2"} if name != "DVC_DALI_KEEP_LAST"
               else {name: value})
    assert proc.returncode != 0
    assert f"{name}={value!r}" in proc.stdout + proc.stderr
    assert exp_refs(project) == []


GATED_TRAIN = textwrap.dedent("""\
    import os, time, yaml
    from dvc_dali import make_checkpoint

    params = yaml.safe_load(open("params.yaml"))
    os.makedirs("checkpoint", exist_ok=True)
    for step in range(1, params["steps"] + 1):
        open("checkpoint/state.txt", "w").write(f"{step} lr={params['lr']}")
        make_checkpoint()
        open(os.environ["PROGRESS"], "a").write(f"{step}\\n")
        while step == 2 and not os.path.exists(os.environ["GO_ON"]):
            time.sleep(0.05)  # the test starts a second run here
    """)


def test_a_second_run_in_the_workspace_does_not_change_the_first_runs_rows(tmp_path):
    """While a run trains, `dvc exp run -S lr=0.2` in the same workspace is
    refused before it touches anything (dvc-dali holds DVC's experiment lock
    for the workspace run): the first run's rows record the params it trains
    with, and it ends well (tests/e2e/test_second_run.py has the other cases)."""
    import subprocess
    import sys
    import time

    project = bare_project(tmp_path, RESUMABLE.replace("params: [steps]", "params: [steps, lr]"))
    (project / "train.py").write_text(GATED_TRAIN)
    (project / "params.yaml").write_text("steps: 4\nlr: 0.1\n")
    run(["git", "commit", "-qam", "gated"], project)
    progress, go_on = tmp_path / "progress", tmp_path / "go"
    env = {**dict(__import__("os").environ), "PROGRESS": str(progress), "GO_ON": str(go_on)}
    first = subprocess.Popen([sys.executable, "-m", "dvc", "exp", "run", "-n", "first"],
                             cwd=project, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    while first.poll() is None and "2" not in (progress.read_text().split()
                                               if progress.exists() else []):
        time.sleep(0.05)
    second = run(["dvc", "exp", "run", "-S", "lr=0.2", "-n", "second"], project, check=False)
    go_on.write_text("")
    out, _ = first.communicate(timeout=300)
    assert second.returncode != 0
    assert "is busy" in second.stdout + second.stderr, second.stdout + second.stderr
    assert first.returncode == 0, out[-3000:]
    for step in range(1, 5):
        sha = run(["git", "rev-parse", f"refs/exps/{'/'.join(_base(project))}/first-step{step}"],
                  project).stdout.strip()
        params = run(["git", "show", f"{sha}:params.yaml"], project).stdout
        lock = run(["git", "show", f"{sha}:dvc.lock"], project).stdout
        assert "lr: 0.1" in params and "lr: 0.2" not in params, (step, params)
        assert "lr: 0.1" in lock and "lr: 0.2" not in lock, (step, lock)


def _base(project: Path) -> tuple[str, str]:
    head = run(["git", "rev-parse", "HEAD"], project).stdout.strip()
    return head[:2], head[2:]


def test_template_trains_again_when_params_change_after_the_end(tmp_path):
    """A finished template run rerun with `-S train.lr=0.05` trains a new run
    from step 0: no row records the new lr beside the old run's metrics."""
    import numpy as np

    project = template_project(tmp_path, classes=3)
    first = run(["dvc", "exp", "run", "-n", "a"], project)
    assert "starting: 20 steps, 3 classes" in first.stdout + first.stderr
    w_a = np.load(project / "model" / "weights.npy")
    assert w_a.shape == (256, 3)  # the class count comes from the data
    again = run(["dvc", "exp", "run", "-n", "b", "-S", "train.lr=0.05"], project)
    said = again.stdout + again.stderr
    assert "starting a new run from step 0" in said and "lr: 0.1 -> 0.05" in said
    assert "step 10/20" in said and "step 20/20" in said  # it trained every step again
    assert not np.array_equal(np.load(project / "model" / "weights.npy"), w_a)
    assert "changed since row" not in said  # no dependency changed
    # the training code changed too: trained on, and said (it was not)
    with open(project / "train.py", "a") as script:
        script.write("# an edit between two runs\n")
    same = run(["dvc", "exp", "run", "-n", "c", "-S", "train.steps=30"], project)
    said = same.stdout + same.stderr
    assert "resuming at step 20" in said and "step 30/30" in said  # more steps: trains on
    assert "step 10/30" not in said
    assert ("dvc-dali: train.py changed since row b-step20 (step 20), the checkpoint this run "
            "started from: the rows it records are trained with the changed files, so they are "
            "a run of their own, named by this `dvc exp run`") in said, said
    names = {ref.rsplit("/", 1)[-1] for _, ref in exp_refs(project)}
    assert "c-step30" in names and "b-step30" not in names, names  # branched, as DVC 2 did


@pytest.mark.parametrize("committed", [False, True])
def test_bare_make_checkpoint_resumed_with_changed_code_branches_off(tmp_path, committed):
    """Killed, its script edited, resumed: the rows after the kill are
    trained by the new script, so they are a run of their own, as DVC 2.58
    made a new experiment of them (measured); the run went on under the old
    name without a word. The edit committed too (a sweep: the row was looked
    for on the new commit only, so nothing was said)."""
    project = bare_project(tmp_path, RESUMABLE.replace("    outs:",
                                                       "    deps: [train.py]\n    outs:"))
    killed = run(["dvc", "exp", "run", "-n", "port"], project, check=False, env={"KILL_AT": "2"})
    assert killed.returncode != 0
    with open(project / "train.py", "a") as script:
        script.write("# an edit between two runs\n")
    if committed:
        run(["git", "commit", "-qm", "edit", "train.py"], project)
    resumed = run(["dvc", "exp", "run", "-n", "edited"], project)
    said = resumed.stdout + resumed.stderr
    assert "train.py changed since row port-step2 (step 2), the checkpoint this run started " \
           "from" in said, said
    assert (project / "checkpoint" / "state.txt").read_text() == "4"
    names = {ref.rsplit("/", 1)[-1] for _, ref in exp_refs(project)}
    assert {"port-step1", "port-step2", "edited-step3", "edited-step4"} <= names, names
    assert "port-step3" not in names, names


def test_a_checkpointer_under_dvc_exp_run_needs_total_steps(tmp_path):
    project = template_project(tmp_path)
    train = project / "train.py"
    train.write_text(train.read_text().replace(', params=p, total_steps=p["steps"])', ")"))
    run(["git", "commit", "-qam", "no total_steps"], project)
    proc = run(["dvc", "exp", "run", "-n", "x"], project, check=False)
    assert proc.returncode != 0
    assert "pass total_steps=" in proc.stdout + proc.stderr
    assert exp_refs(project) == []


def test_params_default_to_the_stages_params(tmp_path):
    """A script that passes no params=: the stage's `params:` (as DVC resolves
    them, train.lr...) are the run's, so -S after the end still starts anew,
    and raising train.steps trains further."""
    project = template_project(tmp_path)
    train = project / "train.py"
    train.write_text(train.read_text().replace("params=p, ", ""))
    run(["git", "commit", "-qam", "stage params"], project)
    run(["dvc", "exp", "run", "-n", "a"], project)
    again = run(["dvc", "exp", "run", "-n", "b", "-S", "train.seed=1"], project)
    said = again.stdout + again.stderr
    assert "starting a new run from step 0" in said and "train.seed: 0 -> 1" in said
    more = run(["dvc", "exp", "run", "-n", "c", "-S", "train.steps=30"], project)
    said = more.stdout + more.stderr
    assert "resuming at step 20" in said and "train.steps: 20 -> 30" in said
    from dvc_dali.reading.exp_refs import list_rows

    rows = {r["name"]: r for r in list_rows(str(project))}
    assert rows["b-step10"]["parent"] is None  # a new run from step 0 has no parent row
    # the step count raised is the same run trained further, under its name
    assert rows["b-step30"]["parent"] == rows["b-step20"]["sha"]
    assert "c-step30" not in rows


def _model_of(project: Path, row: str) -> str:
    """md5 of the row's model output, from `dvc exp show`."""
    data = json.loads(run(["dvc", "exp", "show", "--json", "-A"], project).stdout)
    for base in data:
        for exp in base.get("experiments") or []:
            for rev in exp.get("revs") or []:
                if (rev.get("name") or exp.get("name")) == row:
                    return rev["data"]["outs"]["model"]["hash"]
    raise AssertionError(f"no row {row}")


@pytest.mark.parametrize("how", ["temp", "queue"])
def test_temp_and_queued_runs_resume_an_applied_row(tmp_path, how):
    """`dvc exp apply <row>` then `dvc exp run --temp` (or --queue and the
    queue run) resumes that row, as the same in the workspace does, instead
    of silently starting at step 0."""
    project = template_project(tmp_path)
    run(["dvc", "exp", "run", "-n", "a"], project)
    run(["dvc", "exp", "apply", "a-step10"], project)
    run(["dvc", "exp", "run", "-n", "ws", "-S", "train.lr=0.05"], project)
    run(["dvc", "exp", "apply", "a-step10"], project)
    if how == "temp":
        out = run(["dvc", "exp", "run", "--temp", "-n", "tmp", "-S", "train.lr=0.05"], project)
    else:
        run(["dvc", "exp", "run", "--queue", "-n", "tmp", "-S", "train.lr=0.05"], project)
        out = run(["dvc", "exp", "run", "--run-all", "-j", "1"], project)
        out.stdout += run(["dvc", "queue", "logs", "tmp"], project).stdout
    said = out.stdout + out.stderr
    assert "resuming at step 10" in said, said
    assert "step 10/20" not in said  # nothing trained twice
    assert _model_of(project, "tmp-step20") == _model_of(project, "ws-step20")
    from dvc_dali.reading.exp_refs import list_rows

    rows = {r["name"]: r for r in list_rows(str(project))}
    assert rows["tmp-step20"]["parent"] == rows["a-step10"]["sha"]


def test_a_bare_make_checkpoint_run_then_an_entry_a_killed_run_left_stashed(tmp_path):
    """The workspace lock a bare make_checkpoint() run holds ends with DVC's
    final commit of the run: the experiment a killed `dvc exp run` left
    stashed runs after it (DVC waited 3 minutes on the lock and failed), and
    continues it with its own params."""
    project = bare_project(tmp_path, RESUMABLE)
    (project / "params.yaml").write_text("steps: 2\n")
    run(["git", "commit", "-qam", "2 steps"], project)
    leave_stashed_entry(project, "left", "steps=3")
    done = run(["dvc", "exp", "run", "-n", "first"], project, check=False)
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "is busy" not in said, said[-3000:]
    assert "Ran experiment(s): first, left" in said, said[-3000:]
    assert (project / "checkpoint" / "state.txt").read_text() == "3"
    refs = dict((ref.rsplit("/", 1)[-1], sha) for sha, ref in exp_refs(project))
    third = [name for name in refs if name.endswith("-step3")]
    assert {"first", "first-step1", "first-step2", "left"} <= set(refs) and len(third) == 1, refs
    for name, steps in (("first-step2", 2), (third[0], 3), ("left", 3)):
        shown = run(["git", "show", f"{refs[name]}:params.yaml"], project).stdout
        assert shown == f"steps: {steps}\n", (name, shown)
    assert run(["git", "for-each-ref", "refs/exps/stash"], project).stdout == ""


def test_reset_starts_a_bare_make_checkpoint_port_over(tmp_path):
    """`dvc-dali reset` is the way to start over for ports with a bare
    make_checkpoint() too (their output holds no dvc-dali LATEST file);
    deleting the directory would not do: DVC checks it out again."""
    import sys

    project = bare_project(tmp_path, RESUMABLE)
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={"KILL_AT": "2"})
    reset = run([sys.executable, "-m", "dvc_dali.cli", "reset"], project)
    assert "removed checkpoint" in reset.stdout and "dvc.lock:train" in reset.stdout
    run(["dvc", "exp", "run", "-n", "b"], project)
    names = {r.rsplit("/", 1)[-1] for _, r in exp_refs(project)}
    assert {"b-step1", "b-step2", "b-step3", "b-step4"} <= names, names


def test_exp_show_lists_fast_rows_in_step_order(tmp_path):
    """Rows recorded within one second (a bare make_checkpoint() per step) are
    listed by `dvc exp show` newest step first, as the steps went."""
    project = bare_project(tmp_path, RESUMABLE)
    (project / "params.yaml").write_text("steps: 8\n")
    run(["git", "commit", "-qam", "8 steps"], project)
    run(["dvc", "exp", "run", "-n", "fast"], project)
    data = json.loads(run(["dvc", "exp", "show", "--json"], project).stdout)
    names = [rev["name"] for base in data for exp in base.get("experiments") or []
             for rev in exp["revs"] if "-step" in (rev.get("name") or "")]
    assert names == [f"fast-step{s}" for s in range(8, 0, -1)], names


TYPES_TRAIN = textwrap.dedent("""\
    import collections, json, os, sys
    import numpy as np
    import dvc_dali

    ck = dvc_dali.Checkpointer("checkpoint", total_steps=2)
    value = {"scalar": np.float64(1.5), "i": np.int32(7), "zero_d": np.array(2.5),
             "od": collections.OrderedDict([("b", np.ones(2)), ("a", 1)]),
             "nested": [collections.OrderedDict(z=np.float32(3)), (1, "x")]}
    if ck.resumed:
        back = ck.arrays["v"]
        seen = {k: type(v).__name__ for k, v in back.items()}
        seen["od_keys"] = list(back["od"])
        seen["nested0"] = type(back["nested"][0]).__name__
        seen["nested0z"] = type(back["nested"][0]["z"]).__name__
        seen["nested1"] = type(back["nested"][1]).__name__
        json.dump(seen, open(os.environ["SEEN"], "w"))
    for step in range(ck.step + 1, 3):
        ck.make_checkpoint(step, arrays={"v": value})
        if step == 1 and os.environ.get("STOP"):
            os._exit(9)
    """)


def test_values_come_back_as_they_went_in(tmp_path):
    """A NumPy scalar comes back a scalar (not a 0-d array), an OrderedDict
    an OrderedDict, through a real kill and resume under `dvc exp run`."""
    project = bare_project(tmp_path, RESUMABLE)
    (project / "train.py").write_text(TYPES_TRAIN)
    run(["git", "commit", "-qam", "types"], project)
    seen = tmp_path / "seen.json"
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={"STOP": "1"})
    run(["dvc", "exp", "run", "-n", "b"], project, env={"SEEN": str(seen)})
    assert json.loads(seen.read_text()) == {
        "scalar": "float64", "i": "int32", "zero_d": "ndarray", "od": "OrderedDict",
        "nested": "list", "od_keys": ["b", "a"], "nested0": "OrderedDict",
        "nested0z": "float32", "nested1": "tuple"}


@pytest.mark.parametrize("value,what", [
    (__import__("collections").namedtuple("Point", "x y")(1, 2), "Point"),
    (__import__("collections").defaultdict(list), "defaultdict"),
    (type("MyList", (list,), {})([1]), "MyList"),
])
def test_values_that_would_come_back_changed_are_refused_at_save(tmp_path, value, what):
    import dvc_dali

    ck = dvc_dali.Checkpointer(tmp_path / "c")
    with pytest.raises(TypeError, match=f"a {what} .*would come back as a plain"):
        ck.save(1, arrays={"v": {"inner": value}})
    assert not (tmp_path / "c" / "LATEST").exists()


def test_a_resume_that_would_train_nothing_starts_a_new_run(tmp_path):
    """A run killed after its checkpoint at step 10 of 20, rerun with `-S
    train.steps=10`: resuming would train nothing while DVC's experiment
    recorded train.steps=10 beside it (it did, with exit 0), so a new run
    of 10 steps trains from step 0, and its model is a fresh 10-step run's."""
    import numpy as np

    project = _killable_template(tmp_path)
    killed = run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={"KILL_AT": "15"})
    assert killed.returncode != 0
    again = run(["dvc", "exp", "run", "-n", "b", "-S", "train.steps=10"], project)
    said = again.stdout + again.stderr
    assert "holds step 10 of an unfinished run of 20 steps" in said, said
    assert "starting a new run from step 0" in said and "step 10/10" in said
    trained = np.load(project / "model" / "weights.npy")
    run(["dvc-dali", "reset"], project)
    run(["dvc", "exp", "run", "-n", "c", "-S", "train.steps=10"], project)
    assert np.array_equal(np.load(project / "model" / "weights.npy"), trained)


def _killable_template(tmp_path: Path) -> Path:
    """The template whose train.py kills itself after step KILL_AT."""
    project = template_project(tmp_path)
    train = project / "train.py"
    train.write_text(train.read_text().replace(
        "save_model(w)\nlive.end()",
        "    if step == int(os.environ.get(\"KILL_AT\", \"0\")):\n"
        "        ck.wait(); os.kill(os.getpid(), 9)\n"
        "save_model(w)\nlive.end()"))
    run(["git", "commit", "-qam", "kill at"], project)
    return project


@pytest.mark.parametrize("how", ["temp", "queue"])
def test_temp_and_queued_resumes_keep_the_metrics_history(tmp_path, how):
    """A run killed after its checkpoint at step 10, resumed by `dvc exp run
    --temp` (or queued): its rows hold DVCLive's history from step 10 on, as
    a workspace resume's do (they held step 20's alone: DVC carries neither
    the checkpoint nor DVCLive's persisted files into those runs)."""
    project = _killable_template(tmp_path)
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={"KILL_AT": "15"})
    if how == "temp":
        run(["dvc", "exp", "run", "--temp"], project)
    else:
        run(["dvc", "exp", "run", "--queue"], project)
        run(["dvc", "exp", "run", "--run-all", "-j", "1"], project)
    from dvc_dali.reading.exp_refs import list_rows

    rows = list_rows(str(project))
    ten = next(r["sha"] for r in rows if r["name"] == "a-step10")
    resumed = [r for r in rows if r["step"] == 20 and r["parent"] == ten]
    assert len(resumed) == 1, rows  # it resumed the checkpoint at step 10
    loss = run(["git", "show", f"{resumed[0]['sha']}:dvclive/plots/metrics/train/loss.tsv"],
               project).stdout
    assert [line.split("\t")[0] for line in loss.splitlines()[1:]] == ["10", "20"], loss
    summary = json.loads(run(["git", "show", f"{resumed[0]['sha']}:dvclive/metrics.json"],
                             project).stdout)
    assert summary["step"] == 20, summary


def test_reset_after_the_checkpoint_was_deleted_by_hand_starts_over(tmp_path):
    """`rm -rf checkpoint` then `dvc-dali reset` (an output not declared
    `checkpoint: true`): dvc.lock's entry still named it, so reset said
    "nothing to do" and the next `dvc exp run` checked it out and resumed."""
    import shutil

    project = template_project(tmp_path)
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text("\n".join(line for line in dvc_yaml.read_text().splitlines()
                                  if "checkpoint: true" not in line) + "\n")
    run(["git", "commit", "-qam", "undeclared"], project)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.steps=10"], project)
    shutil.rmtree(project / "checkpoint")
    reset = run([sys.executable, "-m", "dvc_dali.cli", "reset"], project)
    assert "removed dvc.lock:train" in reset.stdout, reset.stdout
    again = run(["dvc", "exp", "run", "-n", "b", "-S", "train.steps=10"], project)
    assert "starting: 10 steps" in again.stdout + again.stderr


def test_a_run_named_as_a_recorded_row_is_refused_even_with_force(tmp_path):
    """`dvc exp run -f -n x-step10`: DVC replaced the row x-step10 with the
    new run's experiment when it ended (it refuses the name only without -f)."""
    project = template_project(tmp_path)
    run(["dvc", "exp", "run", "-n", "x", "-S", "train.steps=10"], project)
    row = dict(exp_refs(project))
    run([sys.executable, "-m", "dvc_dali.cli", "reset"], project)
    forced = run(["dvc", "exp", "run", "-f", "-n", "x-step10", "-S", "train.steps=10"],
                 project, check=False)
    said = forced.stdout + forced.stderr
    assert forced.returncode != 0 and "Traceback" not in said, said
    assert "DVC_EXP_NAME='x-step10' (`dvc exp run -n x-step10`) is the name of a recorded row" \
        in said, said
    assert dict(exp_refs(project)) == row  # the row as it was


def test_a_checkpoint_path_that_is_not_the_stages_output_names_the_output(tmp_path):
    """Checkpointer("elsewhere") in a stage whose checkpoint output is
    `checkpoint`: the refusal told to run `dvc-dali migrate`, which has
    nothing to do there."""
    project = template_project(tmp_path)
    train = project / "train.py"
    train.write_text(train.read_text().replace('Checkpointer("checkpoint"',
                                               'Checkpointer("elsewhere"'))
    run(["git", "commit", "-qam", "another path"], project)
    proc = run(["dvc", "exp", "run", "-n", "x"], project, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in said, said
    assert "'elsewhere' is not one of its outputs" in said, said
    assert "Pass its checkpoint output (checkpoint) as the checkpoint path" in said, said
    assert "migrate" not in said, said


def test_a_checkpoint_before_the_metrics_exist_says_to_log_them_first(tmp_path):
    """The declared DVCLive files not written yet at make_checkpoint(): the
    refusal told to write the checkpoint first, which was written."""
    project = template_project(tmp_path)
    (project / "train.py").write_text(textwrap.dedent("""\
        import os, numpy as np, dvc_dali
        os.makedirs("model", exist_ok=True)
        np.save("model/weights.npy", np.ones(2))
        ck = dvc_dali.Checkpointer("checkpoint", params={"a": 1}, total_steps=10)
        ck.make_checkpoint(10, arrays={"w": np.ones(2)})
        """))
    run(["git", "commit", "-qam", "no metrics"], project)
    proc = run(["dvc", "exp", "run", "-n", "x"], project, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in said, said
    assert "dvclive/metrics.json" in said and "log them to DVCLive first" in said, said
    assert "write the checkpoint (e.g." not in said, said


RESTARTING_TRAIN = textwrap.dedent("""\
    import os, yaml
    from dvc_dali import make_checkpoint

    p = yaml.safe_load(open("params.yaml"))
    os.makedirs("checkpoint", exist_ok=True)
    state = "checkpoint/state.txt"
    saved = open(state).read().split() if os.path.exists(state) else ["0", str(p["lr"])]
    start = int(saved[0]) if saved[1] == str(p["lr"]) else 0  # other params: a new run
    for step in range(start + 1, p["steps"] + 1):
        open(state, "w").write(f"{step} {p['lr']}")
        make_checkpoint(step)
    """)


@pytest.mark.parametrize("cmd,how", [
    ("python train.py", "workspace"), ("python train.py", "temp"),
    ("python train.py", "queue"),
    (f"{sys.executable} -m dvc_dali.cli run -- python train.py", "workspace"),
    (f"{sys.executable} -m dvc_dali.cli run -- python train.py", "temp")],
    ids=["make_checkpoint", "make_checkpoint-temp", "make_checkpoint-queue", "dvc-dali-run",
         "dvc-dali-run-temp"])
def test_a_bare_script_restarted_under_its_name_leaves_the_finished_runs_rows(tmp_path, cmd,
                                                                              how):
    """As the Checkpointer's case above, for a script that decides itself
    to start over (a bare make_checkpoint(), alone or under `dvc-dali run`):
    DVC_DALI_KEEP_LAST=1 deleted the finished run's rows (found by a sweep).
    Its rows are told from the finished run's by their lineage lines' start,
    taken at its first row: a run of its own (other params) begins there."""
    stage = RESUMABLE.replace("params: [steps]", "params: [steps, lr]").replace(
        "python train.py", cmd)
    project = make_project(tmp_path / "p", files={
        "train.py": RESTARTING_TRAIN, "dvc.yaml": stage, "params.yaml": "steps: 2\nlr: 0.1\n"})
    run(["dvc", "exp", "run", "-n", "a"], project)
    before, after, text = restart_keeping_one(project, how, "-S", "lr=0.2")
    assert len(before) == 2, before
    assert before.items() <= after.items(), (before, after, text)
    assert len(after) == 3, (after, text)  # and the new run's last row alone


def test_a_bare_script_that_starts_over_under_the_same_params_leaves_the_finished_rows(
        tmp_path):
    """`dvc exp run -n a -f`, params unchanged, after run a finished, by a
    script that ignores its state and names step 1 again: its rows hung
    after a's last as a's run continued, and DVC_DALI_KEEP_LAST=1 deleted
    a's rows (found by a sweep). A first row whose step is not after the
    row it follows begins a run of its own."""
    train = RESTARTING_TRAIN.replace("start = int(saved[0]) if", "start = 0 if False and")
    stage = RESUMABLE.replace("params: [steps]", "params: [steps, lr]")
    project = make_project(tmp_path / "p", files={
        "train.py": train, "dvc.yaml": stage, "params.yaml": "steps: 2\nlr: 0.1\n"})
    run(["dvc", "exp", "run", "-n", "a"], project)
    before, after, text = restart_keeping_one(project, "workspace")
    assert len(before) == 2, before
    assert before.items() <= after.items(), (before, after, text)
    assert len(after) == 3, (after, text)  # and the new run's last row alone


# A DVC 2 script as DVC 2 ran it: its own state file, which says no step to
# anyone but itself, and DVC 2's signal (dvc.api.make_checkpoint) by hand.
# START_OVER=1: it ignores its state (trains from scratch); KILL_AT: killed
# right after that step's checkpoint. It checkpoints at the top of its loop,
# so a resumed run checkpoints the step it resumed first, unchanged.
TOP_OF_LOOP_TRAIN = textwrap.dedent("""\
    import os, random, time, yaml
    {import_line}
    def dvc2_make_checkpoint(step):
        if os.getenv("DVC_CHECKPOINT") is None:
            return
        signal = os.path.join(os.environ["DVC_ROOT"], ".dvc", "tmp", "DVC_CHECKPOINT")
        open(signal, "w").close()
        while os.path.exists(signal):
            time.sleep(0.05)

    p = yaml.safe_load(open("params.yaml"))
    os.makedirs("checkpoint", exist_ok=True)
    state = "checkpoint/state.txt"
    if os.environ.get("START_OVER") or not os.path.exists(state):
        step, w = 0, random.random()  # a fresh model: unseeded, as most are
    else:
        saved = open(state).read().split()
        step, w = int(saved[0]), float(saved[1])
    while step <= p["steps"]:
        open(state, "w").write(f"{{step}} {{w!r}}")
        if step and step % p["every"] == 0:
            {checkpoint}(step)
            if os.environ.get("KILL_AT") == str(step):
                os._exit(9)
        step, w = step + 1, w + 1.0
    """)


def top_of_loop_project(tmp_path: Path, how: str, params: str) -> Path:
    """``how``: "dvc-dali-run" (DVC 2's signal by hand, under `dvc-dali run`:
    no step reaches the recorder) or "make_checkpoint" (dvc_dali's, with the step)."""
    stage = RESUMABLE.replace("params: [steps]", "params: [steps, every]")
    if how == "dvc-dali-run":
        stage = stage.replace("python train.py",
                              f"{sys.executable} -m dvc_dali.cli run -- python train.py")
        train = TOP_OF_LOOP_TRAIN.format(import_line="", checkpoint="dvc2_make_checkpoint")
    else:
        train = TOP_OF_LOOP_TRAIN.format(import_line="from dvc_dali import make_checkpoint",
                                         checkpoint="make_checkpoint")
    return make_project(tmp_path / "p", files={
        "train.py": train, "dvc.yaml": stage, "params.yaml": params})


@pytest.mark.parametrize("how", ["workspace", "temp", "queue"])
def test_a_script_whose_checkpoint_says_no_step_leaves_the_finished_runs_rows(tmp_path, how):
    """`dvc-dali run` over a DVC 2 script (a plain state file, DVC 2's signal
    file): no step reaches the recorder, so `dvc exp run -n a -f` of a script
    that starts over with the same params hung its rows after a's last as a
    continued, and DVC_DALI_KEEP_LAST=1 deleted a's rows (found by a sweep).
    Whether such a script resumed or started over cannot be told: its rows
    follow a's (numbered on, as DVC 2 chained them), but retention counts only
    the rows of this process's own start."""
    project = top_of_loop_project(tmp_path, "dvc-dali-run", "steps: 2\nevery: 1\n")
    run(["dvc", "exp", "run", "-n", "a"], project)
    before, after, text = restart_keeping_one(project, how, env={"START_OVER": "1"})
    assert len(before) == 2, before
    assert before.items() <= after.items(), (before, after, text)
    assert len(after) == 3, (after, text)  # and the new run's last row alone
    assert "whether this run resumed row a-step2 (step 2) or started over cannot" in text, text


@pytest.mark.parametrize("how", ["workspace", "temp", "queue"])
def test_a_one_row_run_started_over_at_its_step_leaves_the_finished_runs_row(tmp_path, how):
    """Run a checkpoints once (steps == every); `dvc exp run -n a -f`, params
    unchanged, of a script that starts over names that step again: read as
    a resumed loop checkpointing its step at the top, it continued a, and
    DVC_DALI_KEEP_LAST=1 deleted a's one row (found by a sweep). A row at the
    step it follows continues it only holding that row's checkpoint."""
    project = top_of_loop_project(tmp_path, "make_checkpoint", "steps: 2\nevery: 2\n")
    run(["dvc", "exp", "run", "-n", "a"], project)
    before, after, text = restart_keeping_one(project, how, env={"START_OVER": "1"})
    assert len(before) == 1, before
    assert before.items() <= after.items(), (before, after, text)
    assert len(after) == 2, (after, text)
    assert "step 2 holds another checkpoint than row a-step2 (step 2)" in text, text


def test_a_resumed_loop_that_checkpoints_its_step_at_the_top_continues_its_run(tmp_path):
    """A script resumed at step 1 checkpoints step 1 again, unchanged, at the
    top of its loop: its rows are run a's, whatever this `dvc exp run` is named,
    and DVC_DALI_KEEP_LAST=1 keeps a's last row alone."""
    project = top_of_loop_project(tmp_path, "make_checkpoint", "steps: 2\nevery: 1\n")
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={"KILL_AT": "1"})
    run(["dvc", "exp", "run", "-n", "b"], project, env={"DVC_DALI_KEEP_LAST": "1"})
    names = {ref.rsplit("/", 1)[1] for _, ref in exp_refs(project) if "-step" in ref}
    assert names == {"a-step2"}, names
