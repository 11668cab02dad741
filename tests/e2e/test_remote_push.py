"""Rows pushed as they are recorded, whole runs pushed and pulled, resume on
a fresh clone (issue: preemption-proof training). Real `dvc exp run`, a
bare git repository as the git remote, a local directory as the DVC remote."""

from __future__ import annotations

import os
import signal
import time

import pytest

import dvc_dali

from tests.helpers.dvc_project import git_init, make_project, run, template_project
from tests.helpers.fuzz_harness import trainer_below
from tests.helpers.preempt import preemptible_project, start, trainer_ready, weights
from tests.helpers.remotes import missing_data, remote_rows, with_remotes
from tests.helpers.rows import cached_files, exp_refs, exp_rows, row_refs


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    project = template_project(tmp_path_factory.mktemp("ref"))
    run(["dvc", "exp", "run", "-n", "ref"], project)
    return weights(project)


def test_a_killed_run_leaves_complete_rows_on_the_remotes_and_resumes_on_a_new_clone(
        tmp_path, uninterrupted):
    project = preemptible_project(tmp_path)
    bare, store = with_remotes(project, tmp_path)
    proc = start(project, "-n", "a", "-S", "train.checkpoint_every=5", env={"PREEMPT_AT": "13"})
    trainer_ready(project, proc)
    while "a-step10" not in remote_rows(bare):  # pushed while training went on
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the machine goes away
    proc.communicate()
    on_remote = remote_rows(bare)
    assert set(on_remote) == {"a-step5", "a-step10"}, on_remote
    for name, sha in on_remote.items():
        assert missing_data(bare, store, sha) == [], name

    fresh = tmp_path / "fresh"
    run(["git", "clone", "-q", str(bare), str(fresh)], tmp_path)
    git_init(fresh)  # identity for the rows
    run(["dvc", "exp", "pull", "origin", "a-step10"], fresh)
    run(["dvc", "exp", "apply", "a-step10"], fresh)
    again = run(["dvc", "exp", "run", "-S", "train.checkpoint_every=5"], fresh)
    assert "resuming at step 10" in again.stdout + again.stderr
    assert weights(fresh) == uninterrupted
    # the run keeps its name and numbering on the new machine (DVC 2 did)
    assert {"a-step15", "a-step20"} <= set(exp_rows(fresh)), exp_rows(fresh)


def test_rows_a_killed_run_had_not_pushed_yet_go_with_the_resumed_runs(tmp_path):
    """The rows recorded while their push waited (here: the DVC remote
    broken) when the machine was killed: the resumed run pushes them before
    its own; it pushed only its own (found by a sweep)."""
    project = preemptible_project(tmp_path)
    bare, store = with_remotes(project, tmp_path)
    store.write_text("not a directory")  # every data push fails
    proc = start(project, "-n", "a", "-S", "train.checkpoint_every=5", env={"PREEMPT_AT": "13"})
    trainer_ready(project, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert {"a-step5", "a-step10"} <= set(exp_rows(project)) and remote_rows(bare) == {}
    store.unlink()
    out = run(["dvc", "exp", "run", "-S", "train.checkpoint_every=5"], project)
    text = out.stdout + out.stderr
    assert "a-step5, a-step10 of a recorded before this process, not on origin: pushed " \
        "first" in text, text
    on_remote = remote_rows(bare)
    assert set(on_remote) == {"a-step5", "a-step10", "a-step15", "a-step20"}, on_remote
    for name, sha in on_remote.items():
        assert missing_data(bare, store, sha) == [], name


def test_a_preempted_run_pushes_its_last_row_before_it_exits(tmp_path):
    project = preemptible_project(tmp_path)
    bare, store = with_remotes(project, tmp_path)
    proc = start(project, "-n", "a", "-S", "train.checkpoint_every=1000",
                 env={"PREEMPT_AT": "6"})
    trainer_ready(project, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    out = proc.communicate()[0]
    assert "step 6 is kept as row a-step6, pushed to origin; `dvc exp run` resumes" in out, out
    on_remote = remote_rows(bare)
    assert set(on_remote) == {"a-step6"} and missing_data(bare, store, on_remote["a-step6"]) \
        == [], out


def test_a_preempted_rows_push_holds_the_data_other_stages_made(tmp_path):
    """The example: its row's dvc.lock names the prepare stage's data too. The
    row said pushed has all of it on the DVC remote (DVC's own push at the
    end of a run, which a preempted run never reaches, hid the gap)."""
    project = make_project(tmp_path / "p", example=True, prepared=True)
    bare, store = with_remotes(project, tmp_path)
    proc = start(project, "-n", "a", "-S", "train.steps=100000")
    while "a-step10" not in remote_rows(bare):  # pushed while training goes on
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    trainer = trainer_below(proc.pid)
    trainer.send_signal(signal.SIGTERM)
    out = proc.communicate()[0]
    assert ", pushed to origin; `dvc exp run` resumes" in out, out[-3000:]
    on_remote = remote_rows(bare)
    assert len(on_remote) >= 2, on_remote
    for name, sha in on_remote.items():
        assert missing_data(bare, store, sha) == [], name


def test_a_remote_that_fails_never_stops_training_and_the_rows_push_later(tmp_path):
    project = template_project(tmp_path)
    bare, store = with_remotes(project, tmp_path)
    store.parent.joinpath("store").write_text("not a directory")  # every data push fails
    out = run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project)
    text = out.stdout + out.stderr
    assert "push of a-step5 to origin failed" in text, text
    assert "not pushed to origin: a-step5, a-step10, a-step15, a-step20; push them with " \
           "`dvc-dali push origin a`" in text, text
    assert {r for r in exp_rows(project) if "-step" in r} == {
        "a-step5", "a-step10", "a-step15", "a-step20"}  # nothing local lost
    assert remote_rows(bare) == {}  # no ref without its data
    store.unlink()
    pushed = run(["dvc-dali", "push", "origin", "a"], project)
    assert "pushed 4 rows of a to origin, with their data" in pushed.stdout, pushed.stdout
    on_remote = remote_rows(bare)
    assert len(on_remote) == 4
    for sha in on_remote.values():
        assert missing_data(bare, store, sha) == []


@pytest.mark.parametrize("breakage,says", [
    (["dvc", "config", "exp.git_remote", "nosuch"], "'nosuch' is not a valid Git remote"),
    (["git", "remote", "set-url", "origin", "/nonexistent/origin.git"],
     "'origin' is not a valid Git remote or URL"),
    (["dvc", "remote", "remove", "store"], "no remote specified")])
def test_a_misconfigured_remote_is_refused_before_the_first_step(tmp_path, breakage, says):
    project = template_project(tmp_path)
    with_remotes(project, tmp_path)
    run(breakage, project)
    run(["git", "commit", "-qam", "bad remote", "--allow-empty"], project)
    out = run(["dvc", "exp", "run", "-n", "a"], project, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "RecordError: experiment auto-push is on" in text and says in text, text
    assert "step 10" not in text and "Traceback" not in text, text
    assert not [r for r in exp_rows(project) if "-step" in r]


def test_a_remote_set_by_dvcs_variables_is_refused_naming_them(tmp_path):
    """DVC's variables win over the config, but the refusal sent people to
    `dvc config exp.git_remote` and `exp.auto_push false`, which change
    nothing (found by a sweep of the variables)."""
    project = template_project(tmp_path)
    with_remotes(project, tmp_path)
    out = run(["dvc", "exp", "run", "-n", "a"], project, check=False,
              env={"DVC_EXP_AUTO_PUSH": "yes", "DVC_EXP_GIT_REMOTE": "nosuch"})
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Traceback" not in text, text
    assert ("RecordError: experiment auto-push is on (DVC_EXP_AUTO_PUSH='yes') but cannot push "
            "rows: 'nosuch' is not a valid Git remote or URL. Fix the git remote 'nosuch' "
            "(DVC_EXP_GIT_REMOTE='nosuch'; `git remote -v`)") in text, text
    assert "turn auto-push off (unset DVC_EXP_AUTO_PUSH or set it to 0)" in text, text
    assert not [r for r in exp_rows(project) if "-step" in r]


def test_retention_prunes_the_remote_rows_too(tmp_path):
    project = template_project(tmp_path)
    bare, _ = with_remotes(project, tmp_path)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project,
        env={"DVC_DALI_KEEP_LAST": "1"})
    assert set(remote_rows(bare)) == {"a-step20"}


def test_dvc_dali_push_and_pull_move_every_row_of_a_run(tmp_path):
    project = template_project(tmp_path)
    bare, store = with_remotes(project, tmp_path, auto_push=False)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project)
    assert remote_rows(bare) == {}
    # a git remote git cannot reach: refused before the data went up (it went
    # first, and the rows could not follow: found by a sweep)
    run(["git", "remote", "add", "moved", str(tmp_path / "moved.git")], project)
    refused = run(["dvc-dali", "push", "moved", "a"], project, check=False)
    assert refused.returncode == 1 and not store.exists(), refused.stderr
    assert refused.stderr == (
        f"dvc-dali push: git push of a to moved failed: '{tmp_path / 'moved.git'}' does not "
        "appear to be a git repository. Nothing was pushed, the data neither; check the git "
        "remote (`git ls-remote moved`), then run the command again.\n"), refused.stderr
    hook = bare / "hooks" / "pre-receive"  # the remote refuses: said, not "held otherwise"
    hook.write_text("#!/bin/sh\necho 'refs/exps is read-only here' >&2\nexit 1\n")
    hook.chmod(0o755)
    refused = run(["dvc-dali", "push", "origin", "a"], project, check=False)
    assert refused.returncode == 1 and remote_rows(bare) == {}, refused.stderr
    assert "git push of a to origin failed: remote: refs/exps is read-only here (pre-receive " \
        "hook declined)" in refused.stderr and "--delete" not in refused.stderr, refused.stderr
    hook.unlink()
    run(["dvc-dali", "push", "origin", "a"], project)
    fresh = tmp_path / "fresh"
    run(["git", "clone", "-q", str(bare), str(fresh)], tmp_path)
    pulled = run(["dvc-dali", "pull", "origin", "a"], fresh)
    assert "pulled 4 rows of a from origin" in pulled.stdout, pulled.stdout
    assert {r for r in exp_rows(fresh) if "-step" in r} == {
        "a-step5", "a-step10", "a-step15", "a-step20"}
    store.rename(tmp_path / "store-gone")  # the data came with them
    run(["dvc", "exp", "apply", "a-step15"], fresh)
    assert (fresh / "checkpoint").is_dir()
    nosuch = run(["dvc-dali", "pull", "origin", "b"], fresh, check=False)
    assert nosuch.returncode == 1 and "no run named b on origin" in nosuch.stderr
    assert "`dvc exp list origin` lists the experiments there" in nosuch.stderr  # not `show`
    # a row's name: said to be one, with its run's (found by a sweep)
    for command, where in (("pull", "on origin"), ("push", "in this repository")):
        row = run(["dvc-dali", command, "origin", "a-step5"], fresh, check=False)
        assert row.returncode == 1 and f"no run named a-step5 {where}" in row.stderr
        assert "a-step5 is one checkpoint row of run a, and a run moves whole: name a" in (
            row.stderr), row.stderr
    for command in ("pull", "push"):  # a DVC remote named that is not configured: said so
        said = run(["dvc-dali", command, "-r", "nosuch", "origin", "a"], fresh, check=False)
        assert said.returncode == 1, said.stdout + said.stderr
        assert f"dvc-dali {command}: DVC remote nosuch: " in said.stderr, said.stderr
        assert "`dvc remote list`" in said.stderr and "Traceback" not in said.stderr
        assert "from the machine that recorded them" not in said.stderr, said.stderr


def test_rows_recorded_before_the_remotes_were_set_up_move_with_their_data(tmp_path):
    """A user trains first and adds the DVC remote later: DVC's push and
    fetch of a commit read that commit's .dvc/config, which names no remote,
    and skip it. `dvc-dali push` and `pull` move those rows' data with the
    workspace's remote, and say so only when it is there."""
    project = template_project(tmp_path)
    run(["dvc", "exp", "run", "-n", "early", "-S", "train.checkpoint_every=10"], project)
    bare, store = with_remotes(project, tmp_path, auto_push=False)
    pushed = run(["dvc-dali", "push", "origin", "early"], project, check=False)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert missing_data(bare, store, remote_rows(bare)["early-step20"]) == []
    fresh = tmp_path / "fresh"
    run(["git", "clone", "-q", str(bare), str(fresh)], tmp_path)
    # no default DVC remote in the clone: said so, not "not on the DVC remote", "push again"
    run(["dvc", "remote", "default", "--unset"], fresh)
    unset = run(["dvc-dali", "pull", "origin", "early"], fresh, check=False)
    assert unset.returncode == 1 and "Traceback" not in unset.stderr, unset.stderr
    assert ("(their data is not in the local DVC cache, and no DVC remote is configured here "
            "to fetch it from: ") in unset.stderr, unset.stderr
    assert "not on the DVC remote" not in unset.stderr, unset.stderr
    run(["dvc", "remote", "default", "store"], fresh)
    pulled = run(["dvc-dali", "pull", "origin", "early"], fresh, check=False)
    assert "pulled 2 rows of early from origin" in pulled.stdout, pulled.stdout + pulled.stderr
    store.rename(tmp_path / "store-gone")  # the data came with them
    run(["dvc", "exp", "apply", "early-step10"], fresh)
    assert dvc_dali.load(fresh / "checkpoint").step == 10


def test_a_row_pulled_without_its_data_is_refused_not_restarted_from_step_0(tmp_path):
    """DVC's own `dvc exp push` sends the ref before the data: a kill between
    the two leaves a row whose data is nowhere. Pulling it exits 0 and
    applying it fails; the run then must not silently start from step 0."""
    project = template_project(tmp_path)
    bare, _ = with_remotes(project, tmp_path, auto_push=False)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project)
    ref = row_refs(project)["a-step10"][0]
    run(["git", "push", "-q", "origin", f"{ref}:{ref}"], project)  # the ref, not the data
    fresh = tmp_path / "fresh"
    run(["git", "clone", "-q", str(bare), str(fresh)], tmp_path)
    run(["dvc", "exp", "pull", "origin", "a-step10"], fresh, check=False)
    run(["dvc", "exp", "apply", "a-step10"], fresh, check=False)
    out = run(["dvc", "exp", "run", "-S", "train.checkpoint_every=5"], fresh, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "dvc.lock names the checkpoint checkpoint of row a-step10" in text, text
    assert "`dvc exp pull <git remote> a-step10`" in text and "Traceback" not in text, text
    assert "starting" not in text and "step 5/" not in text, text


def test_rows_whose_data_is_missing_are_not_pushed_nor_pulled_and_are_named(tmp_path):
    """Issue 28.5: `dvc-dali push` pushed every ref and said "with their
    data" while 4 rows' files were missing from the cache. A ref reaches the
    git remote only with all its data on the DVC remote; the others are
    named, with their missing files, and the command fails."""
    project = template_project(tmp_path, steps=15)
    bare, store = with_remotes(project, tmp_path, auto_push=False)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project)
    refs = row_refs(project)
    assert set(refs) == {"a-step5", "a-step10", "a-step15"}, refs
    files = {name: cached_files(project, sha) for name, (_, sha) in refs.items()}
    deleted: dict[str, list[str]] = {}
    for name in ("a-step5", "a-step10"):  # files only these rows have
        others = {p for other, f in files.items() if other != name for p in f.values()}
        deleted[name] = [rel for rel, obj in files[name].items() if obj not in others]
        assert deleted[name], files[name]
        for rel in deleted[name]:
            files[name][rel].unlink()

    pushed = run(["dvc-dali", "push", "origin", "a"], project, check=False)
    said = pushed.stdout + pushed.stderr
    assert pushed.returncode != 0, said
    line = next(ln for ln in pushed.stderr.splitlines() if ln.startswith("dvc-dali push: "))
    for name, rels in deleted.items():  # named, with the files it lacks
        assert name in line and any(rel in line for rel in rels), said
    assert "Pushed with their data: 1 row of a" in line and "dvc exp pull" in line, said
    assert "Traceback" not in said
    assert set(remote_rows(bare)) == {"a-step15"}, said  # no ref of an incomplete row
    sent = [sha for sha, _ in exp_refs(bare, dvc_exec=True)]
    assert sent, said
    for sha in sent:  # the rows and DVC's own experiment ref: all their data
        assert missing_data(bare, store, sha) == [], sha

    # DVC's own `dvc exp push` of a row sends its ref even without the data
    ref = refs["a-step5"][0]
    run(["git", "push", "-q", "origin", f"{ref}:{ref}"], project)
    fresh = tmp_path / "fresh"
    run(["git", "clone", "-q", str(bare), str(fresh)], tmp_path)
    pulled = run(["dvc-dali", "pull", "origin", "a"], fresh, check=False)
    said = pulled.stdout + pulled.stderr
    assert pulled.returncode != 0, said
    line = next(ln for ln in pulled.stderr.splitlines() if ln.startswith("dvc-dali pull: "))
    # not even the directories' listings reached the DVC remote
    assert "a-step5 (not on the DVC remote: checkpoint/ (the whole directory)" in line, said
    assert "Pulled with their data: 1 row of a" in line, said
    assert "Traceback" not in said
    assert set(row_refs(fresh)) == {"a-step15"}, said  # the complete row only


def test_the_row_pusher_never_pushes_a_row_whose_data_is_gone(tmp_path, monkeypatch, capsys):
    """The per-row auto-push (recording/auto_push.py) had the same hole: DVC's
    push skips files missing from the cache with a warning. The real pusher,
    given real rows: the one whose files are gone stays off the git remote,
    is said, and the row after it is still pushed."""
    import yaml
    from dvc_data.hashfile.hash_info import HashInfo

    from dvc_dali.recording.auto_push import Pusher

    project = template_project(tmp_path, steps=10)
    bare, store = with_remotes(project, tmp_path, auto_push=False)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project)
    refs = row_refs(project)
    files = {name: cached_files(project, sha) for name, (_, sha) in refs.items()}
    for obj in set(files["a-step5"].values()) - set(files["a-step10"].values()):
        obj.unlink()

    def outputs(sha: str) -> list:  # what a recording hands the pusher: its outputs' hashes
        lock = yaml.safe_load(run(["git", "show", f"{sha}:dvc.lock"], project).stdout)
        return [HashInfo("md5", out["md5"]) for entry in lock["stages"].values()
                for out in entry.get("outs", []) if out["path"] in ("checkpoint", "model")]

    monkeypatch.chdir(project)
    pusher = Pusher(str(project), "origin", "a")
    for name in ("a-step5", "a-step10"):
        ref, sha = refs[name]
        pusher.push(name, ref, sha, outputs(sha))
    assert pusher.close() == ["a-step5"]  # waits until every row is pushed or given up
    said = capsys.readouterr().err
    assert "a-step5 NOT pushed to origin" in said and "dvc-dali push origin a" in said, said
    assert set(remote_rows(bare)) == {"a-step10"}, said
    assert missing_data(bare, store, refs["a-step10"][1]) == []


def test_another_clones_recording_of_a_run_is_neither_pushed_beside_nor_pulled_into_ours(
        tmp_path):
    """Two clones each `dvc exp run -n a` on one commit; one is killed (no
    DVC experiment ref `a`), so no ref name collides. Its rows went in beside
    the other's (auto-push, `dvc-dali push`), a pull mixed them into the
    other's run, and that run's next retention pruned them (found by a
    sweep). All three are refused now."""
    project = template_project(tmp_path, steps=4)
    bare, _ = with_remotes(project, tmp_path, auto_push=False)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=2"], project)
    run(["dvc-dali", "push", "origin", "a"], project)
    other = tmp_path / "other"
    run(["git", "clone", "-q", str(bare), str(other)], tmp_path)
    git_init(other)
    auto = run(["dvc", "exp", "run", "-n", "a", "-S", "train.steps=3", "-S",
                "train.checkpoint_every=3"], other, env={"DVC_EXP_AUTO_PUSH": "true"})
    assert "rows of a NOT pushed: origin holds another recording of run a (a-step2, a-step4: " \
        in auto.stderr and "push them with `dvc-dali push origin a`" in auto.stderr, auto.stderr
    assert set(remote_rows(bare)) == {"a-step2", "a-step4"}
    dvc_ref = next(ref for _, ref in exp_refs(other) if ref.endswith("/a"))
    run(["git", "update-ref", "-d", dvc_ref], other)  # as a killed run leaves it
    pushed = run(["dvc-dali", "push", "origin", "a"], other, check=False)
    assert pushed.returncode == 1, pushed.stdout + pushed.stderr
    assert "origin holds another recording of run a (a-step2, a-step4: started elsewhere" \
        in pushed.stderr and "nothing pushed" in pushed.stderr, pushed.stderr
    assert set(remote_rows(bare)) == {"a-step2", "a-step4"}
    ref = row_refs(other)["a-step3"][0]
    run(["git", "push", "-q", "origin", f"{ref}:{ref}"], other)  # as `dvc exp push` would
    pulled = run(["dvc-dali", "pull", "origin", "a"], project, check=False)
    assert pulled.returncode == 1 and "another recording of run a (a-step3: " in (
        pulled.stderr), pulled.stdout + pulled.stderr
    assert set(row_refs(project)) == {"a-step2", "a-step4"}


def test_retention_leaves_a_remote_row_that_holds_another_commit_under_its_name(tmp_path):
    """Retention deleted the git remote's ref of each row it pruned here,
    whatever commit the remote held under that name: another machine's row
    of a run of the same name was deleted there (found by a sweep). A
    deletion now holds only where the remote still has this row's commit."""
    project = template_project(tmp_path)
    bare, _ = with_remotes(project, tmp_path)
    every = ["-S", "train.checkpoint_every=5"]
    run(["dvc", "exp", "run", "-n", "a", *every, "-S", "train.steps=10"], project)
    first = remote_rows(bare)
    assert set(first) == {"a-step5", "a-step10"}, first
    run(["git", "update-ref", row_refs(bare)["a-step5"][0], first["a-step10"]], bare)
    out = run(["dvc", "exp", "run", *every, "-S", "train.steps=20"], project,
              env={"DVC_DALI_KEEP_LAST": "1"})
    text = out.stdout + out.stderr
    assert set(exp_rows(project)) >= {"a-step20"} and "a-step5" not in exp_rows(project), text
    after = remote_rows(bare)
    assert after == {"a-step5": first["a-step10"], "a-step20": after["a-step20"]}, (after, text)
    assert "a-step5 on origin holds another commit than this repository's a-step5: " \
        "retention left it there" in text, text
