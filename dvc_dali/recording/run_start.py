"""The params a run trains with, taken when it starts.

A second `dvc exp run -S ...` in the same workspace rewrites params.yaml
before DVC refuses it; the running run's later rows must still record the
params it trains with. So the stage's params files are read once, when the
run starts (Checkpointer creation, or the first bare make_checkpoint()),
and every row records those, with one line saying the workspace changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from ..context import RunContext
from ..log import logger
from . import dvc_door
from .cache import CACHE
from .carry import carry
from .stage import find_stage, output_at


@dataclass
class RunStart:
    files: dict[str, Optional[bytes]]  # params file (absolute) -> its bytes at the start
    params: dict[str, Any] = field(default_factory=dict)  # "train.lr" -> value
    warned: bool = False
    deps: dict[str, Any] = field(default_factory=dict)  # dep path -> (hash, meta) at start
    resumed_row: Optional[dict] = None  # the recorded row the workspace checkpoint is
    later_rows: list = field(default_factory=list)  # rows its run recorded after it


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _flatten(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """{"train": {"lr": 0.1}} -> {"train.lr": 0.1}, as `-S train.lr=...` names it,
    so a change is reported per param."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def capture(ctx: RunContext, out: Optional[str], carry_checkpoint: bool = False) -> RunStart:
    """Read the stage's params now (once per process); the flattened values
    are the run's params (keys of files other than params.yaml are
    prefixed '<file>:'). ``carry_checkpoint``: before the checkpoint is read,
    bring the workspace's into a --temp/queued run (see carry.py)."""
    if CACHE.run_start is not None:
        return CACHE.run_start
    from .maintenance import repo_at

    repo = repo_at(os.getcwd())
    stage = find_stage(repo, ctx.stage, out, ctx.stage)
    checkpoint = output_at(stage, out)
    if carry_checkpoint and checkpoint is not None:
        carry(ctx, repo, stage, checkpoint)
    start = RunStart({})
    start.resumed_row, start.later_rows = _applied_row(ctx, repo, stage)
    # Under DVC's repo lock: `dvc exp run --temp`/`--queue` started meanwhile
    # stashes the workspace (params.yaml at HEAD for a moment) while holding it.
    dvc_door.lock_repo(repo, ctx.lock_timeout)
    try:
        start.deps = dvc_door.dep_hashes(stage)
        for dep in dvc_door.params_deps(stage):
            start.files[dep.fs_path] = _read(dep.fs_path)
            hash_info, values = dvc_door.params_now(dep)
            start.deps[dep.fs_path] = (hash_info, dep.meta)  # what every row records
            prefix = "" if os.path.basename(dep.fs_path) == "params.yaml" else f"{dep.def_path}:"
            start.params.update(_flatten(values, prefix))
    finally:
        dvc_door.unlock_repo(repo)
    CACHE.run_start = start
    return start


def pin(toplevel: str) -> dict[str, bytes]:
    """The params files changed since the run started (their values in the
    row are the start's already: see known_deps), as {path relative to
    toplevel: bytes at the start}, for the row's commit."""
    start = CACHE.run_start
    if start is None:
        return {}
    changed = {p: b for p, b in start.files.items() if b is not None and _read(p) != b}
    if changed and not start.warned:
        logger.warning("%s changed while this run trains (a second `dvc exp run` in this "
                       "workspace?); its rows keep recording the params it started with",
                       ", ".join(os.path.relpath(p) for p in changed))
        start.warned = True
    top = os.path.realpath(toplevel)
    return {os.path.relpath(os.path.realpath(p), top): b for p, b in changed.items()}


def _applied_row(ctx: RunContext, repo: Any, stage: Any) -> tuple[Optional[dict], list]:
    """The row whose outputs the run's dvc.lock names (after `dvc exp apply
    <row>`, or a kill), and the rows its run recorded after it."""
    from urllib.parse import unquote

    from . import lockfile, rows

    entry = lockfile.stage_entry(lockfile.read(dvc_door.lockfile_path(stage))[1], stage.name)
    if not entry or not ctx.dvc_root:
        return None, []
    digest, addr = rows.outs_digest(entry), rows.stage_address(repo.root_dir, stage)
    listed = rows.list_rows(ctx.dvc_root)
    mine = [r for r in listed if r["outs"] == digest
            and r["stage"] == unquote(addr) and r["baseline"] == ctx.baseline_rev]
    if not mine:
        return None, []
    row = max(mine, key=lambda r: (r["time"], r["step"]))
    return row, rows.superseded_by(listed, row)


def known_deps() -> dict[str, Any]:
    """The deps' hashes as the run started ({} before start_run)."""
    return CACHE.run_start.deps if CACHE.run_start is not None else {}
