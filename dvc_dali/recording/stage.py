"""Find the stage whose command is running, and check that DVC 3 can resume it."""

from __future__ import annotations

import os
from typing import Any, Optional

from ..core.errors import RecordError
from ..core.process_state import STATE
from . import dvc_door

STAGE_FIX = """\
    outs:
      - {path}:
          persist: true      # DVC 3 deletes other outputs before a run
    always_changed: true     # else DVC 3 skips an unchanged stage"""


def _covers(out: Any, want: str) -> bool:
    path = os.path.realpath(out.fs_path)
    return path == want or want.startswith(path + os.sep)


def _by_address(stages: list, target: str, cwd: str) -> list:
    """Stages named by a DVC_STAGE-style address '[<dvc.yaml path>:]<name>'."""
    path, _, name = target.rpartition(":")
    named = cands = [s for s in stages if s.name == name]
    if path:
        want = os.path.normpath(path)
        cands = [s for s in cands if os.path.normpath(s.path).endswith(os.sep + want)
                 or os.path.normpath(s.path) == os.path.abspath(want)]
    if not cands and path and not os.path.isabs(path):
        # relative to where `dvc exp run` was typed (`cd data; dvc exp run
        # ../dvc.yaml`), which the command does not know: it runs in the
        # stage's wdir (refused as matching nothing; found by a sweep)
        cands = [s for s in named if os.path.realpath(s.wdir) == cwd
                 and os.path.basename(s.path) == os.path.basename(want)]
    if len(cands) > 1:  # the command runs in the stage's wdir
        cands = [s for s in cands if os.path.realpath(s.wdir) == cwd] or cands
    return cands


def select_stage(stages: list, root_dir: str, target: Optional[str], out: Optional[str],
                 cwd: str, env_stage: Optional[str]) -> Any:
    """The one stage meant by target (a DVC_STAGE address), else the one
    whose outputs cover ``out``, else the one with persist outputs in cwd."""
    if target:
        cands = _by_address(stages, target, cwd)
        if len(cands) > 1:
            root_file = os.path.join(root_dir, "dvc.yaml")
            cands = [s for s in cands if s.path == root_file] or cands
        if len(cands) == 1:
            return cands[0]
        origin = "env DVC_STAGE" if target == env_stage else "the stage= argument"
        raise RecordError(
            f"stage '{target}' (from {origin}) matches {len(cands)} stages in the DVC repo "
            f"'{root_dir}' (candidates: {', '.join(s.addressing for s in cands) or 'none'}). "
            "Set DVC_STAGE to '<dvc.yaml path>:<name>' or run through `dvc exp run`.")
    if out:
        want = os.path.realpath(os.path.abspath(out))
        cands = [s for s in stages if any(_covers(o, want) for o in s.outs)]
    else:
        cands = [s for s in stages
                 if os.path.realpath(s.wdir) == cwd and any(o.persist for o in s.outs)]
    if len(cands) == 1:
        return cands[0]
    what = f"an output covering {out!r}" if out else f"persist outputs in {cwd!r}"
    raise RecordError(
        f"env DVC_STAGE is not set and {len(cands)} stages of '{root_dir}' have {what} "
        f"({', '.join(s.addressing for s in cands) or 'none'}). Run through DVC >= 3.54's "
        "`dvc exp run`, which sets DVC_STAGE.")


def find_stage(repo: Any, target: Optional[str], out: Optional[str],
               env_stage: Optional[str] = None) -> Any:
    """env_stage: DVC_STAGE, to say where a target that matches nothing came from."""
    return select_stage(dvc_door.named_stages(repo), repo.root_dir, target, out,
                        os.path.realpath(os.getcwd()), env_stage)


def cached_stage(repo: Any, target: Optional[str], out: Optional[str],
                 env_stage: Optional[str] = None) -> tuple[Any, list[str]]:
    """(stage, the paths a commit stages for it), looked up once per process
    and again only when its dvc.yaml or params.yaml change: the lookup parses
    every dvc.yaml and costs more than the rest of a small recording."""
    def load() -> tuple[list[str], Any]:
        watched = [os.path.join(repo.root_dir, "dvc.yaml"),
                   os.path.join(repo.root_dir, "params.yaml")]
        stg = find_stage(repo, target, out, env_stage)
        watched += [stg.path, os.path.join(os.path.dirname(stg.path), "params.yaml")]
        return watched, (stg, dvc_door.stage_files(repo, stg))

    return STATE.from_files(("stage", repo.root_dir, target, out, os.getcwd()), load)


def output_at(stage: Any, checkpoint_path: Optional[str]) -> Any:
    """The stage's output that is (or holds) checkpoint_path; for a bare
    make_checkpoint() (None) its persisted output, if any."""
    if checkpoint_path is None:
        return next((o for o in stage.outs if o.persist), None)
    want = os.path.realpath(os.path.abspath(checkpoint_path))
    return next((o for o in stage.outs if _covers(o, want)), None)


def _bare_output(stage: Any) -> tuple[Any, str]:
    """For a bare make_checkpoint(), which names no output: the one declared
    `checkpoint: true`, else a persisted one, else the first (a persisted
    metrics file came first, and a stage whose checkpoint output lacked
    `persist` was refused naming the metrics file: found by a sweep)."""
    outs = list(stage.outs)
    declared = dvc_door.declared_checkpoint_outs(stage)
    out = (next((o for o in outs if o.def_path in declared), None)
           or next((o for o in outs if o.persist), None)
           or (outs[0] if outs else None))
    return out, (out.def_path if out else "checkpoint")


def checkpoint_output(stage: Any, checkpoint_path: Optional[str]) -> Any:
    """The stage's checkpoint output: the one covering ``checkpoint_path``,
    or, for a bare make_checkpoint() (None), the one _bare_output names."""
    return output_at(stage, checkpoint_path) if checkpoint_path else _bare_output(stage)[0]


def _normalization(stage: Any, rel: str) -> str:
    """Where ``rel`` and a declared output differ only in Unicode
    normalization (macOS and some editors write NFD), both as escapes: the
    refusal printed the two alike (found by a sweep)."""
    import unicodedata

    same = [o.def_path for o in stage.outs
            if unicodedata.normalize("NFC", o.def_path) == unicodedata.normalize("NFC", rel)]
    return (f" (it differs from the declared {same[0]!a} only in Unicode normalization: "
            f"{rel!a}; write both alike)" if same else "")


def stage_problems(stage: Any, checkpoint_path: Optional[str]) -> tuple[list[str], str]:
    """What keeps DVC 3 from resuming the stage, and the output's path for the
    fix. checkpoint_path None: a bare make_checkpoint(), any output will do."""
    if checkpoint_path is None:
        out, rel = _bare_output(stage)
    else:
        want = os.path.realpath(os.path.abspath(checkpoint_path))
        out = next((o for o in stage.outs if _covers(o, want)), None)
        rel = os.path.relpath(want, os.path.realpath(stage.wdir))
    problems = []
    if out is None:
        problems.append(f"'{rel}' is not one of its outputs" + _normalization(stage, rel))
    elif not out.persist:
        problems.append(f"output '{out.def_path}' is not `persist: true`, so DVC 3 deletes "
                        "it before every run and training would never resume")
    if not stage.always_changed:
        problems.append("it is not `always_changed: true`, so DVC 3 skips it when no "
                        "dependency changed instead of resuming")
    return problems, (out.def_path if out else rel)


def run_alone_hint(this: str, others: list[str]) -> str:
    """What a finished stage's refusal adds where the project has other
    checkpoint stages (``others``, as `dvc exp run` addresses them). Pure.

    `dvc exp run`, and `dvc exp run <stage>` with its upstream stages, run
    this stage too: its refusal stopped them, so a killed stage after it
    could not be resumed, and the advised `dvc-dali reset` reset every stage
    (found by a sweep)."""
    if not others:
        return ""
    return (f" `dvc exp run` stops at this refusal: to resume another checkpoint stage of "
            f"this project ({', '.join(others)}) alone, without its upstream stages, run "
            f"`dvc exp run -s {others[0]}`; `dvc-dali reset --stage {this}` starts only "
            "this one over.")
