"""Benchmark 6: `dvc exp show` with 10 vs 300 checkpoint rows, and with
retention (DVC_DALI_KEEP_LAST=10) on a 300-checkpoint run. The rows come
from one `dvc exp run` whose loop makes that many 1 KB checkpoints."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from b_checkpoint import OURS_YAML, run_exp
from common import DVC3, PY, Row, fmt_s, median, run, say, write_jpegs, yes_no

perf = time.perf_counter


def run_all(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    many, repeats = (100, 2) if quick else (300, 4)
    images = write_jpegs(tmp / "images", 4, classes=2, side=(16, 16))
    runs = {"10": (10, {}), str(many): (many, {}),
            f"{many}-keep10": (many, {"DVC_DALI_KEEP_LAST": "10"})}
    logs: dict[str, list[dict]] = {}
    refs: dict[str, int] = {}
    for name, (n, extra) in runs.items():
        say(f"[6] dvc exp run with {n} checkpoints {extra or ''}")
        t = perf()
        logs[name] = run_exp(tmp, f"rows{name}", images, plan=[(1024, n)], dvc=DVC3,
                             yaml=OURS_YAML, script="train_ckpt.py", stage_python=PY,
                             pipe=False, extra_env=extra)[1024]
        say(f"[6]   took {perf() - t:.1f} s")
        out = run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"],
                  tmp / f"rows{name}").stdout
        # experiment rows: refs/exps/<baseline[:2]>/<baseline[2:]>/<name>
        refs[name] = sum(1 for ref in out.split() if len(ref.split("/")) == 5
                         and len(ref.split("/")[2]) == 2)
    # DVC 3 caches what `exp show` collects per commit (.dvc/tmp/exps/cache):
    # the first call after the run is cold, the next ones warm.
    cold: dict[str, float] = {}
    warm: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(repeats + 1):
        for name in runs:
            t = perf()
            run([*DVC3, "exp", "show"], tmp / f"rows{name}")
            took = perf() - t
            if r == 0:
                cold[name] = took
            else:
                warm[name].append(took)
    med = {k: median(v) for k, v in warm.items()}
    m, k10 = str(many), f"{many}-keep10"
    rows = []
    for label, key in ((f"{refs[m]} vs {refs['10']} rows", m),
                       (f"{many} checkpoints kept to {refs[k10]} rows (KEEP_LAST=10) vs "
                        f"{refs['10']}", k10)):
        rows.append(Row(f"6 dvc exp show cold (first call), {label}", fmt_s(cold[key]),
                        fmt_s(cold["10"]), f"{cold[key] / cold['10']:.2f}x", "-", "n/a",
                        {"cold_s": cold[key], "ref_cold_s": cold["10"]}))
        rows.append(Row(f"6 dvc exp show warm (cached), {label}", fmt_s(med[key]),
                        fmt_s(med["10"]), f"{med[key] / med['10']:.2f}x", "-", "n/a",
                        {"warm_s": warm[key], "ref_warm_s": warm["10"]}))
    rows += _dvc_dali_show(tmp, images, 1000, repeats)
    times = {"cold": cold, "warm": warm}
    notes = []
    for name in (str(many), f"{many}-keep10"):
        blocked = [e["blocked"] for e in logs[name]]
        early, late = median(blocked[1:11]), median(blocked[-10:])
        rows.append(Row(f"6 make_checkpoint blocking, checkpoints {many - 9}-{many} vs 2-11"
                        f"{' (KEEP_LAST=10)' if 'keep' in name else ''}", fmt_s(late),
                        fmt_s(early), f"{late / early:.2f}x", "-", "n/a",
                        {"blocked_s": blocked}))
        if "keep" in name:
            ret = [e.get("retention", 0) for e in logs[name]]
            notes.append(f"[6] retention (apply_retention) per checkpoint: checkpoints 2-11 "
                         f"{fmt_s(median(ret[1:11]))}, {many - 9}-{many} "
                         f"{fmt_s(median(ret[-10:]))}")
    notes.append("[6] dvc exp show (s): " + "; ".join(
        f"{k}-checkpoint run: cold {cold[k]:.2f}, warm {', '.join(f'{x:.2f}' for x in v)}"
        for k, v in warm.items()) + "; rows = refs under refs/exps/<baseline>/ "
        "(checkpoints + the run's own)")
    return rows, notes, {"times": times, "refs": refs,
                         "blocked": {k: [e["blocked"] for e in v] for k, v in logs.items()}}


def _floor(repo: Path) -> float:
    """The same reads by git alone: the rows' refs with their commit messages
    (`git for-each-ref`, as `dvc-dali show` asks for them) and one `git
    cat-file --batch` of every row's metrics file."""
    t = perf()
    out = subprocess.run(["git", "for-each-ref", "--format=%(objectname)%00%(refname)%00"
                          "%(committerdate:unix)%00%(contents)%00%00", "refs/exps"], cwd=repo,
                         capture_output=True, check=True).stdout
    shas = [rec.lstrip(b"\n").split(b"\0")[0] for rec in out.split(b"\0\0") if rec.strip()]
    subprocess.run(["git", "cat-file", "--batch"], cwd=repo, capture_output=True, check=True,
                   input=b"".join(sha + b":dvclive/metrics.json\n" for sha in shas))
    return perf() - t


def _dvc_dali_show(tmp: Path, images: Path, n: int, repeats: int) -> list[Row]:
    """`dvc-dali show` (the command, as a person runs it) on a run of ``n``
    rows vs its floor (the same git reads alone, side by side) and vs a run
    of 10 rows."""
    say(f"[6] dvc exp run with {n} checkpoints, for dvc-dali show")
    run_exp(tmp, f"show{n}", images, plan=[(1024, n)], dvc=DVC3, yaml=OURS_YAML,
            script="train_ckpt.py", stage_python=PY, pipe=False)
    took: dict[str, list[float]] = {"n": [], "10": [], "floor": [], "python": []}
    for _ in range(repeats + 2):
        for key, repo in (("n", tmp / f"show{n}"), ("10", tmp / "rows10")):
            t = perf()
            run([PY, "-m", "dvc_dali.cli", "show"], repo)
            took[key].append(perf() - t)
        took["floor"].append(_floor(tmp / f"show{n}"))
        t = perf()
        run([PY, "-c", "pass"], tmp)
        took["python"].append(perf() - t)
    big, small, floor, py = (median(took[k][1:]) for k in ("n", "10", "floor", "python"))
    return [Row(f"6 `dvc-dali show`, {n} rows (the whole command) vs the floor: git "
                "for-each-ref of the rows + one cat-file --batch of their metrics",
                fmt_s(big), fmt_s(floor), f"{big / floor:.2f}x", "<= 2x",
                yes_no(big <= 2 * floor) if n >= 1000 else "n/a", {"show_s": took}),
            Row(f"6 `dvc-dali show`, {n} vs 10 rows; Python's own start (`python -c pass`) "
                f"{fmt_s(py)}", fmt_s(big), fmt_s(small), f"{big / small:.2f}x", "-", "n/a")]
