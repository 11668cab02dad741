"""Benchmarks 10 and 11: a checkpoint's cost does not grow with the repository.

10. per-checkpoint cost (make_checkpoint blocking, 1 KB state, `dvc exp run`)
   with a stage deps directory of 10k and 100k files vs 10 files;
11. the same with 10k and 100k files tracked by git vs 10.

Each size is its own project; the projects run one after the other in
rotation (rounds), so the ratios are measured side by side in one run.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from common import (BENCH, DVC3, PY, Row, dvc_project, fmt_s, median, read_log, run, say,
                    yes_no)

YAML = """\
stages:
  train:
    cmd: {cmd}
    deps: [train.py{deps}]
    outs:
      - checkpoint:
          persist: true
    metrics:
      - metrics.json:
          cache: false
    always_changed: true
"""
GOAL = 1.2


def many_files(root: Path, n: int) -> None:
    """n small files, 1,000 to a directory (as a data set or a source tree)."""
    for i in range(n):
        sub = root / f"d{i // 1000:04d}"
        if i % 1000 == 0:
            sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:06d}.txt").write_text(f"{i}\n")


def project(tmp: Path, kind: str, n: int) -> Path:
    """A project whose stage has a deps dir of n files ('deps', not in git)
    or n files tracked by git beside it ('tracked')."""
    path = tmp / f"{kind}-{n}"
    cmd = f"{shlex.quote(PY)} train.py"
    deps = ", data" if kind == "deps" else ""
    dvc_project(path, DVC3, {"train.py": (BENCH / "train_ckpt.py").read_text(),
                             "dvc.yaml": YAML.format(cmd=cmd, deps=deps),
                             ".gitignore": "__pycache__/\n/data\n"})
    many_files(path / ("data" if kind == "deps" else "src"), n)
    if kind == "tracked":
        run(["git", "add", "-A"], path, timeout=1800)
        run(["git", "commit", "-q", "-m", "tracked files"], path, timeout=1800)
    return path


def one_run(path: Path, name: str, checkpoints: int) -> tuple[list[float], list[dict]]:
    """Blocking seconds of each checkpoint after the first of one `dvc exp run`."""
    log = path.parent / f"{path.name}-{name}.jsonl"
    # each round a new run: a finished one rerun unchanged is refused
    run([PY, "-m", "dvc_dali.cli", "reset"], path)
    run([*DVC3, "exp", "run", "-n", name], path,
        {"BENCH_LOG": str(log), "BENCH_PLAN": f"1024:{checkpoints}", "BENCH_PIPE": "0"},
        timeout=3600)
    events = [e for e in read_log(log) if e.get("event") == "checkpoint"]
    if len(events) != checkpoints:
        raise RuntimeError(f"{path}: {len(events)} of {checkpoints} checkpoints logged")
    return [e["blocked"] for e in events[1:]], [e.get("phases", {}) for e in events[1:]]


def rows_for(kind: str, label: str, num: int, times: dict[int, list[float]],
             phases: dict[int, list[dict]]) -> tuple[list[Row], list[str]]:
    rows, notes = [], []
    small = min(times)
    ref = median(times[small])
    for n in sorted(times):
        parts = {k: median(p.get(k, 0.0) for p in phases[n]) for k in phases[n][0]}
        notes.append(f"[{num}] {kind} {n} files: checkpoint {fmt_s(median(times[n]))} "
                     f"(all {', '.join(fmt_s(x) for x in times[n])}); record phases "
                     + ", ".join(f"{k} {fmt_s(v)}" for k, v in parts.items()))
        if n == small:
            continue
        ratio = median(times[n]) / ref
        rows.append(Row(f"{num} per-checkpoint cost, {label} of {n} vs {small} files",
                        fmt_s(median(times[n])), fmt_s(ref), f"{ratio:.2f}x", f"<= {GOAL}x",
                        yes_no(ratio <= GOAL), {"ours_all_s": times[n], "ref_all_s": times[small],
                                                 "ratio": ratio}))
    return rows, notes


def run_all(tmp: Path, quick: bool, only: set[int] | None = None
            ) -> tuple[list[Row], list[str], dict[str, Any]]:
    sizes = (10, 10_000, 100_000)
    rounds, checkpoints = (1, 6) if quick else (3, 11)
    rows: list[Row] = []
    notes: list[str] = []
    raw: dict[str, Any] = {}
    done: list[Path] = []
    for kind, label, num in (("deps", "stage deps dir", 10), ("tracked", "git-tracked files", 11)):
        if only and num not in only:
            continue
        say(f"[{num}] {kind}: projects of {', '.join(map(str, sizes))} files")
        paths = {n: project(tmp, kind, n) for n in sizes}
        os.sync()  # the projects' files written out before anything is timed
        times: dict[int, list[float]] = {n: [] for n in sizes}
        phases: dict[int, list[dict]] = {n: [] for n in sizes}
        for r in range(rounds):
            for n in sizes[r % 3:] + sizes[:r % 3]:  # rotate: no size always first
                t, p = one_run(paths[n], f"r{r}", checkpoints)
                times[n] += t
                phases[n] += p
            say(f"[{num}] round {r + 1}/{rounds}: " + ", ".join(
                f"{n} files {fmt_s(median(times[n]))}" for n in sizes))
        r_, n_ = rows_for(kind, label, num, times, phases)
        rows += r_
        notes += n_
        raw[kind] = {"times": times, "phases": phases}
        done += paths.values()
    # Removed at the end, not between 10 and 11: on a filesystem mounted with
    # online discard (this machine's), deleting 10^5 files slows every file
    # and directory creation for a while, DVC's cache writes in benchmark 11 too.
    for p in done:
        shutil.rmtree(p, ignore_errors=True)
    return rows, notes, raw
