"""resume.decide: what a rerun does with the checkpoint it finds, as a table.

Each bullet of the guide "Resume semantics" (docs/guides/resume.md) is at
least one row (the pipeline-may-not-change half of the first is checked
when a pipeline is built: tests/integration/test_bad_inputs.py), then
malformed manifests: any JSON value where the manifest's ``step``, ``run``
field or its parts belong (null ``run`` or ``run.total_steps`` reads as
absent, as manifest_schema does).
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from dvc_dali.core.errors import CheckpointCorruptError
from dvc_dali.training.resume import (
    FRESH,
    NOTHING,
    RESTART,
    RESUME,
    ResumeDecision,
    decide,
    param_changes,
)

CK = "checkpoint"
MANIFEST = "checkpoint/step-000000010-0123abcd/manifest.json"
LR1, LR2 = {"lr": 0.1}, {"lr": 0.2}


def run(params=LR1, total=10):
    return {"params": params, "total_steps": total}


NOTHING_SAID = (
    "checkpoint holds a finished run (step {step} of {total}) and nothing changed, so there is "
    "nothing to train. Train it further with more steps (`dvc exp run -S {count}="
    "<more than {step}>`), start a new run with other params (`dvc exp run -S ...`), or start "
    "over with `dvc-dali reset`")

# id, saved step, saved run, params now, total_steps now, action, changes, message
ROWS = [
    # "dvc-dali reset" (or nothing saved yet): no checkpoint, a fresh run.
    ("no checkpoint", None, None, LR1, 10, FRESH, (), ""),
    ("no checkpoint, any run field", None, "garbage", LR1, 10, FRESH, (), ""),
    # An unfinished run (step < total_steps) resumes; changed params are said.
    ("unfinished, same params", 5, run(), LR1, 10, RESUME, (), ""),
    ("unfinished, more steps now", 5, run(), LR1, 20, RESUME, (), ""),
    # ... but not when total_steps now is not past its step: it would train
    # nothing, and DVC's experiment would record 3 steps beside a model of 5.
    ("unfinished, fewer steps now than done", 5, run(), LR1, 3, RESTART, (),
     "checkpoint holds step 5 of an unfinished run of 10 steps; total_steps is 3 now, so "
     "resuming it would train nothing: starting a new run from step 0 (the unfinished run's "
     "rows stay recorded; `dvc exp apply <row>` restores one)"),
    ("unfinished, as many steps now as done", 5, run(), LR1, 5, RESTART, (),
     "checkpoint holds step 5 of an unfinished run of 10 steps; total_steps is 5 now, so "
     "resuming it would train nothing: starting a new run from step 0 (the unfinished run's "
     "rows stay recorded; `dvc exp apply <row>` restores one)"),
    ("total_steps never given, now given and not past", 5, run(LR1, None), LR1, 4, RESTART, (),
     "checkpoint holds step 5 of an unfinished run; total_steps is 4 now, so resuming it "
     "would train nothing: starting a new run from step 0 (the unfinished run's rows stay "
     "recorded; `dvc exp apply <row>` restores one)"),
    ("unfinished, one step past done", 5, run(), LR1, 6, RESUME, (), ""),
    ("unfinished, total_steps not given now", 5, run(), LR1, None, RESUME, (), ""),
    ("unfinished, lr changed", 5, run(), LR2, 10, RESUME, ("lr: 0.1 -> 0.2",),
     "resuming checkpoint at step 5 with changed params: lr: 0.1 -> 0.2"),
    ("unfinished, params added and removed", 5, run({"lr": 0.1, "wd": 1}), {"lr": 0.1, "m": "a"},
     10, RESUME, ('m: "<absent>" -> "a"', 'wd: 1 -> "<absent>"'),
     'resuming checkpoint at step 5 with changed params: m: "<absent>" -> "a"; '
     'wd: 1 -> "<absent>"'),
    ("unfinished, nested param changed", 5, run({"opt": {"b": [1, 2]}}), {"opt": {"b": [1, 3]}},
     10, RESUME, ('opt: {"b": [1, 2]} -> {"b": [1, 3]}',),
     'resuming checkpoint at step 5 with changed params: opt: {"b": [1, 2]} -> {"b": [1, 3]}'),
    ("total_steps never given: never finished", 50, run(LR1, None), LR2, None, RESUME,
     ("lr: 0.1 -> 0.2",), "resuming checkpoint at step 50 with changed params: lr: 0.1 -> 0.2"),
    # `dvc exp apply <row>` then a run: that row's checkpoint, mid-run, resumes.
    ("applied row at step 3", 3, run(), LR1, 10, RESUME, (), ""),
    # A finished run continues only with the same params and >= total_steps...
    ("finished, same params, more steps: trains further", 10, run(), LR1, 15, RESUME, (), ""),
    # ... and with nothing changed there is nothing to train (refused under dvc exp run).
    ("finished, same params, same steps: nothing to train", 10, run(), LR1, 10, NOTHING, (),
     NOTHING_SAID.format(step=10, total=10, count="<steps param>")),
    ("past its total, same params, same steps", 12, run(), LR1, 12, NOTHING, (),
     NOTHING_SAID.format(step=12, total=10, count="<steps param>")),
    # the param that is the step count is named (it was a placeholder: found by a sweep)
    ("finished, nothing changed, the count a param", 10, run({"train.steps": 10, **LR1}),
     {"train.steps": 10, **LR1}, 10, NOTHING, (),
     NOTHING_SAID.format(step=10, total=10, count="train.steps")),
    # ... anything else starts a new run from step 0.
    ("finished, fewer steps", 10, run(), LR1, 8, RESTART, (),
     "checkpoint holds a finished run (step 10 of 10); total_steps is 8, fewer than 10: "
     "starting a new run from step 0 (the finished one stays recorded)"),
    ("finished, total_steps not given now", 10, run(), LR1, None, RESTART, (),
     "checkpoint holds a finished run (step 10 of 10); total_steps is None, fewer than 10: "
     "starting a new run from step 0 (the finished one stays recorded)"),
    ("finished, lr changed", 10, run(), LR2, 20, RESTART, ("lr: 0.1 -> 0.2",),
     "checkpoint holds a finished run (step 10 of 10); params changed (lr: 0.1 -> 0.2): "
     "starting a new run from step 0 (the finished one stays recorded)"),
    ("past its total, lr changed", 12, run(), LR2, 12, RESTART, ("lr: 0.1 -> 0.2",),
     "checkpoint holds a finished run (step 12 of 10); params changed (lr: 0.1 -> 0.2): "
     "starting a new run from step 0 (the finished one stays recorded)"),
    # The stage's params as the run's (Checkpointer's default under `dvc exp
    # run`) include the step count: raising it trains further...
    ("finished, the steps param raised with total_steps", 10,
     run({"train.lr": 0.1, "train.steps": 10}), {"train.lr": 0.1, "train.steps": 20}, 20, RESUME,
     (), "resuming checkpoint at step 10 to train to step 20 (train.steps: 10 -> 20)"),
    ("unfinished, the steps param raised with total_steps, lr changed", 5,
     run({"train.lr": 0.1, "train.steps": 10}), {"train.lr": 0.05, "train.steps": 20}, 20,
     RESUME, ("train.lr: 0.1 -> 0.05",),
     "resuming checkpoint at step 5 to train to step 20 (train.steps: 10 -> 20) with changed "
     "params: train.lr: 0.1 -> 0.05"),
    # ... while any other param change after the end is a new run.
    ("finished, the steps param raised and lr changed", 10,
     run({"train.lr": 0.1, "train.steps": 10}), {"train.lr": 0.05, "train.steps": 20}, 20,
     RESTART, ("train.lr: 0.1 -> 0.05",),
     "checkpoint holds a finished run (step 10 of 10); params changed (train.lr: 0.1 -> 0.05): "
     "starting a new run from step 0 (the finished one stays recorded)"),
    ("finished, a param that only happens to equal the step count", 10,
     run({"a": 10, "b": 1}), {"a": 5, "b": 1}, 20, RESTART, ("a: 10 -> 5",),
     "checkpoint holds a finished run (step 10 of 10); params changed (a: 10 -> 5): "
     "starting a new run from step 0 (the finished one stays recorded)"),
    # Parts of the run field that may be absent or not a step count.
    ("empty run field: nothing to compare", 10, {}, LR2, None, RESUME, (), ""),
    ("run without params", 10, {"total_steps": 10}, LR2, 10, RESUME, (), ""),
    ("run without total_steps", 10, {"params": LR1}, LR2, 20, RESUME, ("lr: 0.1 -> 0.2",),
     "resuming checkpoint at step 10 with changed params: lr: 0.1 -> 0.2"),
    ("total_steps null: never finished", 10, run(LR1, None), LR1, None, RESUME, (), ""),
    ("run field absent (None)", 10, None, LR2, None, RESUME, (), ""),
    ("odd saved param values", 5, run({"a": None, "b": 1e308, "c": [], "d": True}),
     {"a": None, "b": 1e308, "c": [], "d": True}, 10, RESUME, (), ""),
    ("param set to null equals an absent one", 5, run({"a": None}), {}, 10, RESUME, (), ""),
    ("int keys now, str keys saved", 5, run({"1": 2}), {1: 2}, 10, RESUME,
     ('1: "<absent>" -> 2', '1: 2 -> "<absent>"'),
     'resuming checkpoint at step 5 with changed params: 1: "<absent>" -> 2; '
     '1: 2 -> "<absent>"'),
]

# Malformed manifests: id, saved step, saved run, the field the error names.
JSON_NOT_OBJECTS = [0, -1, "", "run", [], [{}], True, False, 1e308]
MALFORMED = [
    *[(f"run is {v!r}", 5, v, "run") for v in JSON_NOT_OBJECTS],
    *[(f"run.params is {v!r}", 5, {"params": v, "total_steps": 10}, "run.params")
      for v in [None, *JSON_NOT_OBJECTS]],
    *[(f"run.total_steps is {v!r}", 5, run(LR1, v), "run.total_steps")
      for v in (-1, "", "10", [], {}, True, False, 1e308, 10.0, float("nan"))],
    *[(f"step is {v!r}", v, run(), "step") for v in (True, False, -1, 1.5, 1e308, "5", [], {})],
]


@pytest.mark.parametrize("step,saved_run,params,total,action,changes,message",
                         [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_decision(step, saved_run, params, total, action, changes, message):
    got = decide(step, saved_run, params, total, checkpoint=CK, manifest=MANIFEST)
    assert got == ResumeDecision(action, changes, message)


@pytest.mark.parametrize("step,saved_run,field",
                         [pytest.param(*row[1:], id=row[0]) for row in MALFORMED])
def test_malformed_manifest_is_corrupt(step, saved_run, field):
    with pytest.raises(CheckpointCorruptError) as err:
        decide(step, saved_run, LR1, 10, checkpoint=CK, manifest=MANIFEST)
    assert str(err.value).startswith(f"{MANIFEST}: field {field!r} is ")
    assert "dvc-dali reset" in str(err.value)


def test_decision_is_frozen():
    with pytest.raises(FrozenInstanceError):
        decide(None, None, {}, None, checkpoint=CK, manifest=MANIFEST).action = RESUME


def test_param_changes_shows_values_json_cannot_write():
    assert param_changes({"x": 1}, {"x": {1, 2}}) == ["x: 1 -> \"{1, 2}\""]


SAID = NOTHING_SAID.format(step=4, total=4, count="steps")
STAGE = {"train.steps": 4, "train.batch_size": 4, "train.lr": 0.1, "train.flag": True}


@pytest.mark.parametrize("stage, total, count", [
    # found by two sweeps: the script's own key ("steps"), which DVC refuses to set,
    # or the placeholder where a batch size of 4 equalled 4 steps
    (STAGE, 4, "train.steps"),
    ({"train.steps": 4, "train.lr": 0.1}, 4, "train.steps"),
    ({"n_iter": 4}, 4, "n_iter"),
    ({"a.max_steps": 4, "a.warmup_steps": 4}, 4, "steps"),  # which: not told, left as it was
    ({"train.flag": True}, 1, "steps"),  # a bool is no count
    ({}, 4, "steps"),
])
def test_the_hint_names_the_stages_steps_param(stage, total, count):
    from dvc_dali.training.resume import name_steps_param

    assert name_steps_param(SAID, stage, total) == NOTHING_SAID.format(step=4, total=4,
                                                                       count=count)


@pytest.mark.parametrize("saved_run,started", [
    ({"params": {}, "started": 1764766800.5}, 1764766800.5),
    ({"started": 1764766800}, 1764766800.0),
    ({"params": {}}, None),  # an older release's checkpoint
    (None, None), ("run", None), ({"started": "yesterday"}, None), ({"started": True}, None),
    ({"started": float("nan")}, None), ({"started": float("inf")}, None),
])
def test_the_runs_start_is_read_where_it_is_a_number(saved_run, started):
    """Retention prunes the rows made since the run began; where that is not
    known, every row of the run's name, as before."""
    from dvc_dali.training.resume import run_started

    assert run_started(saved_run) == started
