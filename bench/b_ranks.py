"""7. Checkpoint time against the number of ranks (1, 2, 4 processes under
torch.distributed.run, gloo, CPU): every rank saves its DALI shard state and
1 MB of arrays into one checkpoint, rank 0 publishes LATEST after a barrier.
No goal: reported for information (the barrier makes it grow with ranks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common import PY, BENCH, Row, median, run, say, write_jpegs


def run_all(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    saves = 10 if quick else 30
    images = write_jpegs(tmp / "rank-images", 64, classes=2, side=(32, 32))
    medians: dict[int, float] = {}
    for n in (1, 2, 4):
        say(f"[7] {n} rank(s), {saves} saves each")
        out = run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", n,
                   BENCH / "ranks_child.py", images, tmp / f"ranks-{n}" / "checkpoint", saves],
                  tmp)
        per_rank = json.loads(out.stdout.strip().splitlines()[-1])
        # the slowest rank decides when training goes on
        medians[n] = median(max(ts[i] for ts in per_rank) for i in range(1, saves))
    rows = [Row(f"[7] checkpoint time, {n} rank(s) vs 1", f"{medians[n] * 1000:.1f} ms",
                f"{medians[1] * 1000:.1f} ms", f"{medians[n] / medians[1]:.2f}x",
                values={"ranks": n, "median_s": medians[n]}) for n in (1, 2, 4)]
    return rows, [], {"ranks_median_s": medians}
