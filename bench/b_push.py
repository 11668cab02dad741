"""Benchmark 8: training under `dvc exp run` with each row pushed as it is
recorded (exp.auto_push: a bare git repository and a local-directory DVC
remote) vs the same run without pushing, side by side, alternating; the
CPU a pushed row costs (the pusher's own count: its thread and its git
processes, the first push, which opens the DVC repo and remote, apart; and
the whole process's CPU with push vs without, per row); and the delay from
a row's recording to its ref on the git remote."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from common import BENCH, DVC3, Row, dvc_project, fmt_s, median, read_log, run, say, \
    write_jpegs, yes_no

DVC_YAML = """stages:
  train:
    cmd: python train.py
    deps: [train.py, data]
    outs:
      - checkpoint:
          persist: true
    always_changed: true
"""


def project(tmp: Path, name: str, push: bool) -> Path:
    path = dvc_project(tmp / name, DVC3, {"dvc.yaml": DVC_YAML})
    shutil.copy(BENCH / "train_push.py", path / "train.py")
    shutil.copy(BENCH / "dali_pipes.py", path / "dali_pipes.py")
    write_jpegs(path / "data", 400)
    if push:
        run(["git", "init", "-q", "--bare", "-b", "main", tmp / f"{name}.git"], tmp)
        run(["git", "remote", "add", "origin", tmp / f"{name}.git"], path)
        run([*DVC3, "remote", "add", "-d", "store", tmp / f"{name}-store"], path)
        run([*DVC3, "config", "exp.auto_push", "true"], path)
    run(["git", "add", "-A"], path)
    run(["git", "commit", "-qm", "bench"], path)
    if push:
        run(["git", "push", "-q", "origin", "main"], path)
    return path


def trial(path: Path, steps: int, every: int, n: int) -> tuple[float, list[float], dict]:
    """Loop seconds, each row's recording-to-remote delays, the end event
    (CPU counts)."""
    logf = path / f"log{n}.jsonl"
    run([*DVC3, "exp", "run", "-n", f"t{n}"], path, {
        "BENCH_LOG": str(logf), "BENCH_STEPS": str(steps), "BENCH_EVERY": str(every),
        "PYTHONPATH": f"{BENCH.parent}:{BENCH}"})
    run(["dvc-dali", "reset"], path)
    events = read_log(logf)
    recorded = {e["key"]: e["at"] for e in events if e["event"] == "recorded"}
    delays = [e["at"] - recorded[e["key"]] for e in events
              if e["event"] == "pushed" and e["key"] in recorded]
    end = next((e for e in events if e["event"] == "end"), {})
    return next(e["seconds"] for e in events if e["event"] == "loop"), delays, end


def _counts(st: dict) -> tuple:
    return (st.get("rows"), st.get("pushes"), round(st.get("cpu_s", 0), 3),
            round(st.get("first_cpu_s", 0), 3))


def _cpu(end: dict) -> float:
    return end.get("cpu_s", float("nan")) + end.get("children_cpu_s", float("nan"))


def run_all(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    steps, reps = (300, 2) if quick else (1000, 4)
    on, off = project(tmp, "on", True), project(tmp, "off", False)
    rows, detail, raw = [], [], {}
    n = 0
    for every in (10, 100):
        t_on, t_off, delays, per_row, proc_row, stats = [], [], [], [], [], []
        for _ in range(reps):
            say(f"  8 push: a row every {every} steps, trial {len(t_on) + 1}/{reps}")
            t, d, end_on = trial(on, steps, every, n)
            t_on.append(t)
            delays += d
            t_off_n, _, end_off = trial(off, steps, every, n)
            t_off.append(t_off_n)
            n += 1
            st = end_on.get("pusher") or {}
            stats.append(st)
            later = st.get("rows", 0) - st.get("first_rows", 0)
            if later > 0:  # the first push opens the repo and remote: apart
                per_row.append((st["cpu_s"] - st["first_cpu_s"]) / later)
                proc_row.append((_cpu(end_on) - _cpu(end_off)) / st["rows"])
        ratio = median(t_off) / median(t_on)  # throughput on / off
        goal = 0.99 if every >= 100 else 0.98
        rows.append(Row(f"8 training throughput, each row pushed vs not ({steps} steps of "
                        f"~9 ms, a row every {every}, 1 MB)", fmt_s(median(t_on)),
                        fmt_s(median(t_off)), f"{ratio:.3f}", f">= {goal}",
                        yes_no(ratio >= goal)))
        rows.append(Row(f"8 CPU per pushed row (the pusher's thread + git, the first push "
                        f"apart), a row every {every}; whole process on - off, per row",
                        fmt_s(median(per_row)), fmt_s(median(proc_row)), "-", "<= 10 ms",
                        yes_no(median(per_row) <= 0.010)))
        rows.append(Row(f"8 delay from recording to the ref on the git remote (a row every "
                        f"{every}), median / max", f"{fmt_s(median(delays))} / "
                        f"{fmt_s(max(delays))}", "-", "-"))
        detail.append(f"8 every {every}: loop s on {[round(x, 2) for x in t_on]}, off "
                      f"{[round(x, 2) for x in t_off]}; {len(delays)} rows pushed; pusher "
                      f"(rows, git pushes, CPU s, first push's CPU s): "
                      f"{[_counts(s) for s in stats]}")
        raw[every] = {"on_s": t_on, "off_s": t_off, "delays_s": delays, "pusher": stats,
                      "cpu_per_row_s": per_row, "process_cpu_per_row_s": proc_row}
    return rows, detail, raw
