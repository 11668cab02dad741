"""Proof at runtime under real `dvc exp run`: the example's data files
rewritten in place (same names, sizes and mtimes: DVC and the data listing
see nothing), with the content digest off so that only the batches can tell.
A run killed between two checkpoints is refused at the first batch after its
checkpoint; an applied earlier row is refused too, its digests read from the
row its run recorded next (the companion files removed, as on another
machine after `dvc exp pull`); with the data put back, it resumes."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from tests.helpers.dvc_project import queue_report, run, template_project, wait_queue
from tests.helpers.proof import manifest
from tests.helpers.rows import exp_rows

KILL = "DVC_DALI_EXAMPLE_KILL_AT_STEP"
OFF = {"DVC_DALI_CONTENT_DIGEST_MAX": "0"}


def rotate_same_size_files(images: Path, back: bool = False) -> int:
    """Each PNG gets the bytes of another of the same size (a different
    digit), its own mtime kept; ``back`` undoes it. Returns how many moved."""
    by_size = defaultdict(list)
    for path in sorted(images.rglob("*.png")):
        by_size[path.stat().st_size].append(path)
    moved = 0
    for group in (g for g in by_size.values() if len(g) > 1):
        blobs = [p.read_bytes() for p in group]
        stats = [p.stat() for p in group]
        for i, path in enumerate(group):
            path.write_bytes(blobs[(i + 1) % len(group)] if back else blobs[i - 1])
            os.utime(path, ns=(stats[i].st_atime_ns, stats[i].st_mtime_ns))
        moved += len(group)
    assert moved > 1000, moved  # most of the 1,797 digits: the next batches read some
    return moved


def refused(project: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = run(["dvc", "exp", "run", *args], project, check=False, env={**OFF, **(env or {})})
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "BatchMismatchError" in said and "Traceback" not in said, said
    return said


def test_rewritten_data_is_refused_at_the_first_batch_after_the_checkpoint(project):
    killed = run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={KILL: "25", **OFF})
    assert killed.returncode != 0
    assert {"a-step10", "a-step20"} <= set(exp_rows(project)) and "a-step30" not in exp_rows(
        project)
    # the workspace's checkpoint replayed without training: its batches so far
    ws = run(["dvc-dali", "doctor", "--verify"], project, check=False)
    assert re.search(r"ok   checkpoint \(workspace\), pipeline 'train': the [45] batches "
                     r"recorded after step 20 are reproduced exactly", ws.stdout), ws.stdout
    images = project / "data" / "digits"
    rotate_same_size_files(images)

    said = refused(project)
    assert "pipeline 'train': batch 1 after the checkpoint at step 20 (" \
        in said, said
    assert "DVC_DALI_INEXACT=1" in said, said

    rotate_same_size_files(images, back=True)
    done = run(["dvc", "exp", "run"], project, env=OFF)
    assert "resuming from step 20" in done.stdout, done.stdout
    assert re.search(r"pipeline 'train': the [45] batches after the checkpoint at step 20 "
                     r"are those the run it "
                     r"resumes produced", done.stdout + done.stderr), done.stdout + done.stderr
    assert "a-step60" in exp_rows(project)
    # replayed without training: the batches after a row's checkpoint are its run's
    ok = run(["dvc-dali", "doctor", "--verify", "a-step30"], project, check=False)
    assert "ok   a-step30, pipeline 'train': the 10 batches recorded after step 30 are " \
        "reproduced exactly" in ok.stdout, ok.stdout + ok.stderr

    # an earlier row applied, its batches' digests in the next row only
    run(["dvc", "exp", "apply", "a-step30"], project)
    shutil.rmtree(project / ".dvc" / "tmp" / "dvc-dali" / "batches")
    rotate_same_size_files(images)
    bad = run(["dvc-dali", "doctor", "--verify", "a-step30"], project, check=False)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "BAD  a-step30, pipeline 'train': batch 1 after step 30 differs from the one " \
        "recorded" in bad.stdout, bad.stdout
    said = refused(project, "-S", "train.lr=0.05")
    assert "batch 1 after the checkpoint at step 30 (" in said, said
    rotate_same_size_files(images, back=True)
    again = run(["dvc", "exp", "run", "-S", "train.lr=0.05"], project, env=OFF)
    assert "resuming from step 30" in again.stdout, again.stdout
    assert ("the 10 batches after the checkpoint at step 30 are those the run it resumes "
            "produced") in again.stdout + again.stderr, again.stdout + again.stderr


def test_doctor_verify_replays_in_the_stages_directory_and_names_missing_data(project):
    """From a subdirectory the pipeline's relative file_root (data/digits)
    still names the data the training read; with the data gone, the
    pipeline that cannot be rebuilt is a problem line naming the cause and
    what to do, never a traceback."""
    killed = run(["dvc", "exp", "run", "-n", "v"], project, check=False, env={KILL: "15"})
    assert killed.returncode != 0 and "v-step10" in exp_rows(project), killed.stderr[-3000:]
    below = project / "examples"
    ws = run(["dvc-dali", "doctor", "--verify"], below, check=False)
    assert re.search(r"ok   checkpoint \(workspace\), pipeline 'train': the [45] batches "
                     r"recorded after step 10 are reproduced exactly", ws.stdout), \
        ws.stdout + ws.stderr

    shutil.rmtree(project / "data" / "digits")
    bad = run(["dvc-dali", "doctor", "--verify"], below, check=False)
    said = bad.stdout + bad.stderr
    assert bad.returncode == 1 and "Traceback" not in said, said
    assert "BAD  checkpoint (workspace), pipeline 'train': not replayed: it could not be " \
        "rebuilt (" in bad.stdout and "Failed to open data/digits" in bad.stdout, said
    assert "`dvc checkout`" in bad.stdout, said


def test_temp_and_queued_runs_are_compared_with_the_run_they_continue(project):
    """A --temp or queued run keeps its digests in the workspace (DVC_ROOT's),
    where the next run from the same row, --temp or queued, finds them."""
    lean = ["-S", "train.steps=20"]
    killed = run(["dvc", "exp", "run", "--temp", "-n", "t", *lean], project, check=False,
                 env={KILL: "15"})
    assert killed.returncode != 0 and "t-step10" in exp_rows(project), killed.stderr[-3000:]
    run(["dvc", "exp", "apply", "t-step10"], project)
    temp = run(["dvc", "exp", "run", "--temp", *lean], project)
    said = temp.stdout + temp.stderr
    assert "resuming from step 10" in said, said
    assert re.search(r"the [45] batches after the checkpoint at step 10 are those the run "
                     r"it resumes produced",
                     said), said

    run(["dvc", "exp", "apply", "t-step10"], project)
    run(["dvc", "exp", "run", "--queue", "-n", "q", *lean, "-S", "train.lr=0.05"], project)
    run(["dvc", "queue", "start"], project)
    wait_queue(project, lambda s: s.get("q") in ("Success", "Failed"), "queued run q done",
               lambda s: queue_report(project, s))
    logs = run(["dvc", "queue", "logs", "q"], project).stdout
    assert "resuming from step 10" in logs, queue_report(project, {"q": "?"})
    assert ("the 10 batches after the checkpoint at step 10 are those the run it resumes "
            "produced") in logs, logs


def swap_two_same_size_files(images: Path) -> list[str]:
    """Two PNGs of the same size exchange their bytes, mtimes kept (swapped
    again, they are back); their names under ``images``."""
    by_size = defaultdict(list)
    for path in sorted(images.rglob("*.png")):
        by_size[path.stat().st_size].append(path)
    a, b = next(g for g in by_size.values() if len(g) > 1)[:2]
    blobs, stats = (a.read_bytes(), b.read_bytes()), (a.stat(), b.stat())
    for path, blob, st in ((a, blobs[1], stats[0]), (b, blobs[0], stats[1])):
        path.write_bytes(blob)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return [str(p.relative_to(images)) for p in (a, b)]


def test_data_rewritten_after_a_checkpoint_is_refused_by_name(project):
    """Killed right after a checkpoint (no batch digest after it), and an
    applied earlier row: the content digest names the rewritten files before
    the first step, whether or not the next batches would read them."""
    killed = run(["dvc", "exp", "run", "-n", "c"], project, check=False, env={KILL: "20"})
    assert killed.returncode != 0 and "c-step20" in exp_rows(project)
    images = project / "data" / "digits"
    names = swap_two_same_size_files(images)
    proc = run(["dvc", "exp", "run"], project, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "PipelineMismatchError" in said, said
    assert "Traceback" not in said and f"changed {names[0]}" in said, said

    # on purpose, killed before its next checkpoint: the batches it read are
    # not taken as those that followed c-step20 (they were: the exact resume
    # below was refused, naming data already put back)
    inexact = run(["dvc", "exp", "run"], project, check=False,
                  env={"DVC_DALI_INEXACT": "1", KILL: "25"})
    assert inexact.returncode != 0 and "no longer exact" in inexact.stdout + inexact.stderr

    swap_two_same_size_files(images)  # back
    assert "resuming from step 20" in run(["dvc", "exp", "run"], project).stdout
    run(["dvc", "exp", "apply", "c-step30"], project)
    swap_two_same_size_files(images)
    proc = run(["dvc", "exp", "run", "-S", "train.lr=0.05"], project, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"changed {names[0]}" in said, said
    assert "checkpoint/step-000000030-" in said, said  # the applied row's manifest


OFFSET_SOURCE = '''
class Offset:  # an external_source callable: what it returns is not in the description
    def __call__(self, info):
        shift = float(os.environ.get("TRAIN_OFFSET", "0"))
        return np.full((1,), (info.idx_in_epoch % 5) * 0.01 + shift, np.float32)


@pipeline_def
def images(data):'''


def test_a_changed_external_source_callable_is_refused_under_dvc_exp_run(tmp_path):
    """The template's pipeline with an external_source callable whose values
    move with an environment variable DVC does not see: killed between two
    checkpoints, and as an applied earlier row (companion files removed)."""
    project = template_project(tmp_path, steps=20)
    train = project / "train.py"
    text = train.read_text().replace("\n\n@pipeline_def\ndef images(data):", OFFSET_SOURCE)
    text = text.replace(
        "    return fn.cast(imgs, dtype=types.FLOAT) / 255.0, labels",
        "    offset = fn.external_source(source=Offset(), batch=False, name=\"offset\")\n"
        "    return fn.cast(imgs, dtype=types.FLOAT) / 255.0 + offset, labels")
    text = text.replace(
        "        ck.make_checkpoint(step, arrays={\"w\": w}, metadata={\"lr\": p[\"lr\"]})\n",
        "        ck.make_checkpoint(step, arrays={\"w\": w}, metadata={\"lr\": p[\"lr\"]})\n"
        "    if step == int(os.environ.get(\"KILL_AT\", \"0\")):\n"
        "        os.kill(os.getpid(), 9)\n")
    assert text.count("Offset()") == 1 and "KILL_AT" in text
    train.write_text(text)
    run(["git", "commit", "-qam", "an external_source"], project)

    killed = run(["dvc", "exp", "run", "-n", "s"], project, check=False, env={"KILL_AT": "15"})
    assert killed.returncode != 0 and "s-step10" in exp_rows(project), killed.stderr[-3000:]
    said = refused(project, env={"TRAIN_OFFSET": "1"})
    assert "pipeline 'train': batch 1 after the checkpoint at step 10 (" \
        in said and "external_source callable" in said, said
    done = run(["dvc", "exp", "run"], project)
    assert re.search(r"the [45] batches after the checkpoint at step 10 are those the run "
                     r"it resumes produced",
                     done.stdout + done.stderr), done.stdout + done.stderr

    run(["dvc", "exp", "apply", "s-step10"], project)
    shutil.rmtree(project / ".dvc" / "tmp" / "dvc-dali" / "batches")
    said = refused(project, "-S", "train.lr=0.05", env={"TRAIN_OFFSET": "1"})
    assert "batch 1 after the checkpoint at step 10 (" in said, said


def as_left_by(output: str, how: str) -> str:
    """One output's digest as another device or release would have left it:
    ``device`` an older release's device sum (unnamed g), ``later`` a later
    release's algorithm, ``older`` an older release's unnamed host CRC-32."""
    head, data = output.rsplit("/", 1)
    value = data.split(":")[-1] if ":" in data else data[1:]
    wide = value.rjust(16, "0")
    return head + "/" + {"device": "g" + wide, "later": f"mix64:{wide}",
                         "older": f"c{value}"}[how]


def test_digests_of_another_kind_or_algorithm_are_not_verified_never_proven(project):
    """Killed between two checkpoints, its recorded digests rewritten as the
    other device (batches 1-2), a later release (3) and an older one on the
    CPU (4: the same CRC-32, unnamed) would leave them: doctor --verify and
    the resume say which batches are not verified and why, never the proof."""
    lean = ["-S", "train.steps=30"]
    killed = run(["dvc", "exp", "run", "-n", "k", *lean], project, check=False, env={KILL: "25"})
    assert killed.returncode != 0 and "k-step20" in exp_rows(project), killed.stderr[-3000:]
    log_id = manifest(project / "checkpoint")["pipelines"]["train"]["batches"]["log"]
    path = project / ".dvc" / "tmp" / "dvc-dali" / "batches" / f"{log_id}.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    assert len(lines) >= 4, lines  # steps 21-24 (25's may be lost at the kill)
    for rec, how in zip(lines, ("device", "device", "later", "older")):
        rec["d"] = [as_left_by(output, how) for output in rec["d"]]
    path.write_text("".join(json.dumps(rec) + "\n" for rec in lines))

    ws = run(["dvc-dali", "doctor", "--verify"], project, check=False)
    assert re.search(r"--   checkpoint \(workspace\), pipeline 'train': the batches recorded "
                     r"after step 20: batches 1-3 not verified \(recorded by another digest "
                     r"algorithm\); batch(es)? 4(-5)? matched; so not proven exact", ws.stdout), \
        ws.stdout
    assert "reproduced exactly" not in ws.stdout, ws.stdout
    done = run(["dvc", "exp", "run", *lean], project)
    said = done.stdout + done.stderr
    assert "resuming from step 20" in said, said
    assert re.search(r"pipeline 'train': batch digests of the [45] batches after the "
                     r"checkpoint at step 20: batches 1-3 not verified \(recorded by another "
                     r"digest algorithm\); batch(es)? 4(-5)? matched; so this resume is not "
                     r"proven exact", said), said
    assert said.count("not verified") == 1, said  # said once
    assert "are those the run it resumes produced" not in said, said


def test_doctor_verify_without_a_checkpoint_says_there_is_nothing_to_verify(tmp_path):
    """Before any run (and with an empty checkpoint directory) --verify says
    the workspace holds no checkpoint; it ended in a traceback
    (AttributeError: 'NoneType' object has no attribute 'manifest')."""
    project = template_project(tmp_path)
    for _ in range(2):
        out = run(["dvc-dali", "doctor", "--verify"], project, check=False)
        assert "Traceback" not in out.stderr, out.stderr
        assert ("checkpoint (workspace): not verified, it holds no dvc-dali checkpoint"
                in out.stdout), out.stdout + out.stderr
        (project / "checkpoint").mkdir(exist_ok=True)


MADE = {  # what the companion file is made into between the kill and the resume -> said
    "a FIFO": "is not a regular file (not read)",  # waited on for ever, then "no digests"
    # its first line cut short (a full disk, a crash): read as one torn line and ignored,
    # so the resume said no batch had followed the checkpoint
    "a torn first line": "holds no complete line",
}


@pytest.mark.parametrize("how", list(MADE))
def test_a_companion_file_made_a_fifo_or_torn_is_said_and_never_waited_on(project, how):
    """Killed between two checkpoints, its companion file replaced by a FIFO:
    the resume waited on it for ever (writing its digests on), and doctor
    --verify said no digests were recorded; cut to a part of its first line,
    both said no batch had followed the checkpoint. Now both name the file
    and why its batches are not verified, and the run goes on."""
    lean = ["-S", "train.steps=30"]
    killed = run(["dvc", "exp", "run", "-n", "f", *lean], project, check=False, env={KILL: "25"})
    assert killed.returncode != 0 and "f-step20" in exp_rows(project), killed.stderr[-3000:]
    log_id = manifest(project / "checkpoint")["pipelines"]["train"]["batches"]["log"]
    rel = Path(".dvc") / "tmp" / "dvc-dali" / "batches" / f"{log_id}.jsonl"
    first = (project / rel).read_bytes().split(b"\n")[0]
    (project / rel).unlink()
    if how == "a FIFO":
        os.mkfifo(project / rel)
    else:
        (project / rel).write_bytes(first[:len(first) // 2])
    ws = run(["dvc-dali", "doctor", "--verify"], project, check=False, timeout=300)
    assert f"the batch digests after step 20: {rel} {MADE[how]}" in ws.stdout, ws.stdout
    assert "the batches past those read from it are not verified" in ws.stdout, ws.stdout
    assert "no batch digests recorded" not in ws.stdout, ws.stdout
    done = run(["dvc", "exp", "run", *lean], project, timeout=300)
    said = done.stdout + done.stderr
    assert "resuming from step 20" in said and "Traceback" not in said, said
    assert f"{rel} {MADE[how]}" in said and "are not verified" in said, said
    assert "are those the run it resumes produced" not in said, said
    assert "no digest of a batch after the checkpoint" not in said, said
    assert "f-step30" in exp_rows(project)
