"""Run every dvc-dali benchmark and print a table of medians and ratios, each
ratio measured side by side in this run.

    python bench/run.py             # full (about 10-15 minutes on 2 cores)
    python bench/run.py --quick     # short (under about 3 minutes)
    python bench/run.py --only 4,5  # some of them (1-3 run together)
    python bench/run.py --out       # also write bench/results/<time>.{json,md}
    python bench/run.py --gpu --only 4,5   # DALI on GPU 0 (mixed decoding)

1. make_checkpoint() blocking inside `dvc exp run`: ours (DVC 3) vs DVC 2.58's
   dvc.api.make_checkpoint(), 1 KB / 10 MB / 200 MB outputs
2. asynchronous make_checkpoint blocking vs the in-memory snapshot alone
3. 200 MB save + record end to end vs copy + md5 of the same bytes, per
   DVC cache type, with a breakdown
4. DALI throughput: checkpointing on vs off; Checkpointer.save every K steps
5. restore vs fresh start, early and late in an epoch of 100,000 files
6. `dvc exp show` with 10 vs 300 checkpoint rows, and with retention;
   `dvc-dali show` with 1,000 rows vs its floor (git for-each-ref + cat-file)
7. checkpoint time with 1, 2 and 4 torch.distributed ranks; asynchronous checkpoints
   across 2 and 4 ranks (blocking vs the snapshot alone and vs synchronous, per-rank
   write and commit times) and the distributed example's throughput with them,
   vs none, vs its own work at each checkpoint alone and vs the floor's checkpoints
   (example_floor.py: one file a rank, fsynced), each rank's CPU per checkpoint, and
   each interval after one of ours vs after none, alternated in one run; the example's
   DVCLive step, ck.live()'s vs DVCLive's own
8. training throughput with each row pushed to remotes as recorded vs not,
   and the delay from a row's recording to its ref on the remote
9. restore of a 1.06 GB torch model + AdamW state (336 tensors; --quick: 265 MB)
   in a new process (Checkpointer, dvc_dali.load) vs torch.load, warm and cold
   page cache, every page of every tensor read, and the memory each adds
10. per-checkpoint cost with a stage deps directory of 10k and 100k files vs 10
11. per-checkpoint cost with 10k and 100k git-tracked files vs 10
12. 1 GB torch state save (durable) vs torch.save + fsync, DCP and the disk floor
13. the same saved and recorded under `dvc exp run` vs torch.save + fsync
14. per-checkpoint cost with a stage deps directory committed to git of
    2,000 (and, full run only, 100,000) files vs 10
15. the cost of pushing one row to remotes holding 10,000 experiment refs and
    10,000 checkpoints' files vs to empty ones
16. DALI throughput with batch digests on vs off (recording, and a resume
    comparing each batch), a save every 10 steps; the content digest's s/GB

Every repository and data set lives in a temporary directory, removed at
the end (--keep keeps it). Nothing is timed in the tests: timings live here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# This checkout's dvc_dali, whatever `pip install -e` points at (children get PYTHONPATH).
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from common import _DVC_RUN_VARS, Row, say  # noqa: E402

GROUPS = {  # module: the benchmark numbers it covers
    "b_checkpoint": {1, 2, 3},
    "b_dali": {4},
    "b_restore": {5},
    "b_expshow": {6},
    "b_ranks": {7},
    "b_push": {8},
    "b_bigrestore": {9},
    "b_scale": {10, 11},
    "b_bigstate": {12, 13},
    "b_trackeddeps": {14},
    "b_busyremote": {15},
    "b_verify": {16},
}
DEFAULT = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}


def machine() -> dict[str, str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        ram = f"{kb / 1024 ** 2:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    fs = subprocess.run(["df", "-T", tempfile.gettempdir()], capture_output=True,
                        text=True).stdout.splitlines()[-1:]
    return {"nproc": str(os.cpu_count()), "ram": ram, "cpu": cpu,
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "tmp_fs": fs[0].split()[1] if fs else "?", "platform": platform.platform(),
            "gpu": gpu_name()}


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                               "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip() or "none"
    except (OSError, subprocess.SubprocessError):
        return "none"


def versions(with_dvc2: bool) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for label, dists in (("dvc", ["dvc"]), ("dvclive", ["dvclive"]),
                         ("dali", ["nvidia-dali-cuda120", "nvidia-dali-cuda130"]),
                         ("numpy", ["numpy"])):
        out[label] = "absent"
        for dist in dists:
            try:
                out[label] = f"{md.version(dist)} ({dist})" if label == "dali" else md.version(dist)
                break
            except md.PackageNotFoundError:
                pass
    import dvc_dali

    out["dvc-dali"] = f"{dvc_dali.__version__} ({Path(dvc_dali.__file__).parent})"
    out["git"] = subprocess.run(["git", "--version"], capture_output=True,
                                text=True).stdout.strip().removeprefix("git version ")
    if with_dvc2:
        from b_checkpoint import dvc2_paths

        found = dvc2_paths()
        if isinstance(found, str):
            out["dvc 2"] = f"unavailable ({found})"
        else:
            out["dvc 2"] = subprocess.run([str(found[0]), "--version"], capture_output=True,
                                          text=True).stdout.strip()
    return out


def table(rows: list[Row]) -> str:
    head = ("benchmark", "ours", "reference", "ratio", "goal", "met?")
    cells = [head] + [(r.bench, r.ours, r.reference, r.ratio, r.goal, r.met) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    line = lambda c: "| " + " | ".join(x.ljust(w) for x, w in zip(c, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep] + [line(c) for c in cells[1:]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (under ~3 min)")
    ap.add_argument("--only", default="", help="comma-separated benchmark numbers (1-7; "
                    "default: all)")
    ap.add_argument("--out", nargs="?", const="", default=None, metavar="STEM",
                    help="also write results to bench/results/STEM.json and .md "
                         "(default STEM: the date and time)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--gpu", action="store_true", help="benchmarks 4 and 5 decode on GPU 0")
    args = ap.parse_args(argv)
    for var in _DVC_RUN_VARS:  # a bench started inside a DVC stage must not inherit it
        os.environ.pop(var, None)
    if args.gpu:  # read by dali_pipes, here and in the child processes
        os.environ["DVC_DALI_BENCH_GPU"] = "1"
    wanted = {int(x) for x in args.only.split(",") if x.strip()} or DEFAULT
    modules = [m for m, nums in GROUPS.items() if nums & wanted]

    start = time.perf_counter()
    info = {"machine": machine(), "versions": versions("b_checkpoint" in modules),
            "mode": ("quick" if args.quick else "full") + (", DALI on GPU 0" if args.gpu else ""),
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    header = [f"dvc-dali benchmarks ({info['mode']}), {info['started']}",
              "machine: " + ", ".join(f"{k} {v}" for k, v in info["machine"].items()),
              "versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items())]
    say("\n".join(header))

    rows: list[Row] = []
    notes: list[str] = []
    raw: dict = {}
    base = Path(tempfile.mkdtemp(prefix="dvc-dali-bench-"))
    try:
        for name in modules:
            t = time.perf_counter()
            say(f"== {name}")
            try:
                module = __import__(name)
                sub = base / name
                sub.mkdir()
                r, n, data = module.run_all(sub, args.quick)
                rows += r
                notes += n
                raw[name] = data
            except Exception as exc:  # one broken benchmark does not hide the others
                traceback.print_exc()
                rows.append(Row(f"{sorted(GROUPS[name])} {name}", "ERROR", "-", "-", "-", "NO"))
                notes.append(f"{name}: {type(exc).__name__}: {str(exc)[:2000]}")
            notes.append(f"({name} took {time.perf_counter() - t:.0f} s)")
            if not args.keep:
                subprocess.run(["rm", "-rf", str(base / name)])
    finally:
        if args.keep:
            say(f"kept {base}")
        else:
            subprocess.run(["rm", "-rf", str(base)])
    total = time.perf_counter() - start
    header.append("load average at the end: " + " ".join(f"{x:.1f}" for x in os.getloadavg())
                  + " (other work on this machine shows up as noise)")

    text = "\n".join(header + ["", table(rows), "", "Details (medians):"] +
                     [f"- {n}" for n in notes] + [f"\ntotal {total:.0f} s"])
    print(text, flush=True)
    if args.out is not None:
        out_dir = BENCH / "results"
        out_dir.mkdir(exist_ok=True)
        stem = args.out or time.strftime("%Y%m%d-%H%M%S")
        (out_dir / f"{stem}.md").write_text(
            "# dvc-dali benchmarks\n\n```\n" + "\n".join(header) + "\n```\n\n" + table(rows)
            + "\n\n" + "\n".join(f"- {n}" for n in notes) + f"\n\ntotal {total:.0f} s\n")
        (out_dir / f"{stem}.json").write_text(json.dumps(
            {**info, "total_s": total, "rows": [dataclasses.asdict(r) for r in rows],
             "notes": notes, "raw": raw}, indent=1, default=str))
        say(f"wrote {out_dir / stem}.md and .json")
    return 1 if any(r.ours == "ERROR" for r in rows) else 0  # a missed goal is a result


if __name__ == "__main__":
    sys.exit(main())
