"""Benchmark 9: restoring a large torch state in a new process: the model +
AdamW-sized state of bigstate.py (336 float32 tensors, 1.06 GB; --quick:
84 tensors, 265 MB) saved once by Checkpointer.save, read back by
Checkpointer(dir).arrays and dvc_dali.load vs torch.load of the same tensors
(saved by torch.save). Each try is a new process that imports torch,
dvc_dali's Checkpointer and load and nvidia.dali before its clock starts;
the clock stops once one byte of every 4 KiB page of every tensor has been
read. The three kinds are interleaved (their order rotating), warm (every
file read once, untimed, before each warm round) and cold (every file of
both kinds fsynced and its pages dropped with posix_fadvise(DONTNEED) before
each try: no root needed); and the peak memory each adds."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from common import BENCH, PY, Row, fmt_s, median, run, say, yes_no

MODES = ("torch.load", "Checkpointer", "load")


def _files(where: Path) -> list[Path]:
    return [p for p in where.rglob("*") if p.is_file() and not p.name.endswith(".lock")]


def _warm(where: Path) -> None:
    for path in _files(where):
        with open(path, "rb", buffering=0) as fh:
            while fh.read(16 << 20):
                pass


def _drop_cache(where: Path) -> None:
    for path in _files(where):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _try(mode: str, where: Path, cold: bool) -> dict[str, float]:
    if cold:
        _drop_cache(where)
    out = run([PY, BENCH / "restore_big_child.py", mode, where], where).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_all(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    layers, reps = (21, 3) if quick else (84, 5)
    where = tmp / "big"
    where.mkdir()
    made = json.loads(run([PY, BENCH / "restore_big_child.py", "make", where, layers],
                          where).stdout.strip().splitlines()[-1])
    size, tensors = made["bytes"], made["tensors"]
    say(f"[9] {size / 1e9:.2f} GB torch state ({tensors} tensors) written")
    took: dict[str, dict[str, list]] = {c: {m: [] for m in MODES} for c in ("warm", "cold")}
    extra: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(reps):
        order = MODES[r % 3:] + MODES[:r % 3]
        for cache in ("warm", "cold"):
            for mode in order:
                if cache == "warm":
                    _warm(where)
                got = _try(mode, where, cache == "cold")
                took[cache][mode].append(got["s"])
                extra[mode].append((got["rss_kib"] - got["rss_before_kib"]) * 1024)
        say(f"[9] round {r + 1}/{reps}: " + "; ".join(
            f"{c} " + ", ".join(f"{m} {fmt_s(took[c][m][-1])}" for m in MODES) for c in took))
    rows, notes = [], []
    for cache in ("warm", "cold"):
        ref = median(took[cache]["torch.load"])
        for mode in ("Checkpointer", "load"):
            ours = median(took[cache][mode])
            rows.append(Row(f"9 restore of a {size / 1e9:.2f} GB torch state ({tensors} tensors) "
                            f"in a new process, {cache} cache: {mode} vs torch.load",
                            fmt_s(ours), fmt_s(ref), f"{ours / ref:.2f}x", "<= 1.0x",
                            yes_no(ours / ref <= 1.0)))
    for mode in MODES:
        mem = median(extra[mode])
        rows.append(Row(f"9 peak memory added by a restore ({mode}) vs the state's size",
                        f"{mem / 2**20:.0f} MB", f"{size / 2**20:.0f} MB",
                        f"{mem / size:.2f}x", "<= 1.1x + 200 MB",
                        yes_no(mem <= 1.1 * size + 200 * 2**20)))
    notes.append("[9] restore s per try: " + json.dumps(
        {c: {m: [round(x, 3) for x in v] for m, v in d.items()} for c, d in took.items()}))
    return rows, notes, {"took_s": took, "extra_bytes": extra, "size": size, "tensors": tensors}
