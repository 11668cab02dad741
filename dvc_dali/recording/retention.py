"""Retention: which of a run's rows to keep (a pure choice), and pruning them.

Only the rows of the run that just recorded are candidates: the same
experiment name on the same baseline, under the names the recorder gave them:
a row `dvc exp rename` named is the user's and never pruned. The row just
recorded is always kept,
and so is the best by a DVCLive metric when one is named, each row's metrics
read from the file `dvc-dali show` reads (reading/metrics_source.py) and
compared by the rule `show --best` follows (reading/best.py); a row whose
file holds no metrics object is kept too. While no row has that metric
(misspelt, or not logged yet), nothing is pruned: the best is unknown, and
what is recorded is not lost on a guess. Only refs go: the data stays in
the cache until `dvc gc`.
"""

from __future__ import annotations

from typing import Iterable, Optional

from ..reading import gitcmd
from ..reading.best import best_row
from ..reading.exp_refs import Row, git_dirs, rows_and_lineage
from ..reading.row_queries import read_metrics, say_unread_metrics
from .rows import named_by_recorder
from ..core.log import logger
from ..core.process_state import STATE


def select_pruned(rows: list[Row], keep_last: Optional[int], *, keep: Iterable[str] = ()
                  ) -> list[Row]:
    """The rows to delete: all but the last ``keep_last`` by step (then time)
    and the refs in ``keep``. ``keep_last`` None keeps every row. A row
    renamed (`dvc exp rename`: see rows.named_by_recorder) is neither counted nor
    deleted: a user who named it wants it kept (it was pruned without a word)."""
    if keep_last is None:
        return []
    if keep_last < 1:
        raise ValueError(f"keep_last must be a positive integer, got {keep_last!r}")
    ordered = sorted((r for r in rows if named_by_recorder(r)),
                     key=lambda r: (r["step"], r["time"]))
    kept = {r["ref"] for r in ordered[-keep_last:]} | set(keep)
    return [r for r in ordered if r["ref"] not in kept]


def of_the_run(row_started: Optional[str], run_started: Optional[str]) -> bool:
    """Whether a row of the recording run's name and baseline is that run's
    own, a retention candidate: its lineage line's ``started=`` is the run's.
    Pure. A run whose start is unknown (resumed from an older release's
    checkpoint) counts every row of its name, as it always did. Otherwise a
    row saying another start is another run's (a finished one restarted
    under its name, `dvc exp run -n a -f`), and a row saying none is of an
    unknown run: both kept. Commit times are not compared: whole seconds,
    a restart within the second of the old run's last row read that row as
    the new run's, and GIT_COMMITTER_DATE fixes them at will."""
    if run_started is None:
        return True
    return row_started is not None and row_started == run_started


def _say_no_best(spec: str, run_name: str, rows: list[Row]) -> None:
    if spec in STATE.said_no_best:
        return
    STATE.said_no_best.add(spec)
    files = " or ".join(dict.fromkeys(r["metrics_file"] for r in rows))
    logger.warning("keep_best %r (DVC_DALI_KEEP_BEST or keep_best=): none of the %d rows of run "
                   "%r has that metric in %s, so the best row is unknown and no row is "
                   "pruned until one has it; check the name against `dvc-dali show`", spec,
                   len(rows), run_name, files)


def _unscored(rows: list[Row], spec: str, dvc_root: str) -> set[str]:
    """The rows keep_best cannot score: each one's metrics, read by the rule
    `dvc-dali show --best` and ``best_row`` read them with (it read only the
    stage's ``metrics:`` outputs, so with a dvc.yaml's top-level ``metrics:``,
    DVCLive's own layout, it pruned the row `show --best` named: found by a
    sweep), into the rows; the refs of rows whose file holds no metrics
    object: their metric is unknown, so they are kept, said once a run."""
    bad = read_metrics(dvc_root, rows)
    fresh = [(r, why) for r, why in bad if f"{spec}\0{r['ref']}" not in STATE.said_no_best]
    STATE.said_no_best.update(f"{spec}\0{r['ref']}" for r, _ in bad)  # specs, (spec, row)s
    if fresh:
        say_unread_metrics(fresh, f"keep_best {spec!r} cannot score it, so retention keeps it")
    return {r["ref"] for r, _ in bad}


def prune(dvc_root: str, run_name: str, baseline: str, just_recorded: str,
          keep_last: Optional[int], keep_best: Optional[str],
          started: Optional[str] = None) -> list[tuple[str, str]]:
    """Delete the run's rows retention does not keep; their (name, commit)s.
    ``started``: when the run began, as its rows' lineage lines say it
    (see of_the_run); None: not known."""
    if keep_last is None:
        return []
    git_dir, _ = git_dirs(dvc_root)
    rows = [r for r, fields in rows_and_lineage(dvc_root, run_name)
            if r["baseline"] == baseline and of_the_run(fields.get("started"), started)]
    keep = {just_recorded}
    if keep_best:  # the rule of `dvc-dali show --best` and dvc_dali.best_row
        keep |= _unscored(rows, keep_best, dvc_root)
        best = best_row(rows, keep_best)
        if best is None:  # a misspelt metric, or one not logged yet: the best is unknown
            _say_no_best(keep_best, run_name, rows)
            return []
        keep.add(best["ref"])
    removed, kept = [], []
    for row in select_pruned(rows, keep_last, keep=keep):
        proc = gitcmd.run(["--git-dir", git_dir, "update-ref", "-d", row["ref"], row["sha"]],
                          cwd=dvc_root, check=False)
        if proc.returncode == 0:
            removed.append((row["name"], row["sha"]))
        else:
            kept.append((row["name"], proc.stderr))
    if kept:
        _say_not_pruned(kept)
    return removed


def _say_not_pruned(kept: list[tuple[str, str]]) -> None:
    """Retention is housekeeping once the row is recorded: a row git would
    not delete (a reference-transaction hook, a packed-refs.lock a killed git
    left) is kept and said, and training goes on."""
    lines = [line.strip() for line in kept[0][1].splitlines() if line.strip()]
    why = next((line for line in lines if line.startswith(("error:", "fatal:"))),
               lines[0] if lines else "no message")  # git's own line, not its advice
    logger.warning("keep_last: git would not delete %s (%s); kept, tried again at the next "
                   "checkpoint. A git hook refusing ref updates, or a lock file a killed git "
                   "left (.git/packed-refs.lock), stops it: fix that, or remove those rows "
                   "with `dvc-dali remove`", ", ".join(name for name, _ in kept), why)
