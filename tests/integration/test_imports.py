"""`import dvc_dali` stays light: no DVC, DALI, torch or JAX until used; and
outside a checkpoint stage's main process it imports no DVC, NumPy or DALI
and installs no hook (`python -X importtime -c 'import dvc_dali'`), in a
stage without `checkpoint: true` and in a spawned worker of a checkpoint
stage too (the worker's parent decided)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO, child_env

HEAVY = ("dvc", "numpy", "nvidia")

# Run as a process of its own: imports dvc_dali, then says what that did.
PROBE = """\
import json, signal, sys
hook, term = sys.excepthook, signal.getsignal(signal.SIGTERM)
import dvc_dali
print(json.dumps({
    "heavy": sorted({m.split(".")[0] for m in sys.modules} & {"dvc", "numpy", "nvidia"}),
    "excepthook": sys.excepthook is not hook,
    "sigterm": signal.getsignal(signal.SIGTERM) != term}))
"""

# A checkpoint stage's script whose main process has not imported dvc_dali
# (it would start the stage): a spawned worker imports it while it prepares
# (as the parent's main module, as a DataLoader worker does) and in its target.
SPAWNING = """\
import json, multiprocessing as mp, signal, sys

def said(tag):
    return {"tag": tag, "heavy": sorted({m.split(".")[0] for m in sys.modules}
                                        & {"dvc", "numpy", "nvidia"}),
            "excepthook": sys.excepthook is not sys.__excepthook__,
            "sigterm": signal.getsignal(signal.SIGTERM) != signal.SIG_DFL,
            "stage_set": "DVC_CHECKPOINT" in __import__("os").environ}

if __name__ == "__mp_main__":
    import dvc_dali  # noqa: F401
    PREPARED = said("prepare")

def target(queue):
    import dvc_dali  # noqa: F401
    queue.put([PREPARED, said("target")])

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(queue,))
    proc.start()
    print(json.dumps(queue.get()))
    proc.join()
"""

DVC_YAML = """\
stages:
  plain:
    cmd: python probe.py
    always_changed: true
  ckpt:
    cmd: python spawning.py
    outs:
    - checkpoint:
        checkpoint: true
        persist: true
    always_changed: true
"""


def _env(**stage: str) -> dict:
    """This interpreter's environment without DVC's variables (the suite may
    run in a stage), plus ``stage``'s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    return child_env({"PYTHONWARNINGS": "ignore", **stage}, base=env)


def _stage_env(project, stage: str) -> dict:
    return _env(DVC_ROOT=str(project), DVC_STAGE=stage, DVC_EXP_NAME="e",
                DVC_EXP_BASELINE_REV="0" * 40)


@pytest.fixture
def project(tmp_path):
    """A directory laid out as a DVC repository with two stages (DVC is not
    run: the stage's environment is what dvc exp run would give)."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "spawning.py").write_text(SPAWNING)
    return tmp_path


def _importtime(cwd, env) -> dict:
    proc = subprocess.run([sys.executable, "-X", "importtime", "probe.py"], cwd=cwd, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert any(line.endswith("| dvc_dali") for line in proc.stderr.splitlines()), proc.stderr
    return json.loads(proc.stdout)


def test_import_dvc_dali_imports_no_heavy_module():
    code = ("import sys, dvc_dali; heavy = [m for m in ('dvc', 'nvidia.dali', 'torch', 'jax', "
            "'dvclive', 'cupy') if m in sys.modules]; print(heavy); assert not heavy")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_import_outside_a_stage_acts_on_nothing(project):
    assert _importtime(project, _env()) == {"heavy": [], "excepthook": False, "sigterm": False}


def test_import_in_a_stage_without_checkpoint_acts_on_nothing(project):
    said = _importtime(project, _stage_env(project, "plain"))
    assert said == {"heavy": [], "excepthook": False, "sigterm": False}


def test_a_spawned_worker_of_a_checkpoint_stage_acts_on_nothing(project):
    proc = subprocess.run([sys.executable, "spawning.py"], cwd=project,
                          env=_stage_env(project, "ckpt"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for said in json.loads(proc.stdout):
        assert said["heavy"] == [] and not said["excepthook"] and not said["sigterm"], said
        assert not said["stage_set"], said


@pytest.mark.parametrize("text, stage, expected", [
    ("stages:\n  t:\n    cmd: x\n", "t", False),  # no `checkpoint` at all: not even parsed
    (DVC_YAML, "plain", False),
    (DVC_YAML, "ckpt", True),
    (DVC_YAML, "dvc.yaml:ckpt", True),
    (DVC_YAML, "other", False),
    ("stages:\n  t:\n    foreach: [1]\n    do:\n      outs:\n      - c:\n"
     "          checkpoint: true\n", "t@0", False),  # as DVC's raw lookup: no entry 't@0'
    ("stages: [checkpoint: {\n", "t", None),  # does not parse: DVC decides
], ids=["no checkpoint word", "another stage's", "its own", "with its path", "no such stage",
        "foreach", "not YAML"])
def test_the_stage_is_told_from_its_dvc_yaml(text, stage, expected):
    from dvc_dali.training.stage_start import declares_checkpoint

    assert declares_checkpoint([text], stage.rpartition(":")[2]) is expected


def test_no_dvc_yaml_leaves_it_to_dvc():
    from dvc_dali.training.stage_start import declares_checkpoint

    assert declares_checkpoint([], "t") is None


def test_candidate_files_walk_up_to_the_root(tmp_path):
    from dvc_dali.training.stage_start import candidate_files

    root = str(tmp_path)
    sub = os.path.join(root, "a", "b")
    assert candidate_files("a/dvc.yaml:t", sub, root) == [
        os.path.join(root, "a", "b", "dvc.yaml"), os.path.join(root, "a", "dvc.yaml"),
        os.path.join(root, "dvc.yaml")]
    assert candidate_files("t", root, None) == [os.path.join(root, "dvc.yaml")]


def test_stage_start_names_the_signal_as_context_does():
    from dvc_dali.core import context
    from dvc_dali.training import stage_start

    assert stage_start.SIGNAL_NAME == context.SIGNAL_NAME


def test_stage_start_imports_only_the_standard_library_at_its_top():
    source = (REPO / "dvc_dali" / "training" / "stage_start.py").read_text()
    top = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert top == ["from __future__ import annotations", "import os", "import sys",
                   "from typing import Any, Mapping, Optional"], textwrap.shorten(str(top), 200)
