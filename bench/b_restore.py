"""Benchmark 5: restore (Checkpointer + ck.pipeline() build + first batch)
vs a fresh start, early and late in an epoch of 100,000 files, each timed
in a fresh interpreter (imports excluded); plus the cost of the data digest
of file_root that both pay."""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any

from common import BENCH, PY, Row, fmt_s, median, run, say, yes_no

perf = time.perf_counter
FILES, CLASSES, BATCH = 100_000, 10, 32


def tiny_jpegs(root: Path, n: int, classes: int) -> Path:
    """n tiny (8x8) JPEG files in class folders, written fast: one encoded
    image per class, its bytes written n/classes times."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, format="JPEG")
        data = buf.getvalue()
        folder = root / f"c{c}"
        folder.mkdir(parents=True)
        for i in range(c, n, classes):
            fd = os.open(folder / f"{i:06d}.jpg", os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, data)
            os.close(fd)
    return root


def scandir_digest(path: str) -> str:
    """Proposed replacement for dali_state._data_digest on a directory: the
    same digest (relative path + size of every file, sorted walk), from
    os.scandir's DirEntry (no separate stat + path joins per file)."""
    h = hashlib.sha1()

    def walk(top: str, rel: str) -> None:
        with os.scandir(top) as it:
            entries = sorted(it, key=lambda e: e.name)
        # os.walk's split and order: what is not a directory (symlinks
        # followed) is a file, hashed first; then the subdirectories, sorted,
        # not descending into symlinked ones
        for e in entries:
            if not e.is_dir():
                h.update(f"{rel}{e.name}\0{e.stat().st_size}\0".encode())
        for e in entries:
            if e.is_dir() and not e.is_symlink():
                walk(e.path, f"{rel}{e.name}/")

    walk(path, "")
    return h.hexdigest()


def child(*args: Any) -> dict[str, float]:
    proc = run([PY, BENCH / "restore_child.py", *args], BENCH)
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}


def run_all(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    rounds = 3 if quick else 5
    t = perf()
    root = tiny_jpegs(tmp / "files100k", FILES, CLASSES)
    say(f"[5] wrote {FILES} files in {perf() - t:.1f} s")
    epoch = FILES // BATCH
    points = {"early": 20, "late": int(epoch * 0.96)}
    for name, step in points.items():
        t = perf()
        child("make", tmp / f"ck-{name}", root, step)
        say(f"[5] {name} checkpoint at step {step} of {epoch} made in {perf() - t:.1f} s")
    results: dict[str, list[dict]] = {"fresh": [], "early": [], "late": []}
    kinds = list(results)
    for r in range(rounds):
        for kind in kinds[r % 3:] + kinds[:r % 3]:
            ckdir = tmp / ("ck-none" if kind == "fresh" else f"ck-{kind}")
            results[kind].append(child("time", ckdir, root, 0 if kind == "fresh" else points[kind]))
        say(f"[5] round {r + 1}/{rounds}: " + ", ".join(
            f"{k} {fmt_s(v[-1]['total'])}" for k, v in results.items()))
    med = {k: {p: median(x[p] for x in v) for p in v[0]} for k, v in results.items()}
    rows = []
    for kind in ("early", "late"):
        ratio = med[kind]["total"] / med["fresh"]["total"]
        rows.append(Row(f"5 restore {kind} (step {points[kind]} of {epoch}) vs fresh start",
                        fmt_s(med[kind]["total"]), fmt_s(med["fresh"]["total"]), f"{ratio:.2f}x",
                        "<= 1.2x", yes_no(ratio <= 1.2), {"ours": med[kind], "ref": med["fresh"]}))
    digest = med["fresh"]["digest"]
    rows.append(Row(f"5 data digest of file_root ({FILES} files), share of fresh start",
                    fmt_s(digest), fmt_s(med["fresh"]["total"]),
                    f"{digest / med['fresh']['total']:.0%}", "-", "n/a", {"digest_s": digest}))
    # The proposal, side by side with today's function on the same tree.
    from dvc_dali.dali import dali_state

    now, new = [], []
    for _ in range(3):
        t = perf()
        a = dali_state._data_digest(str(root), "file_root")
        now.append(perf() - t)
        t = perf()
        b = scandir_digest(str(root))
        new.append(perf() - t)
    same = a == b
    rows.append(Row("5 data digest: proposed os.scandir walk vs today's os.walk+getsize",
                    fmt_s(median(new)), fmt_s(median(now)), f"{median(new) / median(now):.2f}",
                    "-", "n/a", {"scandir_s": new, "walk_s": now, "same_digest": same}))
    notes = [f"[5] {kind}: " + ", ".join(f"{p} {fmt_s(v)}" for p, v in med[kind].items())
             for kind in kinds]
    notes.append(f"[5] pipeline = prepare + describe (includes digest) + build (restore) + "
                 f"warn_unnamed; scandir digest identical to today's: {same}")
    return rows, notes, {"results": results, "points": points}
