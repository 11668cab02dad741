"""Two checkpoint stages in one dvc.yaml, the second depending on the
first's output: the second killed, the first finished. Real `dvc exp run`,
one project for the module; a Checkpointer over arrays only (no pipeline:
what is tested is which stage is refused, resumed and recorded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dvc_dali.reading.exp_refs import parse_lineage

from tests.helpers.dvc_project import make_project, run
from tests.helpers.rows import row_refs

TRAIN = """\
import os, sys
import numpy as np
import dvc_dali
name = sys.argv[1]
ck = dvc_dali.Checkpointer(f"ck-{name}", params={"steps": 4}, total_steps=4)
w = ck.arrays.get("w", np.zeros(2))
os.makedirs(f"model-{name}", exist_ok=True)
for step in range(ck.step + 1, 5):
    w = w * 2 + step
    np.save(f"model-{name}/w.npy", w)
    if step % 2 == 0:
        ck.make_checkpoint(step, arrays={"w": w})
        if os.environ.get("KILL_AT") == f"{name}:{step}":
            os.kill(os.getpid(), 9)
"""

DVC_YAML = """\
stages:
  train-a:
    cmd: python train.py a
    deps: [train.py]
    outs:
      - ck-a:
          persist: true
          checkpoint: true
      - model-a
    always_changed: true
  train-b:
    cmd: python train.py b
    deps: [train.py, model-a]
    outs:
      - ck-b:
          persist: true
          checkpoint: true
      - model-b
    always_changed: true
"""


def exp_run(project: Path, *args: str, env: dict | None = None, check: bool = True):
    return run([sys.executable, "-m", "dvc", "exp", "run", *args], project, env=env,
               check=check)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_project(tmp_path_factory.mktemp("stages") / "p",
                        files={"train.py": TRAIN, "dvc.yaml": DVC_YAML})


@pytest.fixture(scope="module")
def resumed(project) -> subprocess.CompletedProcess:
    """`dvc exp run -n two` killed in train-b; then `dvc exp run` again (the
    finished train-a's refusal); then train-b resumed alone."""
    assert exp_run(project, "-n", "two", env={"KILL_AT": "b:2"}, check=False).returncode != 0
    refused = exp_run(project, check=False)
    exp_run(project, "-s", "train-b")
    return refused


def test_a_killed_downstream_stage_is_resumed_alone_as_the_finished_ones_refusal_says(
        project, resumed):
    """`dvc exp run` ran the finished train-a first, whose refusal stopped it
    before train-b; the refusal named only what resets both stages."""
    refused = resumed
    assert refused.returncode != 0
    line = next(x for x in refused.stderr.splitlines() if "UnchangedCheckpointError" in x)
    assert "`dvc exp run -s train-b`" in line and "reset --stage train-a`" in line
    uninterrupted = 0.0
    for step in range(1, 5):
        uninterrupted = uninterrupted * 2 + step
    assert np.load(project / "model-b" / "w.npy")[0] == uninterrupted
    refs = row_refs(project)
    b_rows = {}
    for name, (ref, _) in refs.items():
        fields = parse_lineage(run(["git", "log", "-1", "--format=%B", ref], project).stdout)
        b_rows.setdefault(fields["stage"], []).append((int(fields["step"]), fields["exp"]))
    assert sorted(b_rows["dvc.yaml:train-b"]) == [(2, "two"), (4, "two")]
    assert sorted(b_rows["dvc.yaml:train-a"]) == [(2, "two"), (4, "two")]


def test_show_names_the_stage_of_each_tree_of_one_experiment_name(project, resumed):
    """Both stages' runs are named after the experiment: `dvc-dali show`
    drew two trees headed "two" and no stage."""
    shown = run([sys.executable, "-m", "dvc_dali", "show"], project).stdout
    heads = sorted(line for line in shown.splitlines() if line.startswith("two "))
    assert len(heads) == 2, shown
    assert "(stage dvc.yaml:train-a, " in heads[0] and "(stage dvc.yaml:train-b, " in heads[1]
