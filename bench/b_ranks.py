"""7. Checkpoints across torch.distributed ranks (processes under
torch.distributed.run, gloo, CPU).

- Checkpoint time against the number of ranks (1, 2, 4): every rank saves
  its DALI shard state and 1 MB of arrays, rank 0 publishes LATEST after a
  barrier. No goal: reported for information (the barrier makes it grow).
- Asynchronous checkpoints (issue 39), 2 and 4 ranks, 100 MB per rank (20 MB
  with --quick): the time a make_checkpoint call blocks its rank (the
  slowest rank's median), asynchronous vs the in-memory snapshot alone (goal:
  <= snapshot + 5 ms; also against the whole in-memory capture: arrays, DALI
  states, random generators), and synchronous vs asynchronous, printed with the
  per-rank background write time and rank 0's commit time (outside `dvc exp
  run`: every rank's files durable, LATEST written; no row recorded).
- A checkpoint's file work on one rank (write the snapshot, publish LATEST,
  remove the superseded one; in-process, no torch.distributed) for the
  example's state (its MLP's and AdamW's 16 tensors, torch's generator):
  small arrays sharing a pack (format 3) vs one file each (format 2's
  layout, store.PACK_BELOW 0), CPU time, alternated in one run. No goal:
  it is the part of a background checkpoint that takes CPU from training.
- Checkpointer.should_save, asked at every step (preemption agreed across
  ranks), 2 ranks (gloo), each step a gradient's all_reduce: its time a call
  vs the synchronous all_reduce and the all_gather_object it made before
  (the same agreement), alternated in blocks of 100 steps.
- The distributed example (examples/train.py, PyTorch, 2 ranks, gloo) with
  an asynchronous checkpoint every 10 steps vs none (one at the last step),
  outside `dvc exp run`: training steps per second from the example's own
  clock, runs alternated, the median of each round's ratio (goal >= 0.97).
  Beside them the floor (example_floor.py): the example with each rank's
  tensors copied, written to one file and fsynced on a thread every 10
  steps in place of our checkpoint, vs none, and ours vs the floor.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from common import PY, BENCH, Row, median, run, say, write_jpegs, yes_no


def _child(tmp: Path, images: Path, n: int, saves: int, mode: str, mb: float) -> list[dict]:
    out = run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", n,
               BENCH / "ranks_child.py", images, tmp / f"ranks-{n}-{mode}-{mb}" / "checkpoint",
               saves, mode, mb], tmp)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _slowest(per_rank: list[dict], key: str, first: int = 1) -> float:
    """Median over calls (the first skipped: warm-up) of the slowest rank's time."""
    saves = len(per_rank[0][key])
    return median(max(ts[key][i] for ts in per_rank) for i in range(first, saves))


def _async_rows(tmp: Path, images: Path, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    mb = 20.0 if quick else 100.0
    saves = 4 if quick else 8
    rows, values = [], {}
    for n in (2, 4):
        say(f"[7] {n} ranks, {mb:.0f} MB each: snapshot, capture, asynchronous, synchronous")
        got = {mode: _child(tmp, images, n, saves, mode, mb)
               for mode in ("snapshot", "capture", "async", "sync")}
        snap, cap, asy, syn = (_slowest(got[m], "block")
                               for m in ("snapshot", "capture", "async", "sync"))
        writes = [median(r["write"][1:]) for r in got["async"]]
        record = median(got["async"][0]["record"][1:])
        values[n] = {"snapshot_s": snap, "capture_s": cap, "async_s": asy, "sync_s": syn,
                     "write_s": writes, "commit_s": record}
        rows.append(Row(f"[7] async make_checkpoint blocking, {n} ranks x {mb:.0f} MB, "
                        "vs the snapshot alone", f"{asy * 1000:.1f} ms", f"{snap * 1000:.1f} ms",
                        f"{(asy - snap) * 1000:+.1f} ms", "<= snapshot + 5 ms",
                        yes_no(asy <= snap + 0.005), values={"ranks": n, **values[n]}))
        rows.append(Row(f"[7] the same vs the whole in-memory capture (arrays, DALI states, "
                        f"random generators), {n} ranks", f"{asy * 1000:.1f} ms",
                        f"{cap * 1000:.1f} ms", f"{(asy - cap) * 1000:+.1f} ms",
                        "<= capture + 5 ms", yes_no(asy <= cap + 0.005),
                        values={"ranks": n, **values[n]}))
        rows.append(Row(f"[7] sync vs async blocking, {n} ranks x {mb:.0f} MB; background "
                        "write per rank, rank 0's commit",
                        f"{syn * 1000:.1f} ms vs {asy * 1000:.1f} ms; write "
                        + "/".join(f"{w * 1000:.0f}" for w in writes)
                        + f" ms; commit {record * 1000:.1f} ms",
                        "", f"{syn / asy:.1f}x", values={"ranks": n, **values[n]}))
    return rows, values


EXAMPLES = BENCH.parent / "examples"


def _should_save_row(tmp: Path, quick: bool) -> tuple[Row, dict[str, Any]]:
    say("[7] should_save at every step, 2 ranks: asynchronous all_reduce read a step later "
        "vs a synchronous all_reduce vs all_gather_object")
    out = run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", 2,
               BENCH / "should_save_child.py", tmp / "should-save" / "checkpoint",
               1000 if quick else 3000], tmp)
    times = json.loads(out.stdout.strip().splitlines()[-1])
    ours, sync = median(times["should_save"]), median(times["max_int"])
    before = median(times["all_gather_object"])
    values = {"should_save_s": ours, "max_int_s": sync, "all_gather_object_s": before}
    return Row("[7] should_save a step, 2 ranks (gloo), each step a gradient's all_reduce: "
               "one asynchronous all_reduce read at the next step vs one synchronous "
               "all_reduce (before) vs all_gather_object (before that)", f"{ours * 1e6:.0f} us",
               f"{sync * 1e6:.0f} us / {before * 1e6:.0f} us",
               f"{ours / sync:.2f} / {ours / before:.2f}", values=values), values


def _file_work_row(tmp: Path, quick: bool) -> tuple[Row, dict[str, Any]]:
    import time
    from collections import OrderedDict

    import torch

    from dvc_dali.format import arrays as arrays_mod, store

    torch.manual_seed(0)
    model = torch.nn.Sequential(OrderedDict(fc1=torch.nn.Linear(16 * 16, 64),
                                            relu=torch.nn.ReLU(), fc2=torch.nn.Linear(64, 10)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(8, 16 * 16)).sum().backward()
    opt.step()
    cpu: dict[str, list[float]] = {"packed": [], "files": []}
    below = store.PACK_BELOW
    say("[7] a checkpoint's file work, the example's state: packed vs one file an array")
    try:
        for i in range(40 if quick else 120):
            mode = ("packed", "files")[i % 2]
            store.PACK_BELOW = below if mode == "packed" else 0
            state = arrays_mod.snapshot({"model": model.state_dict(), "optim": opt.state_dict(),
                                         "rng": {"torch": torch.get_rng_state()}})
            root = tmp / f"file-work-{mode}"
            capture = store.Capture(i + 1, {"train": {"state": bytes(492)}}, state, {}, {})
            c0 = time.process_time()
            name, md5 = store.write_capture(root, capture)
            store.publish(root, [(name, md5)])
            store.remove_leftovers(root, keep=name)
            cpu[mode].append(time.process_time() - c0)
    finally:  # the later rows of this run write packs again
        store.PACK_BELOW = below
    packed, files = median(cpu["packed"][2:]), median(cpu["files"][2:])
    values = {"packed_cpu_s": packed, "one_file_each_cpu_s": files}
    return Row("[7] a checkpoint's file work on one rank, the example's state (17 arrays): "
               "packed vs one file each, CPU", f"{packed * 1000:.2f} ms",
               f"{files * 1000:.2f} ms", f"{packed / files:.2f}", values=values), values


def _example_seconds(tmp: Path, data: Path, every: int, steps: int, tag: str,
                     script: Path = EXAMPLES / "train.py") -> float:
    """Seconds the example's 2 ranks took for ``steps`` steps (its own clock,
    from its first step to its last checkpoint's line); ``script``: the
    example, or example_floor.py (the floor's checkpoints in place of ours)."""
    work = tmp / f"example-{tag}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "params.yaml").write_text(
        f"train:\n  framework: torch\n  steps: {steps}\n  checkpoint_every: {every}\n"
        f"  data: {data}\n  device: cpu\n")
    out = run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", 2,
               script, "--checkpoint", work / "checkpoint",
               "--model", work / "model.npz", "--live", work / "dvclive"], work,
              {"DVC_DALI_ASYNC": "1"})
    found = re.findall(rf"step +{steps}/{steps} .*\(([0-9.]+) s\)", out.stdout)
    return float(found[-1])


def _throughput_row(tmp: Path, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    data = tmp / "digits"
    if not data.is_dir():
        run([PY, EXAMPLES / "prepare.py", data], tmp)
    # 2 ranks on 2 cores: one round's ratio varies by +-7%, so several short
    # rounds, each a run of the three back to back, and the median of their ratios
    steps, rounds = (400, 3) if quick else (600, 7)
    say(f"[7] the distributed example, {steps} steps, async every 10 vs the floor's "
        f"checkpoints every 10 vs none, {rounds} rounds")
    runs: dict[str, list[float]] = {"none": [], "ours": [], "floor": []}
    for i in range(rounds):  # alternated, side by side
        runs["none"].append(_example_seconds(tmp, data, 10 ** 9, steps, f"none-{i}"))
        runs["ours"].append(_example_seconds(tmp, data, 10, steps, f"async-{i}"))
        runs["floor"].append(_example_seconds(tmp, data, 10, steps, f"floor-{i}",
                                              BENCH / "example_floor.py"))
    values: dict[str, Any] = {f"{k}_s": v for k, v in runs.items()}
    values["steps"] = steps
    rows = []
    for key, over, label, goal in (
            ("ours", "none", "async checkpoint every 10 steps vs none", 0.97),
            ("floor", "none", "the floor (each rank's tensors copied, written to one file "
                              "and fsynced on a thread) every 10 steps vs none", None),
            ("ours", "floor", "async checkpoint every 10 steps vs the floor", None)):
        # steps/s of ``key`` over steps/s of ``over``, round by round
        ratios = sorted(b / a for a, b in zip(runs[key], runs[over]))
        ratio = median(ratios)
        values[f"{key}_vs_{over}"] = ratios
        rows.append(Row(f"[7] distributed example (2 ranks, gloo), {label}: throughput, median "
                        f"of {rounds} rounds' ratios (their range)",
                        f"{steps / median(runs[key]):.0f} steps/s",
                        f"{steps / median(runs[over]):.0f} steps/s",
                        f"{ratio:.3f} ({ratios[0]:.2f}-{ratios[-1]:.2f})",
                        f">= {goal}" if goal else "-",
                        yes_no(ratio >= goal) if goal else "n/a", values=values))
    return rows, values


def run_all(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    saves = 10 if quick else 30
    images = write_jpegs(tmp / "rank-images", 64, classes=2, side=(32, 32))
    medians: dict[int, float] = {}
    for n in (1, 2, 4):
        say(f"[7] {n} rank(s), {saves} saves each")
        per_rank = _child(tmp, images, n, saves, "sync", 1.0)
        # the slowest rank decides when training goes on
        medians[n] = _slowest(per_rank, "block")
    rows = [Row(f"[7] checkpoint time, {n} rank(s) vs 1", f"{medians[n] * 1000:.1f} ms",
                f"{medians[1] * 1000:.1f} ms", f"{medians[n] / medians[1]:.2f}x",
                values={"ranks": n, "median_s": medians[n]}) for n in (1, 2, 4)]
    async_rows, async_values = _async_rows(tmp, images, quick)
    file_work, file_work_values = _file_work_row(tmp, quick)
    should_save, should_save_values = _should_save_row(tmp, quick)
    try:  # the example logs with DVCLive (a GPU machine here may lack it)
        import dvclive  # noqa: F401
        throughput, throughput_values = _throughput_row(tmp, quick)
    except ImportError:
        throughput = [Row("[7] distributed example, async checkpoint every 10 steps vs none",
                          "not run (dvclive absent)", "-", "-", ">= 0.97", "n/a")]
        throughput_values = {}
    return (rows + async_rows + [file_work, should_save, *throughput], [],
            {"ranks_median_s": medians, "async": async_values, "file_work": file_work_values,
             "should_save": should_save_values, "example": throughput_values})
