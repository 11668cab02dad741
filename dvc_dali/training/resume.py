"""What a rerun does with the checkpoint it finds: resume it, or start anew.

Pure: plain data in (the saved step, the manifest's ``run`` field, the
params and total_steps given now), a decision out. No DALI, DVC or files,
so each case of the guide "Resume semantics" (docs/guides/resume.md) is
one row of a table test (tests/unit/test_resume_decision.py).

- No checkpoint: ``fresh``.
- An unfinished run (step < its total_steps, or total_steps unknown):
  ``resume``, saying which params changed (the pipeline is checked later,
  when it is built); ``restart`` from step 0 when total_steps given now is
  not past its step (resuming would train nothing, and DVC's experiment
  would record the new step count beside a model trained further).
- A finished run (step >= its total_steps): ``resume`` with the same params
  and more total_steps; ``nothing`` with the same params and total_steps (a
  rerun under `dvc exp run` is refused: it would train nothing and add an
  experiment each time); otherwise ``restart`` from step 0 (the finished run
  stays recorded as experiments).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.errors import CheckpointCorruptError

FRESH = "fresh"
RESUME = "resume"
RESTART = "restart"
NOTHING = "nothing"

_FIX = ("restore an earlier checkpoint with `dvc exp apply <row>`, or start over with "
        "`dvc-dali reset`")


@dataclass(frozen=True)
class ResumeDecision:
    """``action`` is FRESH, RESUME or RESTART; ``changes`` the changed params
    ("lr: 0.1 -> 0.2", sorted by name); ``message`` what to log ("" when
    there is nothing worth saying)."""

    action: str
    changes: tuple[str, ...] = ()
    message: str = ""


def param_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """'name: old -> new' for each param that differs, values as JSON."""
    def show(params: Mapping[str, Any], key: Any) -> str:
        # default=str: a value json cannot write is still shown, not raised on
        return json.dumps(params.get(key, "<absent>"), default=str)

    # Keys as text: str keys sort as plainly; int keys given now (JSON saved
    # them as str) sort beside them instead of raising.
    keys = sorted(set(old) | set(new), key=lambda k: (str(k), type(k).__name__))
    return [f"{k}: {show(old, k)} -> {show(new, k)}" for k in keys if old.get(k) != new.get(k)]


def _corrupt(manifest: str, field: str, value: Any, expected: str) -> CheckpointCorruptError:
    # Worded as manifest_schema's errors: the reader checks these fields too.
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return CheckpointCorruptError(f"{manifest}: field {field!r} is {shown}, expected "
                                  f"{expected}: {_FIX}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _saved_run(saved_run: Any, manifest: str) -> tuple[dict[str, Any] | None, int | None]:
    """(saved params, None if not recorded; saved total_steps, None if not given)."""
    if saved_run is None:  # absent or null: a run saved without params or total_steps
        return None, None
    if not isinstance(saved_run, dict):
        raise _corrupt(manifest, "run", saved_run, "an object")
    params = saved_run.get("params")
    if "params" in saved_run and not isinstance(params, dict):
        raise _corrupt(manifest, "run.params", params, "an object")
    total = saved_run.get("total_steps")
    if total is not None and not _is_count(total):
        raise _corrupt(manifest, "run.total_steps", total, "a non-negative integer or null")
    return params, total


def run_started(saved_run: Any) -> float | None:
    """When the run a checkpoint is of began (its manifest's ``run.started``);
    None where it is not a number (an older release wrote none): retention
    then reads every row of the run's name as the run's, as it did."""
    started = saved_run.get("started") if isinstance(saved_run, dict) else None
    if isinstance(started, bool) or not isinstance(started, (int, float)):
        return None
    return float(started) if math.isfinite(started) else None


def _step_count_keys(old: Mapping[str, Any], new: Mapping[str, Any], saved_total: int | None,
                     total_steps: int | None) -> set[str]:
    """Params that are the step count itself (such as ``train.steps``, when
    the stage's params are the run's): raising it trains further, it is not
    another run."""
    if saved_total is None or total_steps is None:
        return set()
    return {str(k) for k in set(old) & set(new)
            if _is_count(old[k]) and old[k] == saved_total and new[k] == total_steps}


def decide(saved_step: int | None, saved_run: Any, params: Mapping[str, Any],
           total_steps: int | None, *, checkpoint: str, manifest: str) -> ResumeDecision:
    """Decide what a run does with a saved checkpoint.

    ``saved_step`` is None when there is no checkpoint; ``saved_run`` is the
    manifest's ``run`` field (None when absent), any JSON value: a malformed
    one raises :class:`CheckpointCorruptError` naming ``manifest`` and the
    field. ``checkpoint`` names the directory in the messages.
    """
    if saved_step is None:
        return ResumeDecision(FRESH)
    if not _is_count(saved_step):
        raise _corrupt(manifest, "step", saved_step, "a non-negative integer")
    old_params, saved_total = _saved_run(saved_run, manifest)
    every = tuple(param_changes(old_params, params)) if old_params is not None else ()
    steps_keys = _step_count_keys(old_params or {}, params, saved_total, total_steps)
    # the step count raised is the same run trained further, not another param
    steps = tuple(c for c in every if c.split(": ", 1)[0] in steps_keys)
    changes = blocking = tuple(c for c in every if c not in steps)
    finished = saved_total is not None and saved_step >= saved_total
    if finished and (blocking or total_steps is None or total_steps < saved_step):
        why = (f"params changed ({'; '.join(blocking)})" if blocking else
               f"total_steps is {total_steps}, fewer than {saved_step}")
        return ResumeDecision(RESTART, changes, (
            f"{checkpoint} holds a finished run (step {saved_step} of {saved_total}); {why}: "
            "starting a new run from step 0 (the finished one stays recorded)"))
    if finished and total_steps == saved_step and old_params is not None:
        count = next(iter(steps_keys)) if len(steps_keys) == 1 else "<steps param>"
        return ResumeDecision(NOTHING, changes, (
            f"{checkpoint} holds a finished run (step {saved_step} of {saved_total}) and "
            "nothing changed, so there is nothing to train. Train it further with more steps "
            f"(`dvc exp run -S {count}=<more than {saved_step}>`), start a new run with other "
            "params (`dvc exp run -S ...`), or start over with `dvc-dali reset`"))
    if not finished and total_steps is not None and total_steps <= saved_step:
        of = f" of {saved_total} steps" if saved_total is not None else ""
        return ResumeDecision(RESTART, changes, (
            f"{checkpoint} holds step {saved_step} of an unfinished run{of}; total_steps is "
            f"{total_steps} now, so resuming it would train nothing: starting a new run from "
            "step 0 (the unfinished run's rows stay recorded; `dvc exp apply <row>` restores "
            "one)"))
    further = (f" to train to step {total_steps} ({'; '.join(steps)})" if steps else "")
    if changes:
        return ResumeDecision(RESUME, changes, f"resuming {checkpoint} at step {saved_step}"
                                               f"{further} with changed params: "
                                               + "; ".join(changes))
    if further:
        return ResumeDecision(RESUME, (), f"resuming {checkpoint} at step {saved_step}{further}")
    return ResumeDecision(RESUME)


_MORE = re.compile(r"`dvc exp run -S [^`=]+=<more than ")


def name_steps_param(message: str, stage_params: Mapping[str, Any],
                     total_steps: int | None) -> str:
    """``message`` (:func:`decide`'s "nothing to train") naming the stage's
    param that is the step count in its ``-S`` hint: the script's own key
    (``steps`` of its ``params=``) is no param DVC can set (``train.steps``
    is). The stage's int param equal to ``total_steps``; of several (a batch
    size of 4 and 4 steps), the one whose name says steps; else as it was."""
    names = [k for k, v in stage_params.items()
             if type(v) is int and v == total_steps]  # noqa: E721 - not a bool
    if len(names) > 1:
        names = [k for k in names if "step" in k.rsplit(".", 1)[-1].lower()]
    if len(names) != 1:
        return message
    return _MORE.sub(lambda _: f"`dvc exp run -S {names[0]}=<more than ", message)
