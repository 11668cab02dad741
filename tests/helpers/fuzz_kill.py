"""The kill fuzz driver (used by test_kill_fuzz.py; runnable alone for long
sessions, from the repository root: `python -m tests.helpers.fuzz_kill DIR --kills 300
--seed 7`).

Rounds of real `dvc exp run` on the example project, each SIGKILLed at a
random instant (seeded) in one of three ways:

- ``train``: the training process (`python examples/train.py`) only, as the
  OOM killer or a crash would; `dvc exp run` then fails the stage and exits.
- ``dvc``: the `dvc exp run` process only (a `kill -9` of the front process).
  The trainer is orphaned and keeps running: it goes on recording rows and
  writing the workspace dvc.lock. DVC's workspace state is left mid-run: HEAD
  detached at the baseline, refs/exps/exec/EXEC_{BASELINE,MERGE} and the run's
  info file left, the rwlock naming the dead pid (the next run removes it with
  a warning), the experiment's param changes staged in the git index. A user
  notices the training still printing and either waits for it to end or kills
  it; we do either (seeded choice) before the next `dvc exp run`, never run
  two trainers on one workspace at once (see test_rerun_beside_orphan).
- ``group``: the whole process group (machine death / `kill -9 -PGID`):
  dvc, trainer and any git child die at one instant.

What DVC itself leaves after a kill of `dvc exp run`, and what we do as a
user would (counted in Stats, not failures of dvc-dali):
- `.dvc/tmp/rwlock` rewritten in place by DVC and cut short by the kill:
  every later DVC command fails ("Unable to read RWLock-file ... JSON
  structure is corrupted"); we delete it and rerun (``user_fixes``). The
  same for the info file DVC writes at a run's start
  (`.dvc/tmp/exps/run/workspace/workspace.run`: "JSON file structure is
  corrupted").
- `.git/index.lock` left when the kill falls while DVC writes the git index:
  every later DVC command fails ("the index is locked; this might be due to
  a concurrent or crashed process"); we delete it and rerun (``user_fixes``).
- changes staged in the git index by a killed run's stash apply: every later
  run fails ("Stash apply resulted in merge conflicts: N uncommitted changes
  exist in the index"); we `git reset` (the working tree stays) and rerun.
- params.yaml cut short: DVC applies `-S` by rewriting it in place, so a
  kill in between (or a stash apply that conflicted) leaves it without its
  `train` section, and every later run fails ("Invalid `--set-param`
  value"); we `git checkout` it and rerun.
- HEAD left detached at the baseline (the next runs keep it so), or, when the
  kill falls between DVC's experiment commit and its restore of HEAD, left on
  that experiment commit, which later runs then take as their baseline
  (``head_moves``); rows stay consistent either way, `git checkout <branch>`
  puts the user back.

Then `dvc exp run` again, until the number of kills is reached; then a last
run must complete. Every completed run (and every orphan that finished the
training) must leave the model of an uninterrupted run, byte for byte.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import re
import signal
import time
from pathlib import Path

import yaml

from tests.helpers.fuzz_harness import (
    ExpRun,
    doctor_fix,
    wait_for_phase,
    reset,
    cache_path,
    cached_checkpoint_step,
    dir_listing,
    model_digest,
)

STEPS, EVERY = 60, 2
PARAMS = ["-S", f"train.steps={STEPS}", "-S", f"train.checkpoint_every={EVERY}"]
RESUMING = re.compile(r"train: resuming from step (\d+)")
STARTING = "train: starting on"
INDEX_LOCKED = "the index is locked"
STASH_CONFLICT = "Stash apply resulted in merge conflicts"
PARAMS_BROKEN = "Invalid `--set-param` value"
# a lock git (or dulwich or libgit2, DVC's gits) leaves when killed between
# making it and renaming it over the file: "File exists: b'<lock>'" (dulwich),
# "Unable to create '<lock>': File exists." (git), "failed to lock file
# '<lock>' for writing" (libgit2: DVC's stash of the workspace, refs/stash.lock)
GIT_LOCK_LEFT = re.compile(r"(?:File exists: b?'|Unable to create '|failed to lock file ')"
                           r"([^']+/\.git/[^']+\.lock)'")
RWLOCK_CORRUPT = re.compile(r"Unable to read RWLock-file '([^']+)'\. JSON structure is corrupted")
RUN_INFO_CORRUPT = re.compile(r"unable to read: '([^']+\.run)', JSON file structure is corrupted")
LOCK_BROKEN = re.compile(r"dvc\.lock' validation failed"
                         r"|dvc\.lock', YAML file structure is corrupted")


@dataclasses.dataclass
class Reference:
    model: str  # sha256 of model/model.npz after an uninterrupted run
    model_md5_at: dict[int, str]  # step -> md5 of model/model.npz recorded at that step
    train_start: float  # seconds from `dvc exp run` to the trainer's start
    duration: float  # seconds of a whole run


@dataclasses.dataclass
class Stats:
    kills: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    orphans_waited: int = 0
    orphans_killed: int = 0
    orphans_finished_training: int = 0
    in_recording: int = 0  # kills that left .dvc/tmp/DVC_CHECKPOINT: inside a recording
    in_save: int = 0  # kills that left checkpoint/.tmp-*: inside a snapshot write
    runs: int = 0
    completed: int = 0
    missed: int = 0  # the run ended before the kill came
    resumed: list = dataclasses.field(default_factory=list)
    fresh_starts: int = 0
    problems: list = dataclasses.field(default_factory=list)
    user_fixes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # DVC's workspace state after kills: HEAD moved (a `dvc exp run` killed
    # between its experiment commit on the detached HEAD and restoring HEAD
    # leaves HEAD there, and later runs take it as their baseline).
    head_moves: list = dataclasses.field(default_factory=list)
    head_detached: bool = False
    resets: int = 0  # `dvc-dali reset` after a finished run: a new campaign

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())

    def summary(self) -> dict:
        return {
            "kills": self.total_kills, **{f"kills_{k}": v for k, v in sorted(self.kills.items())},
            "kills_in_recording": self.in_recording, "kills_in_save": self.in_save,
            "orphans_waited": self.orphans_waited, "orphans_killed": self.orphans_killed,
            "orphans_finished_training": self.orphans_finished_training,
            "runs": self.runs, "reruns": self.runs - 1, "completed": self.completed,
            "missed": self.missed, "resumes": len(self.resumed),
            "fresh_starts": self.fresh_starts, "resets": self.resets,
            "user_fixes": dict(self.user_fixes),
            "head_moves": len(self.head_moves), "head_detached_at_end": self.head_detached,
        }


def md5_of(path: Path) -> str:
    import hashlib

    return hashlib.md5(path.read_bytes()).hexdigest()


def model_md5_in_row(project: Path, lock: dict) -> str | None:
    """md5 of model.npz in the `model` output of a dvc.lock."""
    for out in (lock.get("stages", {}).get("train", {}).get("outs") or []):
        if out["path"] == "model" and out.get("md5"):
            for e in dir_listing(project, out["md5"]):
                if e["relpath"] == "model.npz":
                    return e["md5"]
    return None


def workspace_resume_step(project: Path) -> int | None:
    """The step of the checkpoint the workspace dvc.lock names (what the next
    `dvc exp run` checks out and resumes from), None if none."""
    lock_path = project / "dvc.lock"
    if not lock_path.is_file():
        return None
    try:  # one a kill cut short: DVC fails on it, and no run resumes
        lock = yaml.safe_load(lock_path.read_text())
        outs = lock["stages"]["train"]["outs"]
    except (yaml.YAMLError, KeyError, TypeError):
        return None
    for out in outs if isinstance(outs, list) else []:
        if isinstance(out, dict) and out.get("path") == "checkpoint" and out.get("md5"):
            if not cache_path(project, out["md5"]).is_file():
                return None
            return cached_checkpoint_step(project, out["md5"])
    return None


def reference_run(project: Path, log_dir: Path) -> Reference:
    """One uninterrupted run (named `ref`), timed, in the fuzz project itself."""
    from dvc_dali.reading.exp_refs import list_rows
    from tests.helpers.fuzz_harness import show

    run = ExpRun(project, ["-n", "ref", *PARAMS], log_dir / "ref.log")
    try:
        t = run.wait_train()
        train_start = run.elapsed()
        assert t is not None, run.output()[-3000:]
        rc = run.wait()
        duration = run.elapsed()
        assert rc == 0, run.output()[-3000:]
    finally:
        run.close()
    at = {}
    for row in list_rows(str(project), "ref"):
        at[row["step"]] = model_md5_in_row(project, yaml.safe_load(
            show(project, row["sha"], "dvc.lock")))
    assert sorted(at) == list(range(EVERY, STEPS + 1, EVERY)), sorted(at)
    return Reference(model_digest(project), at, train_start, duration)


def _kill(pid: int, sig=signal.SIGKILL) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _trigger_wait(project: Path, run: ExpRun, rng: random.Random, ref: Reference) -> str:
    """Wait for the kill instant; returns how it was chosen."""
    how = rng.choices(["time", "signal", "write"], weights=[0.5, 0.3, 0.2])[0]
    if how == "time":
        time.sleep(rng.uniform(0.0, ref.duration - ref.train_start))
        return how
    # The n-th checkpoint signal (recording) or snapshot write seen from here.
    if wait_for_phase(project, lambda: run.poll() is None,
                      "record" if how == "signal" else "write", rng.randint(1, 8),
                      ref.duration * 2, prefix=".tmp-", interval=0.001):
        if how == "signal":  # somewhere inside the recording
            time.sleep(rng.uniform(0.0, 0.03))
    return how


def _after_kill_state(project: Path, stats: Stats) -> None:
    if (project / ".dvc" / "tmp" / "DVC_CHECKPOINT").exists():
        stats.in_recording += 1
    ckpt = project / "checkpoint"
    if ckpt.is_dir() and any(n.startswith(".tmp-") for n in os.listdir(ckpt)):
        stats.in_save += 1


def fuzz(project: Path, ref: Reference, kills_wanted: int, seed: int, log_dir: Path,
         say=print) -> Stats:
    from tests.helpers.fuzz_harness import git

    rng = random.Random(seed)
    stats = Stats()
    heads = [git(project, "rev-parse", "HEAD").strip()]

    def note_head(after: str) -> None:
        now = git(project, "rev-parse", "HEAD").strip()
        if now != heads[-1]:
            subject = git(project, "log", "-1", "--format=%s", now).strip()
            stats.head_moves.append(f"after {after}: HEAD {heads[-1][:7]} -> {now[:7]} "
                                    f"{subject!r}")
            say(stats.head_moves[-1])
            heads.append(now)
        stats.head_detached = git(project, "symbolic-ref", "-q", "HEAD", check=False) == ""

    i = 0
    while True:
        i += 1
        final = stats.total_kills >= kills_wanted
        expect = workspace_resume_step(project)
        if expect == STEPS:
            # A finished run (the reference, a completed round, an orphan that
            # trained to the end): a rerun would resume it with nothing to do.
            # Start the next campaign from step 0, as `dvc exp run --reset` did.
            reset(project)
            stats.resets += 1
            expect = None
        name = f"r{i:04d}"
        run = ExpRun(project, ["-n", name, *PARAMS], log_dir / f"{name}.log")
        stats.runs += 1
        kind, how, killed = None, None, False
        try:
            if not final:
                kind = rng.choices(["train", "dvc", "group"], weights=[0.4, 0.3, 0.3])[0]
                if kind == "train":
                    trainer = run.wait_train()
                    if trainer is not None:
                        how = _trigger_wait(project, run, rng, ref)
                        killed = run.poll() is None and _kill(trainer.pid)
                    if killed:
                        # dvc sees the stage fail and ends by itself
                        run.wait(120)
                        _after_kill_state(project, stats)
                else:
                    if rng.random() < 0.25:  # anywhere, DVC's own start included
                        how = "early"
                        time.sleep(rng.uniform(0.0, ref.train_start + 0.5))
                    else:
                        if run.wait_train() is not None:
                            how = _trigger_wait(project, run, rng, ref)
                    if run.poll() is None:
                        if kind == "dvc":
                            killed = _kill(run.pgid)
                        else:
                            run.kill_group()
                            killed = True
                    run.wait(120)
                    if killed and kind == "group":
                        _after_kill_state(project, stats)
                    if killed and kind == "dvc":
                        orphans = run.leftovers()
                        if orphans:
                            if rng.random() < 0.5:
                                stats.orphans_waited += 1
                                assert run.wait_leftovers(180), "orphaned trainer did not end"
                                if f"train: wrote model/model.npz at step {STEPS}" in \
                                        run.output():
                                    stats.orphans_finished_training += 1
                                    if model_digest(project) != ref.model:
                                        stats.problems.append(
                                            f"{name}: orphan finished with another model")
                            else:
                                stats.orphans_killed += 1
                                time.sleep(rng.uniform(0.0, 1.0))
                                run.kill_group()
                                assert run.wait_leftovers(30)
            rc = run.wait(300)
            out = run.output()
            # nothing of this run may survive it (we never start a second trainer)
            if not run.wait_leftovers(30):
                stats.problems.append(f"{name}: processes left {run.leftovers()}")
                run.kill_group()
                run.wait_leftovers(30)
        finally:
            run.close()
        note_head(f"{name} ({kind or 'no'} kill)")

        m = RESUMING.search(out)
        if m:
            stats.resumed.append(int(m.group(1)))
        elif STARTING in out:
            stats.fresh_starts += 1
        # A rerun resumes from the checkpoint the workspace dvc.lock names, or
        # starts over when that run was finished.
        if m or STARTING in out:
            if expect is not None and expect < STEPS:
                if not m or int(m.group(1)) != expect:
                    stats.problems.append(f"{name}: dvc.lock names step {expect}, the run "
                                          f"{'resumed at ' + m.group(1) if m else 'started over'}")
        if killed:
            stats.kills[kind] += 1
            say(f"{name}: killed {kind} ({how}) at {run.elapsed():.2f} s, rc {rc}, "
                f"{'resumed ' + m.group(1) if m else 'fresh'}")
            continue
        if kind is not None:
            stats.missed += 1
        index_lock = project / ".git" / "index.lock"
        if rc != 0 and INDEX_LOCKED in out and index_lock.exists():
            # A kill of `dvc exp run` while DVC wrote the git index (its stash
            # and detach at the start, its commit at the end) leaves git's
            # index.lock; DVC then fails at once. No git runs now (every
            # process of the killed run has ended): a user deletes it.
            index_lock.unlink()
            stats.user_fixes["git index.lock left by a kill: deleted"] += 1
            say(f"{name}: DVC: {INDEX_LOCKED}: deleting .git/index.lock, as a user would")
            continue
        if rc != 0 and STASH_CONFLICT in out:
            # A kill of `dvc exp run` during its stash/apply of the experiment
            # (with the index.lock above deleted) leaves changes staged in the
            # git index; each later run's stash apply then conflicts. A user
            # unstages them (`git reset`; the working tree is kept) and reruns.
            git(project, "reset", "-q")
            stats.user_fixes["changes staged by a killed run: git reset"] += 1
            say(f"{name}: DVC: {STASH_CONFLICT}: `git reset`, as a user would")
            continue
        if rc != 0 and PARAMS_BROKEN in out and params_damaged(project):
            # DVC applies `-S` by rewriting params.yaml in place (open "w",
            # then dump): a kill in between leaves it cut short, and a stash
            # apply that conflicted can leave it so too. Every later `-S`
            # then fails on the missing key; a user restores the file.
            say(f"{name}: DVC: {PARAMS_BROKEN} (`dvc-dali doctor` names it), params.yaml is "
                f"{(project / 'params.yaml').read_text()[:200]!r}: `git checkout`, as a user would")
            git(project, "checkout", "HEAD", "--", "params.yaml")
            stats.user_fixes["params.yaml cut short by a kill: git checkout"] += 1
            continue
        # DVC writes its rwlock (.dvc/tmp/rwlock) and the info file of a
        # running experiment (.dvc/tmp/exps/run/workspace/workspace.run) in
        # place (open "w" + json.dump): a kill of `dvc exp run` in between
        # leaves one empty, and every later DVC command fails on it. A user
        # deletes it (DVC's "busy" message and `dvc-dali doctor` name it) and
        # reruns.
        corrupt = next((found for found in (RWLOCK_CORRUPT.search(out),
                                            RUN_INFO_CORRUPT.search(out)) if found), None)
        if rc != 0 and corrupt:
            (project / corrupt.group(1)).unlink()
            what = "rwlock" if corrupt.re is RWLOCK_CORRUPT else "run info"
            stats.user_fixes[f"dvc {what} left empty by a kill: deleted"] += 1
            say(f"{name}: {corrupt.group(0)}: deleting it, as a user would")
            continue
        if rc != 0 and LOCK_BROKEN.search(out):
            # DVC rewrites dvc.lock in place (open "w", then dump) at the end
            # of a stage: a kill in between leaves it cut short, and every
            # later run fails on it. A user does what `dvc-dali doctor` says.
            fixed = doctor_fix(project, "dvc.lock: DVC cannot read it")
            if fixed is None:
                stats.problems.append(f"{name}: dvc.lock cut short, and doctor names no fix")
                return stats
            stats.user_fixes["dvc.lock cut short by a kill: " + " ".join(fixed.split()[:3])] += 1
            say(f"{name}: DVC: dvc.lock cut short: `{fixed}`, as `dvc-dali doctor` says")
            continue
        git_lock = GIT_LOCK_LEFT.search(out)
        if rc != 0 and git_lock and Path(git_lock.group(1)).exists():
            # A kill of `dvc exp run` while DVC updated a git file (its own
            # EXEC_* refs, HEAD, packed-refs) leaves git's <file>.lock; DVC
            # then fails on it (at the end of the next run, for a ref). No git
            # runs now: a user deletes it (`dvc-dali doctor` names it). A
            # row's ref lock never gets here: the next run completes it.
            Path(git_lock.group(1)).unlink()
            stats.user_fixes["git lock left by a kill: deleted"] += 1
            say(f"{name}: DVC: stale {git_lock.group(1)}: deleting it, as a user would")
            continue
        if rc != 0:
            stats.problems.append(f"{name}: exited {rc} without being killed:\n{out[-4000:]}")
            say(stats.problems[-1])
            if len(stats.problems) > 3 or final:
                return stats
            continue
        stats.completed += 1
        got = model_digest(project)
        say(f"{name}: completed in {run.elapsed():.2f} s "
            f"({'resumed ' + m.group(1) if m else 'fresh'}), model "
            f"{'identical' if got == ref.model else 'DIFFERENT'}")
        if got != ref.model:
            stats.problems.append(f"{name}: completed with another model")
        if final:
            return stats


def params_damaged(project: Path) -> bool:
    """params.yaml no longer holds the `train` section the example's stage
    reads (DVC cut it short), while the committed one does."""
    try:
        now = yaml.safe_load((project / "params.yaml").read_text())
    except yaml.YAMLError:
        return True
    return not isinstance(now, dict) or "train" not in now


def check_row(project: Path, ref: Reference, row: dict, params: dict) -> None:
    """One checkpoint row: its data is in the cache (check_row_data), its
    cached checkpoint is complete and at the row's step, its model is the
    uninterrupted run's model of that step, its params are the run's."""
    from tests.helpers.fuzz_harness import check_row_data, show

    outs = check_row_data(project, row["sha"])
    lock = yaml.safe_load(show(project, row["sha"], "dvc.lock"))
    step = cached_checkpoint_step(project, outs["checkpoint"])
    assert step == row["step"], f"{row['name']}: its checkpoint is at step {step}"
    assert model_md5_in_row(project, lock) == ref.model_md5_at[row["step"]], \
        f"{row['name']}: model differs from the uninterrupted run's at step {row['step']}"
    got = (yaml.safe_load(show(project, row["sha"], "params.yaml")) or {}).get("train")
    assert got == {**got, **params}, f"{row['name']}: params {got}, expected {params}"
    lock_params = lock["stages"]["train"]["params"]["params.yaml"]["train"]
    assert lock_params == got, f"{row['name']}: dvc.lock params {lock_params} != {got}"


def check_rows(project: Path, ref: Reference, params: dict) -> list[dict]:
    """Every experiment row (DVC's own too) points only at cached data; every
    checkpoint row passes check_row. Returns the checkpoint rows."""
    from dvc_dali.reading.exp_refs import list_rows
    from tests.helpers.fuzz_harness import check_row_data
    from tests.helpers.rows import exp_refs

    for sha, _ in exp_refs(project):
        check_row_data(project, sha)
    rows = list_rows(str(project))
    for row in rows:
        check_row(project, ref, row, params)
    return rows


if __name__ == "__main__":  # long sessions by hand
    import argparse
    import tempfile

    from tests.helpers.dvc_project import make_project

    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    base = Path(a.dir or tempfile.mkdtemp(prefix="dvc-dali-fuzz-"))
    (base / "project").mkdir(parents=True)
    (base / "logs").mkdir()
    proj = make_project(base / "project", example=True)
    r = reference_run(proj, base / "logs")
    print("reference", r)
    t0 = time.monotonic()
    s = fuzz(proj, r, a.kills, a.seed, base / "logs")
    print(s.summary(), "problems:", *s.problems, sep="\n")
    rows = check_rows(proj, r, {"steps": STEPS, "checkpoint_every": EVERY})
    print(f"{len(rows)} rows checked; {time.monotonic() - t0:.0f} s")
