"""Benchmark 14: a checkpoint's cost with a stage whose dep directory is
committed to git (the Quickstart: `dvc-dali init`, its images under
data/images committed with `git add .`, data/images among the stage's deps).

A row holds what `git add -A -- <the stage's paths>` stages, so such a
directory is part of every row; the per-checkpoint cost (make_checkpoint
blocking, 1 KB state, `dvc exp run`) with 2,000 and 100,000 files there
(100,000 only in the full run: creating and committing them takes minutes)
vs 10. Each size is its own project; the projects run one after the other
in rotation (rounds), so the ratios are measured side by side in one run.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from b_scale import YAML, many_files, one_run, rows_for
from common import BENCH, DVC3, PY, Row, dvc_project, fmt_s, median, run, say

NUM = 14


def project(tmp: Path, n: int) -> Path:
    """A project whose stage's deps include `data`, n files committed to git."""
    path = tmp / f"gitdeps-{n}"
    dvc_project(path, DVC3, {"train.py": (BENCH / "train_ckpt.py").read_text(),
                             "dvc.yaml": YAML.format(cmd=f"{shlex.quote(PY)} train.py",
                                                     deps=", data"),
                             ".gitignore": "__pycache__/\n"})
    many_files(path / "data", n)
    run(["git", "add", "-A"], path, timeout=1800)
    run(["git", "commit", "-q", "-m", "data committed to git"], path, timeout=1800)
    return path


def run_all(tmp: Path, quick: bool, only: set[int] | None = None
            ) -> tuple[list[Row], list[str], dict[str, Any]]:
    sizes = (10, 2_000) if quick else (10, 2_000, 100_000)
    rounds, checkpoints = (2, 6) if quick else (3, 11)
    say(f"[{NUM}] projects of {', '.join(map(str, sizes))} files committed to git")
    paths = {n: project(tmp, n) for n in sizes}
    os.sync()  # the projects' files written out before anything is timed
    times: dict[int, list[float]] = {n: [] for n in sizes}
    phases: dict[int, list[dict]] = {n: [] for n in sizes}
    for r in range(rounds):
        k = r % len(sizes)
        for n in sizes[k:] + sizes[:k]:  # rotate: no size always first
            if r:  # each round trains from step 0 (a finished run is not trained again)
                run([PY, "-m", "dvc_dali.cli", "reset"], paths[n])
            t, p = one_run(paths[n], f"r{r}", checkpoints)
            times[n] += t
            phases[n] += p
        say(f"[{NUM}] round {r + 1}/{rounds}: " + ", ".join(
            f"{n} files {fmt_s(median(times[n]))}" for n in sizes))
    rows, notes = rows_for("gitdeps", "stage deps dir committed to git", NUM, times, phases)
    for p in paths.values():  # at the end: see b_scale (online discard)
        shutil.rmtree(p, ignore_errors=True)
    return rows, notes, {"times": times, "phases": phases}
