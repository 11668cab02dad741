"""The example job end to end under real `dvc exp run` in temporary git repos."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

import dvc_dali

from tests.helpers.dvc_project import REPO, model_sha, run, uninterrupted_run
from tests.helpers.rows import exp_rows, row_refs

KILL = "DVC_DALI_EXAMPLE_KILL_AT_STEP"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    """The final model of one uninterrupted `dvc exp run`."""
    return uninterrupted_run(tmp_path_factory.mktemp("ref"))[0]


def test_sigkill_then_rerun_is_bit_identical(project, uninterrupted):
    killed = run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={KILL: "20"})
    assert killed.returncode != 0
    rows = exp_rows(project)
    assert rows["a-step10"]["step"] == 10 and rows["a-step20"]["step"] == 20
    assert "a-step30" not in rows
    # What a kill inside git's ref write leaves (write <ref>.lock, rename it to
    # <ref>): a20's commit named only by its lock; and an empty lock where the
    # next row goes, from a kill just after the lock was made.
    ref20, sha20 = row_refs(project)["a-step20"]
    run(["git", "update-ref", "-d", ref20], project)
    (project / ".git" / f"{ref20}.lock").write_text(sha20 + "\n")
    (project / ".git" / f"{ref20[:-2]}30.lock").write_text("")
    doctor = run([sys.executable, "-m", "dvc_dali.cli", "doctor"], project)
    assert "a-step20.lock: a row a killed run recorded but did not publish" in doctor.stdout
    assert "a-step30.lock: a lock left by a killed run without a row" in doctor.stdout
    again = run(["dvc", "exp", "run", "-n", "b"], project, env={KILL: "40"}, check=False)
    assert "resuming from step 20" in again.stdout
    assert f"row a-step20 completed: a killed run had recorded it ({sha20[:7]})" in again.stderr
    assert row_refs(project)["a-step20"] == (ref20, sha20)
    assert "a-step30" in row_refs(project)  # recorded where the empty lock was
    final = run(["dvc", "exp", "run", "-n", "c"], project)
    assert "resuming from step 40" in final.stdout
    assert model_sha(project) == uninterrupted
    rows = exp_rows(project)
    # the resumed run keeps its name and numbering (DVC 2 did), whatever -n says
    assert {rows[f"a-step{s}"]["step"] for s in (30, 40, 50, 60)} == {30, 40, 50, 60}
    assert not [r for r in rows if r.startswith(("b-step", "c-step"))]


def test_apply_older_row_then_rerun_resumes_there(project, uninterrupted):
    """Nothing changed: refused, as DVC 2 did (the run's later rows hold that
    training); on purpose (DVC_DALI_RETRAIN=1) it resumes there, exactly."""
    run(["dvc", "exp", "run", "-n", "full"], project)
    run(["dvc", "exp", "apply", "full-step30"], project)
    refused = run(["dvc", "exp", "run", "-n", "again"], project, check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "Nothing to do for an unchanged checkpoint" in said, said
    assert "full-step40, full-step50, full-step60 already hold that training" in said
    assert "Traceback" not in said
    out = run(["dvc", "exp", "run", "-n", "again"], project, env={"DVC_DALI_RETRAIN": "1"})
    assert "resuming from step 30" in out.stdout
    assert model_sha(project) == uninterrupted
    branch = run(["dvc", "exp", "apply", "full-step30"], project)
    assert branch.returncode == 0
    changed = run(["dvc", "exp", "run", "-n", "branch", "-S", "train.lr=0.05"], project)
    assert "resuming from step 30" in changed.stdout  # a change branches off: allowed


def test_pipeline_param_change_on_unfinished_run_is_refused(project):
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={KILL: "20"})
    refused = run(["dvc", "exp", "run", "-S", "train.batch_size=16"], project, check=False)
    assert refused.returncode != 0
    err = refused.stderr + refused.stdout
    assert "PipelineMismatchError" in err and "batch_size: 32 -> 16" in err
    assert "dvc-dali reset" in err
    # Nothing lost: with the old value it resumes.
    ok = run(["dvc", "exp", "run", "-S", "train.batch_size=32"], project)
    assert "resuming from step 20" in ok.stdout


def test_learning_rate_may_change_on_resume(project):
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={KILL: "20"})
    out = run(["dvc", "exp", "run", "-S", "train.lr=0.05"], project)
    assert "resuming from step 20" in out.stdout
    assert "lr: 0.1 -> 0.05" in out.stderr


def test_finished_run_continues_for_more_steps_or_starts_new(project, uninterrupted):
    run(["dvc", "exp", "run", "-n", "done"], project)
    done_model = model_sha(project)
    before = set(exp_rows(project))
    same = run(["dvc", "exp", "run", "-n", "same"], project, check=False)
    # nothing changed: refused, naming what to change, and no experiment added
    assert same.returncode != 0 and "step     " not in same.stdout
    said = same.stdout + same.stderr
    assert "finished run (step 60 of 60) and nothing changed" in said and "Traceback" not in said
    assert "-S train.steps=<more than 60>" in said and "dvc-dali reset" in said
    assert set(exp_rows(project)) == before
    # DVC deleted the stage's other outputs before the refused run, as before any
    # stage; nothing is lost: `dvc checkout` brings them back from dvc.lock
    run(["dvc", "checkout"], project)
    assert model_sha(project) == done_model == uninterrupted
    more = run(["dvc", "exp", "run", "-n", "more", "-S", "train.steps=80"], project)
    assert "resuming from step 60" in more.stdout
    assert exp_rows(project)["done-step80"]["step"] == 80  # the run goes on, named as it was
    new = run(["dvc", "exp", "run", "-n", "new", "-S", "train.steps=60",
               "-S", "train.batch_size=16"], project)
    assert "finished run" in new.stderr and "train: starting on " in new.stdout  # cpu or gpu


def test_stage_without_persist_is_refused_before_training(project):
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace(
        "          persist: true      # DVC 3 deletes",
        "          persist: false     # DVC 3 deletes"))
    run(["git", "commit", "-qam", "break it"], project)
    out = run(["dvc", "exp", "run"], project, check=False)
    assert out.returncode != 0
    err = out.stderr + out.stdout
    assert "dvc.yaml: stage 'train' cannot resume" in err and "persist: true" in err
    assert "step     10" not in out.stdout


def test_hardlink_cache_links_snapshot_files_and_resumes(project, uninterrupted):
    """cache.type hardlink: the checkpoint files are linked into the cache,
    not copied (same inode), and a killed run still resumes bit for bit."""
    run(["dvc", "config", "cache.type", "hardlink"], project)
    killed = run(["dvc", "exp", "run", "-n", "h"], project, check=False, env={KILL: "20"})
    assert killed.returncode != 0 and exp_rows(project)["h-step20"]["step"] == 20
    files = [f for f in (project / "checkpoint").rglob("*") if f.is_file()]
    assert len(files) >= 4  # LATEST, manifest, pipeline state, arrays
    for f in files:
        md5 = hashlib.md5(f.read_bytes()).hexdigest()
        cached = project / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]
        # linked; or the same bytes were cached from an earlier snapshot (the global
        # generators' state, which the NumPy loop leaves unchanged), and DVC keeps
        # that object (3.54 does not link the new file to it)
        assert (cached.stat().st_ino == f.stat().st_ino
                or cached.stat().st_mtime_ns < f.stat().st_mtime_ns), f
    final = run(["dvc", "exp", "run", "-n", "h2"], project)
    assert "resuming from step 20" in final.stdout
    assert model_sha(project) == uninterrupted


def eval_metrics(project: Path) -> dict[tuple[str, str], dict]:
    """{(baseline sha, DVC experiment name): its eval/metrics.json} from `dvc
    exp show --json` (rows hold none: evaluate runs after training)."""
    found = {}
    for node in json.loads(run(["dvc", "exp", "show", "--json", "-A"], project).stdout):
        for exp in node.get("experiments") or []:
            for rev in exp.get("revs") or []:
                data = ((rev.get("data") or {}).get("metrics") or {}).get("eval/metrics.json")
                if data and data.get("data"):
                    found[(node["rev"], rev["name"])] = data["data"]
    return found


def test_evaluate_scores_the_best_row_of_its_own_run(project):
    """Issue 28: each DVC experiment's `eval` is its own run's best row, also
    for a run name used again on another commit (other params) and a --temp
    run. The metric's best is the earliest row (`:min`), so scoring the
    latest checkpoint instead would show too."""
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("--metric train/acc:max",
                                                     "--metric train/acc:min"))
    run(["git", "commit", "-qam", "C1"], project)
    lean = ["-S", "train.steps=20"]  # rows at 10 and 20
    said = run(["dvc", "exp", "run", "-n", "same", *lean], project).stderr
    run(["git", "commit", "-q", "--allow-empty", "-m", "C2"], project)
    said += run(["dvc", "exp", "run", "-n", "same", *lean, "-S", "train.lr=0.05"],
                project).stderr
    said += run(["dvc", "exp", "run", "--temp", "-n", "tmp", *lean, "-S", "train.lr=0.2"],
                project).stderr
    assert "Traceback" not in said, said

    spec = importlib.util.spec_from_file_location("evaluate", REPO / "examples/evaluate.py")
    evaluate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evaluate)
    x, y = evaluate.images(project / "data" / "digits")
    scored, every = eval_metrics(project), dvc_dali.rows(repo=project)
    assert sorted(name for _, name in scored) == ["same", "same", "tmp"], scored
    for (baseline, name), got in scored.items():
        own = [r for r in every if r["exp"] == name and r["baseline"] == baseline]
        best = dvc_dali.best_row(own, "train/acc:min")
        assert best["step"] == 10, own
        state = dvc_dali.load(rev=best["ref"], repo=project)
        assert (state.row, state.ref, state.step) == (best["name"], best["ref"], 10)
        assert (got["row"], got["step"]) == (best["name"], best["step"])
        assert got["acc"] == evaluate.accuracy(evaluate.mlp_weights(state, best["ref"]), x, y)
    assert len({got["acc"] for got in scored.values()}) == 3  # three runs, three scores
    with pytest.raises(dvc_dali.ConfigError, match="2 rows match it .*pass the row"):
        dvc_dali.load(rev="same-step10", repo=project)
