"""Benchmark 9: restoring a large torch state (model + optimizer sized,
1 GB full / 256 MB quick) in a new process: Checkpointer and dvc_dali.load
vs torch.load of the same tensors, warm page cache and cold (the files'
pages dropped with posix_fadvise(DONTNEED) before each try: no root
needed), alternating; and the peak memory each adds."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from common import BENCH, PY, Row, fmt_s, median, run, say, yes_no

MODES = ("torch.load", "Checkpointer", "load")


def _state(where: Path, tensors: int) -> int:
    code = f"""
import os, sys, torch
sys.path.insert(0, {str(BENCH.parent)!r})
import dvc_dali
g = torch.Generator().manual_seed(0)
state = {{f"layer{{i}}.weight": torch.randn(1024, 1536, generator=g) for i in range({tensors})}}
torch.save(state, "{where}/state.pt")
ck = dvc_dali.Checkpointer("{where}/ck"); ck.save(1, arrays={{"model": state}}); ck.close()
"""
    run([PY, "-c", code], where)
    return tensors * 1024 * 1536 * 4


def _drop_cache(where: Path) -> None:
    for path in where.rglob("*"):
        if path.is_file():
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
    tensors, reps = (42, 3) if quick else (168, 5)
    where = tmp / "big"
    where.mkdir()
    size = _state(where, tensors)
    say(f"[9] {size / 2**20:.0f} MB torch state written")
    took: dict[str, dict[str, list]] = {c: {m: [] for m in MODES} for c in ("warm", "cold")}
    extra: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(reps):
        for cache in ("warm", "cold"):
            for mode in MODES:
                got = _try(mode, where, cache == "cold")
                took[cache][mode].append(got["s"])
                extra[mode].append((got["rss_kib"] - got["rss_before_kib"]) * 1024)
    rows, notes = [], []
    for cache in ("warm", "cold"):
        ref = median(took[cache]["torch.load"])
        for mode in ("Checkpointer", "load"):
            ours = median(took[cache][mode])
            rows.append(Row(f"9 restore of a {size / 2**30:.2f} GB torch state, {cache} cache: "
                            f"{mode} vs torch.load", fmt_s(ours), fmt_s(ref),
                            f"{ours / ref:.2f}x", "<= 1.2x", yes_no(ours / ref <= 1.2)))
    for mode in ("Checkpointer", "load"):
        mem = median(extra[mode])
        rows.append(Row(f"9 peak memory added by a restore ({mode}) vs the state's size",
                        f"{mem / 2**20:.0f} MB", f"{size / 2**20:.0f} MB",
                        f"{mem / size:.2f}x", "<= 1.1x + 200 MB",
                        yes_no(mem <= 1.1 * size + 200 * 2**20)))
    notes.append(f"9 restore s: {json.dumps(took)}")
    return rows, notes, {"took_s": took, "extra_bytes": extra, "size": size}
