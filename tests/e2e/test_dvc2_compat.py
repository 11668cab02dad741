"""The same training script under DVC 2.58, where `checkpoint: true` is native.

DVC 2.x sets DVC_CHECKPOINT=1 for a stage with a `checkpoint: true` output and
runs a watcher thread that, each time `.dvc/tmp/DVC_CHECKPOINT` appears,
caches the outputs, writes dvc.lock, commits the next link of the
experiment's checkpoint chain and deletes the file. `Checkpointer.
make_checkpoint` must speak that protocol and leave the recording to DVC 2:
our DVC 3 recorder (dvc_dali.recording) must not run, not even its stage
check in `Checkpointer.__init__`.

DVC 2.58 lives in a virtual environment of its own (built once, cached,
from the repository's pins, tests/dvc2-requirements.txt); the stage command
is this interpreter, which has dvc_dali and DALI. Set DVC_DALI_DVC2_VENV to
choose where the environment is kept. The tests skip only where pip cannot
install DVC 2.58 (no package index, no build for this Python).
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.dvc2_venv import REPO, Dvc2InstallError, Dvc2Unavailable, ensure_dvc2
from tests.helpers.dvc_project import make_project

LOG = "dvc2_log.jsonl"  # what train.py says about itself, one JSON object a line
LINEAGE_KEY = "dvc-dali-checkpoint:"  # in the message of every commit our recorder makes

# Variables that `dvc exp run` sets for its stage: if this suite itself runs
# inside a DVC stage they must not leak into the DVC 2 runs below.
_DVC_RUN_VARS = ("DVC_CHECKPOINT", "DVC_ROOT", "DVC_STAGE", "DVC_EXP_NAME",
                 "DVC_EXP_BASELINE_REV", "DVCLIVE_RESUME", "DVC_DALI_SIGNAL_FILE",
                 "DVC_DALI_SIGNAL_TIMEOUT", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")

TRAIN_PY = '''\
import hashlib, json, os, sys, time
from pathlib import Path

import numpy as np
import yaml
from nvidia.dali import fn, pipeline_def, types

import dvc_dali


def log(**event):
    with open("{log}", "a") as fh:
        fh.write(json.dumps(event) + "\\n")


@pipeline_def
def images(root):
    jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="reader")
    decoded = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
    angle = fn.random.uniform(range=(-30.0, 30.0), name="angle")
    rotated = fn.rotate(decoded, angle=angle, fill_value=0, keep_size=True)
    return fn.resize(rotated, size=(8, 8)), labels, angle


total = int(os.environ.get("TRAIN_STEPS")
            or yaml.safe_load(Path("params.yaml").read_text())["train"]["steps"])
ck = dvc_dali.Checkpointer("checkpoint", params={{"lr": 0.1}}, total_steps=total)
log(event="start", resumed=ck.resumed, step=ck.step, total=total,
    env={{k: v for k, v in os.environ.items() if k.startswith("DVC")}},
    recorder_imported="dvc_dali.recording" in sys.modules)
if ck.resumed:
    print(f"resumed at step {{ck.step}}", flush=True)
    assert ck.arrays["w"].tolist() == [ck.step] * 3, ck.arrays
pipe = ck.pipeline("train", images, root="data/images", batch_size=2, num_threads=1,
                   device_id=None, seed=1)
for step in range(ck.step + 1, total + 1):
    batch = pipe.run()
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(out.as_array()).tobytes()
                                     for out in batch)).hexdigest()
    Path("metrics.json").write_text(json.dumps({{"step": step}}))
    start = time.perf_counter()
    ck.make_checkpoint(step, arrays={{"w": np.full(3, step)}})
    blocked = time.perf_counter() - start
    log(event="checkpoint", step=step, blocked_s=blocked, batch=digest)
log(event="end", recorder_imported="dvc_dali.recording" in sys.modules,
    dvc_imported="dvc" in sys.modules)
'''.format(log=LOG)


# --------------------------------------------------------------------------
# DVC 2.58 in a virtual environment of its own
# --------------------------------------------------------------------------

@pytest.fixture(scope="session")
def dvc2() -> Path:
    """The `dvc` executable of DVC 2.58, installing it on first use (tests/helpers/dvc2_venv.py)."""
    try:
        return ensure_dvc2()
    except Dvc2Unavailable as exc:
        pytest.skip(str(exc))
    except Dvc2InstallError as exc:
        pytest.fail(str(exc))


# --------------------------------------------------------------------------
# a DVC 2 project in a temporary git repo
# --------------------------------------------------------------------------

def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _DVC_RUN_VARS}
    env.update({"PYTHONPATH": str(REPO), "DVC_NO_ANALYTICS": "1", **(extra or {})})
    return env


def _run(cmd: list, cwd: Path, check: bool = True, env: dict | None = None,
         timeout: float = 120):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          env=_env(env), timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {proc.returncode} in {cwd}\n"
                             f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
                             f"{proc.stderr[-4000:]}")
    return proc


def _git(cwd: Path, *args: str) -> str:
    return _run(["git", *args], cwd).stdout.strip()


def _write_images(root: Path) -> None:
    """12 real JPEGs, 2 classes, sizes differ so a wrong sample shows."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(2):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(6):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (16, 16 + i, 3), dtype=np.uint8)).save(
                buf, format="JPEG", quality=90)
            (folder / f"{i:02d}.jpg").write_bytes(buf.getvalue())


def _write_project(path: Path, steps: int, outs_entry: str) -> None:
    path.mkdir(exist_ok=True)
    _write_images(path / "data" / "images")
    (path / "train.py").write_text(TRAIN_PY)
    (path / "params.yaml").write_text(f"train:\n  steps: {steps}\n")
    cmd = f"{shlex.quote(sys.executable)} train.py"
    (path / "dvc.yaml").write_text(f"""\
stages:
  train:
    cmd: {json.dumps(cmd)}
    deps: [train.py, data]
    params: [train.steps]
    outs:
{outs_entry}
    metrics:
      - metrics.json:
          cache: false
""")
    (path / ".gitignore").write_text(f"{LOG}\n__pycache__/\n")


def _dvc2_project(dvc2: Path, path: Path, steps: int, outs_entry: str) -> Path:
    # the shared factory's git repository; DVC 2's own `dvc init`, not this DVC 3's
    make_project(path, dvc_init=False, message=None)
    _run([dvc2, "init", "-q"], path)
    _run([dvc2, "config", "core.analytics", "false"], path)
    _run([dvc2, "config", "core.check_update", "false"], path)
    _write_project(path, steps, outs_entry)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "init")
    return path


def _log(path: Path) -> list[dict]:
    if not (path / LOG).is_file():
        return []
    return [json.loads(line) for line in (path / LOG).read_text().splitlines()]


def _experiments(dvc2: Path, path: Path) -> dict[str, list[dict]]:
    """{experiment name: revs, tip first} from DVC 2's `exp show --json`.

    DVC 2.58's format: a list of baseline nodes; each node's "experiments" is
    a list of {"name", "executor", "revs"}, revs being the checkpoint chain
    from its tip down to the first checkpoint, each with "rev", "name" and
    "data" (params, metrics, deps, outs)."""
    shown = json.loads(_run([dvc2, "exp", "show", "--json"], path).stdout)
    exps = {exp["name"]: exp["revs"] for node in shown for exp in (node.get("experiments") or [])}
    for revs in exps.values():
        assert all(r.get("error") is None for r in revs), revs
    return exps


def _checkpoints(path: Path, revs: list[dict], baseline: str) -> list[tuple[str, int]]:
    """[(commit, step), ...] oldest first: the checkpoints of one experiment's chain.

    Each DVC 2 run ends with one more commit whose tree equals the last
    checkpoint's (the experiment's result): not a checkpoint, left out."""
    shas = [r["rev"] for r in revs]
    # A chain: every rev's parent is the next one, the last one's the baseline.
    for sha, parent in zip(shas, shas[1:] + [baseline]):
        assert _git(path, "rev-parse", f"{sha}^") == parent, (sha, shas)
    out = []
    for rev in reversed(revs):
        sha = rev["rev"]
        tree, parent_tree = (_git(path, "rev-parse", f"{r}^{{tree}}") for r in (sha, f"{sha}^"))
        if tree == parent_tree:
            continue
        step = rev["data"]["metrics"]["metrics.json"]["data"]["step"]
        # the commit holds what train.py wrote before make_checkpoint(step)
        assert json.loads(_git(path, "show", f"{sha}:metrics.json")) == {"step": step}
        out.append((sha, step))
    return out


def _assert_not_ours(path: Path, proc: subprocess.CompletedProcess) -> None:
    """Nothing of our DVC 3 recorder: no import, no commits, no messages."""
    ours = _git(path, "log", "--all", "--format=%H %s", f"--grep={LINEAGE_KEY}")
    assert ours == "", f"dvc_dali recorded commits under DVC 2:\n{ours}"
    for stream in (proc.stdout, proc.stderr):
        assert "dvc-dali" not in stream and "dvc_dali" not in stream, stream[-3000:]
    for event in _log(path):
        if "recorder_imported" in event:  # also proves Checkpointer() ran no stage check
            assert event["recorder_imported"] is False, f"recording imported: {event}"
        if "dvc_imported" in event:
            assert event["dvc_imported"] is False, f"DVC 3 imported in a DVC 2 stage: {event}"
    assert not (path / ".dvc" / "tmp" / "DVC_CHECKPOINT").exists()


# --------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------

CHECKPOINT_OUT = """\
      - checkpoint:
          checkpoint: true
"""


def test_dvc2_watcher_records_and_resumes(dvc2, tmp_path, record_property):
    path = _dvc2_project(dvc2, tmp_path / "proj", steps=2, outs_entry=CHECKPOINT_OUT)
    baseline = _git(path, "rev-parse", "HEAD")

    # --- run 1: two checkpoints, recorded by DVC 2's watcher -------------
    first = _run([dvc2, "exp", "run"], path)
    assert first.stdout.count("Checkpoint experiment iteration") == 2, first.stdout
    start = _log(path)[0]
    assert start["event"] == "start" and not start["resumed"], start
    assert start["env"].get("DVC_CHECKPOINT") == "1", start  # DVC 2's checkpoint mode
    assert Path(start["env"].get("DVC_ROOT", "")).resolve() == path.resolve(), start
    assert "DVC_STAGE" not in start["env"], start  # DVC 2 never sets it
    _assert_not_ours(path, first)
    exps = _experiments(dvc2, path)
    assert len(exps) == 1, exps
    (name, revs), = exps.items()
    assert [step for _, step in _checkpoints(path, revs, baseline)] == [1, 2]

    # --- run 2: more steps, params unchanged: DVC 2 resumes the same chain
    second = _run([dvc2, "exp", "run"], path, env={"TRAIN_STEPS": "4"})
    assert f"Existing checkpoint experiment '{name}' will be resumed" in second.stdout, \
        second.stdout
    assert "resumed at step 2" in second.stdout, second.stdout
    assert second.stdout.count("Checkpoint experiment iteration") == 2, second.stdout
    _assert_not_ours(path, second)
    exps = _experiments(dvc2, path)
    assert list(exps) == [name], exps
    chain = _checkpoints(path, exps[name], baseline)
    assert [step for _, step in chain] == [1, 2, 3, 4]  # N = 4 checkpoints, one chain

    # --- run 3: a changed param: DVC 2 branches a new experiment off the
    # tip, and the script resumes there (a finished run, trained further)
    third = _run([dvc2, "exp", "run", "-S", "train.steps=6"], path)
    assert f"Modified checkpoint experiment based on '{name}' will be created" \
        in third.stdout, third.stdout
    assert "resumed at step 4" in third.stdout, third.stdout
    _assert_not_ours(path, third)
    exps = _experiments(dvc2, path)
    assert len(exps) == 2 and name in exps, exps
    (branch,) = set(exps) - {name}
    assert _checkpoints(path, exps[name], baseline) == chain  # the old one untouched
    branched = _checkpoints(path, exps[branch], baseline)
    assert branched[:4] == chain
    assert [step for _, step in branched] == [1, 2, 3, 4, 5, 6]
    assert exps[branch][0]["data"]["params"]["params.yaml"]["data"] == {"train": {"steps": 6}}

    events = _log(path)
    starts = [e for e in events if e["event"] == "start"]
    assert [(e["resumed"], e["step"], e["total"]) for e in starts] == \
        [(False, 0, 2), (True, 2, 4), (True, 4, 6)]
    saved = [e for e in events if e["event"] == "checkpoint"]
    assert [e["step"] for e in saved] == [1, 2, 3, 4, 5, 6]

    # make_checkpoint blocked until DVC 2 had recorded the checkpoint (the
    # watcher polls once a second; DESIGN measured 0.7-1.1 s).
    blocked = [round(e["blocked_s"], 3) for e in saved]
    record_property("dvc2_make_checkpoint_blocked_s", blocked)
    print(f"\nDVC 2 make_checkpoint blocked (s): {blocked}")
    assert all(0 < b < 15 for b in blocked), blocked

    # --- the resumed runs produced the batches an uninterrupted run does --
    ref = tmp_path / "reference"
    _write_project(ref, steps=6, outs_entry=CHECKPOINT_OUT)
    _run([sys.executable, "train.py"], ref)  # no DVC around: nothing recorded
    reference = [e["batch"] for e in _log(ref) if e["event"] == "checkpoint"]
    assert [e["batch"] for e in saved] == reference

    # --- every link holds its own complete checkpoint: apply step 3 ------
    _run([dvc2, "exp", "apply", dict((step, sha) for sha, step in chain)[3]], path)
    probe = _run([sys.executable, "-c",
                  "import dvc_dali; c = dvc_dali.Checkpointer('checkpoint'); "
                  "print(c.step, c.arrays['w'].tolist())"], path)
    assert probe.stdout.splitlines()[0] == "3 [3, 3, 3]", probe.stdout + probe.stderr


PERSIST_ONLY_OUT = """\
      - checkpoint:
          persist: true
    always_changed: true
"""


def test_dvc2_without_checkpoint_output_leaves_dvc2_alone(dvc2, tmp_path):
    """Under DVC 2 a stage without `checkpoint: true` gets no recording (DVC 2
    has no in-stage recording), but the run must still succeed untouched."""
    path = _dvc2_project(dvc2, tmp_path / "proj", steps=2, outs_entry=PERSIST_ONLY_OUT)
    proc = _run([dvc2, "exp", "run"], path, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ours = _git(path, "log", "--all", "--format=%H %s", f"--grep={LINEAGE_KEY}")
    assert ours == "", ours
