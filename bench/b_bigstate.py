"""Benchmarks 12 and 13: a ~1.06 GB torch model + optimizer state.

12. Checkpointer.save (to the point the checkpoint is durable) vs torch.save
    + fsync of the same state, beside torch's distributed checkpoint (DCP)
    and the disk floor (the same bytes in one large write + fsync), in
    interleaved rounds in one process;
13. the same state saved and recorded by make_checkpoint under `dvc exp
    run` with the default cache type (reflink,copy) vs torch.save + fsync,
    each checkpoint timed both ways in the stage's process.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import bigstate
from common import BENCH, DVC3, PY, Row, dvc_project, fmt_s, median, read_log, run, say, yes_no

YAML = """\
stages:
  train:
    cmd: {cmd}
    deps: [train.py]
    outs:
      - checkpoint:
          persist: true
    always_changed: true
"""


def in_process(tmp: Path, rounds: int) -> dict[str, list[float]]:
    import numpy as np

    import dvc_dali

    state = bigstate.make_state()
    size = bigstate.nbytes(state)
    buf = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    ck = dvc_dali.Checkpointer(tmp / "ours", resume=False)
    ways = {
        "torch.save+fsync": lambda: bigstate.torch_save(state, tmp / "torch.pt"),
        "ours": lambda: _timed_save(ck, state, rounds),
        "dcp": lambda: bigstate.dcp_save(state, tmp / "dcp"),
        "floor": lambda: bigstate.disk_floor(buf, tmp / "floor.bin"),
    }
    out: dict[str, list[float]] = {k: [] for k in ways}
    names = list(ways)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            bigstate.clean(tmp / "none")  # os.sync(): start clean
            out[name].append(ways[name]())
            for leftover in ("torch.pt", "dcp", "floor.bin"):
                bigstate.clean(tmp / leftover)
        say(f"[12] round {r + 1}/{rounds}: " + ", ".join(
            f"{k} {fmt_s(v[-1])}" for k, v in out.items()))
    ck.close()
    out["bytes"] = [size]
    return out


_step = [0]


def _timed_save(ck, state, rounds) -> float:
    import time

    _step[0] += 1
    t = time.perf_counter()
    ck.save(_step[0], arrays=state)
    return time.perf_counter() - t


def under_dvc(tmp: Path, checkpoints: int) -> list[dict]:
    path = tmp / "big"
    cmd = f"{shlex.quote(PY)} train.py"
    dvc_project(path, DVC3, {"train.py": (BENCH / "train_big.py").read_text(),
                             "bigstate.py": (BENCH / "bigstate.py").read_text(),
                             "dvc.yaml": YAML.format(cmd=cmd), ".gitignore": "__pycache__/\n"})
    log = tmp / "big.jsonl"
    scratch = tmp / "scratch"
    scratch.mkdir()
    run([*DVC3, "exp", "run", "-n", "big"], path,
        {"BENCH_LOG": str(log), "BENCH_CHECKPOINTS": str(checkpoints),
         "BENCH_SCRATCH": str(scratch)}, timeout=3600)
    events = [e for e in read_log(log) if e.get("event") == "checkpoint"]
    if len(events) != checkpoints:
        raise RuntimeError(f"{path}: {len(events)} of {checkpoints} checkpoints logged")
    return events


def run_all(tmp: Path, quick: bool, only: set[int] | None = None
            ) -> tuple[list[Row], list[str], dict[str, Any]]:
    rounds, checkpoints = (3, 3) if quick else (5, 5)
    rows: list[Row] = []
    notes: list[str] = []
    raw: dict[str, Any] = {}
    if not only or 12 in only:
        say(f"[12] 1 GB torch state, {rounds} rounds in process")
        t = in_process(tmp, rounds)
        m = {k: median(v) for k, v in t.items() if k != "bytes"}
        ref = m["torch.save+fsync"]
        ratio = m["ours"] / ref
        rows.append(Row(f"12 {t['bytes'][0] / 1e9:.2f} GB torch state save, durable, vs "
                        "torch.save + fsync", fmt_s(m["ours"]), fmt_s(ref), f"{ratio:.2f}x",
                        "<= 1.2x and <= DCP", yes_no(ratio <= 1.2 and m["ours"] <= m["dcp"]),
                        {"all_s": t, "ratio": ratio}))
        rows.append(Row("12 same, vs DCP / vs the disk floor (one write + fsync)",
                        fmt_s(m["ours"]), f"{fmt_s(m['dcp'])} / {fmt_s(m['floor'])}",
                        f"{m['ours'] / m['dcp']:.2f}x / {m['ours'] / m['floor']:.2f}x", "-",
                        "n/a", {}))
        notes.append("[12] per round: " + "; ".join(
            f"{k} {', '.join(fmt_s(x) for x in v)}" for k, v in t.items() if k != "bytes"))
        raw["in_process"] = t
    if not only or 13 in only:
        say(f"[13] 1 GB torch state under dvc exp run, {checkpoints} checkpoints")
        ev = under_dvc(tmp, checkpoints)[1:]  # the first pays imports and opening the repo
        ours, ref = median(e["ours"] for e in ev), median(e["torch"] for e in ev)
        ratio = ours / ref
        rows.append(Row("13 1 GB save + record under dvc exp run (default cache type) vs "
                        "torch.save + fsync", fmt_s(ours), fmt_s(ref), f"{ratio:.2f}x",
                        "<= 1.4x", yes_no(ratio <= 1.4), {"events": ev, "ratio": ratio}))
        parts = {k: median(e["phases"].get(k, 0.0) for e in ev) for k in ev[0]["phases"]}
        notes.append(f"[13] save {fmt_s(median(e['save'] for e in ev))}, record phases: "
                     + ", ".join(f"{k} {fmt_s(v)}" for k, v in parts.items())
                     + "; all ours " + ", ".join(fmt_s(e["ours"]) for e in ev)
                     + "; torch " + ", ".join(fmt_s(e["torch"]) for e in ev))
        raw["under_dvc"] = ev
    return rows, notes, raw
