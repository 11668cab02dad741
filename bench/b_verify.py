"""Benchmark 16: the cost of the proof at runtime. DALI batches/s with a
Checkpointer.save every 10 steps, batch digests on (the default, every
batch) vs off (DVC_DALI_VERIFY_BATCHES=0), while recording and while a
resume compares each batch with its digest; and the content digest's time
per GB (data_contents, from the page cache). On the CPU, or (run.py --gpu)
decoded on GPU 0, where the digest is a sum computed on the device.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from common import Row, median, say, write_jpegs, yes_no

perf = time.perf_counter
EVERY = 10
GOAL = 0.99


def _checkpointer(ckdir: Path, verify: str, resume: bool):
    import dvc_dali

    os.environ["DVC_DALI_VERIFY_BATCHES"] = verify
    try:
        return dvc_dali.Checkpointer(ckdir, resume=resume)
    finally:
        del os.environ["DVC_DALI_VERIFY_BATCHES"]


def _prepare_resume(root: Path, ckdir: Path, steps: int) -> None:
    """A checkpoint at step EVERY followed by ``steps`` recorded batches."""
    from dali_pipes import PIPE_ARGS, decode_crop

    import dvc_dali

    shutil.rmtree(ckdir, ignore_errors=True)
    ck = dvc_dali.Checkpointer(ckdir, resume=False)
    pipe = ck.pipeline("train", decode_crop, root=str(root), **PIPE_ARGS)
    for step in range(1, EVERY + steps + 1):
        pipe.run()
        if step == EVERY:
            ck.save(step)
    ck.close()
    del pipe, ck
    gc.collect()


def paired_blocks(root: Path, tmp: Path, steps: int, resumed: bool) -> dict[str, float]:
    """Batches/s with digests on and off, in one process, alternating every
    EVERY steps (one checkpoint interval) between the two runs, so that the
    load of the machine falls on both alike. Recording: each run saves at
    the end of each of its intervals. Resumed: each resumes a checkpoint
    whose next ``steps`` batches were recorded, so (on) every batch is
    compared."""
    from dali_pipes import PIPE_ARGS, decode_crop

    runs = {}
    for verify in ("on", "off"):
        ckdir = tmp / f"ck-{verify}-{'resumed' if resumed else 'recording'}"
        if resumed:
            _prepare_resume(root, ckdir, steps)
        else:
            shutil.rmtree(ckdir, ignore_errors=True)
        ck = _checkpointer(ckdir, "all" if verify == "on" else "0", resumed)
        runs[verify] = (ck, ck.pipeline("train", decode_crop, root=str(root), **PIPE_ARGS))
    elapsed = {"on": 0.0, "off": 0.0}
    w = np.zeros(1024, np.float32)
    for block in range(steps // EVERY):
        for verify in (("on", "off") if block % 2 == 0 else ("off", "on")):
            ck, pipe = runs[verify]
            t0 = perf()
            for _ in range(EVERY):
                pipe.run()
            if not resumed:
                ck.save(EVERY * (block + 1), arrays={"w": w})
            elapsed[verify] += perf() - t0
    for ck, _ in runs.values():
        ck.wait()
        ck.close()
    del runs
    gc.collect()
    return {v: steps / t for v, t in elapsed.items()}


def content_digest_s_per_gb(tmp: Path, megabytes: int) -> float:
    """data_contents over ``megabytes`` MB in 200 files, from the page cache."""
    from dvc_dali import data_contents

    root = tmp / "content"
    root.mkdir()
    block = np.random.default_rng(0).integers(0, 255, megabytes * (1 << 20) // 200,
                                              dtype=np.uint8).tobytes()
    for i in range(200):
        (root / f"{i:03d}.bin").write_bytes(block)
    description = {"operators": {"reader": {"args": {"file_root": str(root)}}}}
    data_contents.start("warm", description, 1 << 40).result()  # into the page cache
    times = []
    for _ in range(3):
        t = perf()
        data_contents.start("bench", description, 1 << 40).result()
        times.append(perf() - t)
    shutil.rmtree(root)
    return median(times) / (megabytes / 1024)


def run_all(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    n_images, steps, rounds, mb = (2000, 600, 3, 256) if quick else (2000, 2000, 3, 1024)
    say(f"[16] writing {n_images} JPEGs")
    root = write_jpegs(tmp / "jpegs", n_images, classes=8)
    rates: dict[str, list[float]] = {m: [] for m in ("on", "off", "resumed on", "resumed off")}
    for r in range(rounds):
        for resumed in (False, True):
            got = paired_blocks(root, tmp, steps, resumed)
            for verify, rate in got.items():
                rates[f"resumed {verify}" if resumed else verify].append(rate)
        say(f"[16] round {r + 1}/{rounds}: " + ", ".join(f"{m} {v[-1]:.1f}/s"
                                                          for m, v in rates.items()))
    rows = []
    for label, on, off in (("recording", "on", "off"), ("a resume comparing", "resumed on",
                                                         "resumed off")):
        paired = median(a / b for a, b in zip(rates[on], rates[off]))
        rows.append(Row(f"16 DALI batches/s, batch digests on vs off, {label}, save every "
                        f"{EVERY}", f"{median(rates[on]):.1f}/s", f"{median(rates[off]):.1f}/s",
                        f"{paired:.3f}", f">= {GOAL}", yes_no(paired >= GOAL),
                        {"on": rates[on], "off": rates[off], "paired_ratio": paired}))
    per_gb = content_digest_s_per_gb(tmp, mb)
    rows.append(Row("16 content digest (data_contents), seconds per GB from the page cache",
                    f"{per_gb:.2f} s/GB", "-", "-", values={"s_per_gb": per_gb}))
    notes = [f"[16] {n_images} JPEGs 96-128 px, crop 64x64, batch 32 (384 KB a batch); in each "
             f"of {rounds} rounds two runs in one process, digests on and off, {steps} steps "
             f"each, alternating every {EVERY} steps; ratio = median of the rounds' ratios; "
             + "; ".join(f"{m} {', '.join(f'{x:.1f}' for x in v)}" for m, v in rates.items()),
             f"[16] content digest over {mb} MB in 200 files, median of 3"]
    return rows, notes, {"rates": rates, "content_s_per_gb": per_gb}
