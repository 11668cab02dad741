"""Retention: which of a run's rows to keep (a pure choice), and pruning them.

Only the rows of the run that just recorded are candidates: the same
experiment name on the same baseline. The row just recorded is always kept,
and so is the best by a DVCLive metric when one is named. Only refs go: the
data stays in the cache until `dvc gc`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Optional

from . import commit
from .rows import git_dirs, list_rows


def best_of(scored: Iterable[tuple[float, str]], mode: str) -> Optional[str]:
    """The ref with the best value ('max' or 'min'); ties: the later ref."""
    scored = list(scored)
    if not scored:
        return None
    return (min if mode == "min" else max)(scored)[1]


def select_pruned(rows: list[dict], keep_last: Optional[int], *, keep: Iterable[str] = ()
                  ) -> list[dict]:
    """The rows to delete: all but the last ``keep_last`` by step (then time)
    and the refs in ``keep``. ``keep_last`` None keeps every row."""
    if keep_last is None:
        return []
    if keep_last < 1:
        raise ValueError(f"keep_last must be a positive integer, got {keep_last!r}")
    ordered = sorted(rows, key=lambda r: (r["step"], r["time"]))
    kept = {r["ref"] for r in ordered[-keep_last:]} | set(keep)
    return [r for r in ordered if r["ref"] not in kept]


def _metric_at(git_dir: str, cwd: str, sha: str, metrics_file: str, metric: str
               ) -> Optional[float]:
    proc = commit.git(["--git-dir", git_dir, "show", f"{sha}:{metrics_file}"], cwd=cwd,
                      check=False)
    if proc.returncode != 0:
        return None
    try:
        node: Any = json.loads(proc.stdout)
        for part in re.split(r"[/.]", metric):
            node = node[part]
        return float(node)
    except (ValueError, KeyError, TypeError):
        return None


def prune(dvc_root: str, exp_name: str, baseline: str, just_recorded: str,
          keep_last: Optional[int], keep_best: Optional[str],
          metrics_file: str = "dvclive/metrics.json") -> list[str]:
    """Delete the run's rows retention does not keep; their names."""
    if keep_last is None:
        return []
    git_dir, _ = git_dirs(dvc_root)
    rows = [r for r in list_rows(dvc_root, exp_name) if r["baseline"] == baseline]
    keep = {just_recorded}
    if keep_best:
        metric, _, mode = keep_best.rpartition(":")
        scored = [(v, r["ref"]) for r in rows
                  if (v := _metric_at(git_dir, dvc_root, r["sha"], metrics_file, metric))
                  is not None]
        keep.add(best_of(scored, mode) or just_recorded)
    removed = []
    for row in select_pruned(rows, keep_last, keep=keep):
        commit.git(["--git-dir", git_dir, "update-ref", "-d", row["ref"], row["sha"]],
                   cwd=dvc_root)
        removed.append(row["name"])
    return removed
