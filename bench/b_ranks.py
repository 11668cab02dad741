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
- The example's DVCLive step at each checkpoint (rank 0's training thread):
  ck.live()'s next_step vs DVCLive's own, whose VS Code signal file is
  fsynced, alternated in blocks in one project. No goal: part of the
  example's own work at each checkpoint, which the throughput row counts.
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
import os
import re
from dataclasses import dataclass
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


def _live_step_row(tmp: Path, quick: bool) -> tuple[Row, dict[str, Any]]:
    """The example's DVCLive step at each checkpoint (rank 0's training
    thread): DVCLive's own next_step (its VS Code signal fsynced) vs
    ck.live()'s, in one git and DVC project, alternated in blocks."""
    import time

    from dvclive import Live

    from dvc_dali.integrations.live import resume_live

    say("[7] the example's DVCLive step: DVCLive's own next_step vs ck.live()'s")
    project = tmp / "live-step"
    project.mkdir()
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"],
                ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "b"]):
        run(cmd, project)
    here = os.getcwd()
    os.chdir(project)
    try:
        lives = {"dvclive": Live(dir="theirs", save_dvc_exp=False, dvcyaml=False),
                 "ours": resume_live(0, False, "ours")}
        lives["dvclive"].post_data_to_studio = lambda: None  # as ck.live() skips it too
        times: dict[str, list[float]] = {"dvclive": [], "ours": []}
        for block in range(10 if quick else 30):
            for name in (("dvclive", "ours") if block % 2 else ("ours", "dvclive")):
                live = lives[name]
                for _ in range(10):
                    live.log_metric("train/loss", 0.5)
                    live.log_metric("train/acc", 0.9)
                    t0 = time.perf_counter()
                    live.next_step()
                    times[name].append(time.perf_counter() - t0)
        for live in lives.values():
            live.end()
    finally:
        os.chdir(here)
    ours, theirs = median(times["ours"]), median(times["dvclive"])
    values = {"ours_s": ours, "dvclive_s": theirs}
    return Row("[7] the example's DVCLive step a checkpoint (rank 0, training thread): "
               "ck.live()'s next_step vs DVCLive's own (its VS Code signal fsynced)",
               f"{ours * 1000:.2f} ms", f"{theirs * 1000:.2f} ms", f"{ours / theirs:.2f}",
               values=values), values


@dataclass
class _ExampleRun:
    """One run of the distributed example (example_floor.py's arms print the rest)."""

    seconds: float  # its own clock, from its first step to its last checkpoint's line
    cpu: dict[int, tuple[float, float]]  # rank: CPU per checkpoint (training, background)
    intervals: list[list[Any]]  # alternate, rank 0: [ours made, seconds] per interval


def _example_run(tmp: Path, data: Path, every: int, steps: int, tag: str,
                 arm: str | None = None) -> _ExampleRun:
    """The example's 2 ranks for ``steps`` steps: the example itself, or
    with ``arm`` example_floor.py's (floor, loop, ours or alternate)."""
    work = tmp / f"example-{tag}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "params.yaml").write_text(
        f"train:\n  framework: torch\n  steps: {steps}\n  checkpoint_every: {every}\n"
        f"  data: {data}\n  device: cpu\n")
    script = EXAMPLES / "train.py" if arm is None else BENCH / "example_floor.py"
    out = run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", 2,
               script, "--checkpoint", work / "checkpoint",
               "--model", work / "model.npz", "--live", work / "dvclive"], work,
              {"DVC_DALI_ASYNC": "1", "DVC_DALI_BENCH_ARM": arm or ""})
    found = re.findall(rf"step +{steps}/{steps} .*\(([0-9.]+) s\)", out.stdout)
    cpu = {int(r): (float(t) / 1000, float(b) / 1000) for r, t, b in re.findall(
        r"bench cpu per checkpoint rank (\d+): ([0-9.]+) ms, ([0-9.]+) ms", out.stdout)}
    spans = re.findall(r"bench intervals rank 0: (.*)", out.stdout)
    return _ExampleRun(float(found[-1]), cpu, json.loads(spans[-1]) if spans else [])


# benchmark 7's example arms: (name, checkpoint interval, example_floor.py's arm)
_ARMS = (("none", 10 ** 9, None), ("loop", 10, "loop"), ("floor", 10, "floor"),
         ("ours", 10, "ours"), ("alternate", 10, "alternate"))
# its throughput rows: (arm, reference arm, what the row compares, goal)
_RATIOS = (
    ("ours", "none", "async checkpoint every 10 steps vs none", 0.97),
    ("loop", "none", "the example's own work at each checkpoint (its metrics logged, its "
                     "model file written; no checkpoint) every 10 steps vs none", None),
    ("floor", "loop", "the floor (each rank's tensors copied, written to one file and "
                      "fsynced on a thread) vs the example's own work alone", None),
    ("ours", "loop", "async checkpoint vs the example's own work alone", None),
    ("ours", "floor", "async checkpoint every 10 steps vs the floor", None))


def _throughput_row(tmp: Path, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    data = tmp / "digits"
    if not data.is_dir():
        run([PY, EXAMPLES / "prepare.py", data], tmp)
    # 2 ranks on 2 cores: one round's ratio varies by +-7%, so several short
    # rounds, each a run of every arm back to back, and the median of their ratios
    steps, rounds = (400, 3) if quick else (600, 7)
    say(f"[7] the distributed example, {steps} steps, {rounds} rounds of: no checkpoint, the "
        "example's own work every 10 steps, the floor's checkpoints and ours")
    found: dict[str, list[_ExampleRun]] = {name: [] for name, _, _ in _ARMS}
    for i in range(rounds):  # alternated, side by side; each round in another order,
        # so that no arm always runs right after the same one (bench 16 found
        # a few percent for the one run first of two in one process)
        for name, every, arm in _ARMS[i % len(_ARMS):] + _ARMS[:i % len(_ARMS)]:
            found[name].append(_example_run(tmp, data, every, steps, f"{name}-{i}", arm))
    runs = {name: [r.seconds for r in found[name]] for name in found}
    values: dict[str, Any] = {f"{k}_s": v for k, v in runs.items()}
    values["steps"] = steps
    rows = []
    for key, over, label, goal in _RATIOS:
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
    rows.append(_cpu_row({name: [r.cpu for r in found[name]] for name in found}, values))
    rows.append(_interval_row([r.intervals for r in found["alternate"]], values))
    return rows, values


def _interval_row(rounds: list[list[list[Any]]], values: dict[str, Any]) -> Row:
    """One run per round, ours at every other checkpoint: each interval after
    one of ours against the next, after none (the first pair left out: a
    first checkpoint's costs), the median of every pair's ratio."""
    on, off = [], []
    for spans in rounds:
        for (made, with_ours), (_, without) in zip(spans[2::2], spans[3::2]):
            assert made, spans
            on.append(with_ours)
            off.append(without)
    ratios = sorted(b / a for a, b in zip(on, off))
    ratio = median(ratios)
    values["alternate"] = {"with_s": on, "without_s": off, "ratios": ratios,
                           "pairs": len(ratios)}
    return Row(f"[7] distributed example: a checkpoint interval (10 steps) after an async "
               f"checkpoint vs after none, ours at every other checkpoint in one run (rank 0, "
               f"median of {len(ratios)} pairs; quartiles)",
               f"{median(on) * 1000:.1f} ms", f"{median(off) * 1000:.1f} ms",
               f"{ratio:.3f} ({ratios[len(ratios) // 4]:.3f}-{ratios[3 * len(ratios) // 4]:.3f})"
               if ratios else "-", values=values)


def _cpu_row(cpu: dict[str, list[dict[int, tuple[float, float]]]],
             values: dict[str, Any]) -> Row:
    """Each rank's CPU per checkpoint, ours vs the floor's (medians over rounds)."""
    def per_rank(arm: str) -> dict[int, tuple[float, float]]:
        ranks = sorted({r for found in cpu[arm] for r in found})
        return {r: tuple(median(f[r][k] for f in cpu[arm] if r in f) for k in (0, 1))
                for r in ranks}

    ours, floor = per_rank("ours"), per_rank("floor")
    values["cpu_per_checkpoint_s"] = {"ours": ours, "floor": floor}

    def text(found: dict[int, tuple[float, float]]) -> str:
        return "; ".join(f"rank {r} {t * 1e3:.2f} + {b * 1e3:.2f} ms"
                         for r, (t, b) in found.items())

    total = {arm: sum(t + b for t, b in found.values())
             for arm, found in (("ours", ours), ("floor", floor))}
    return Row("[7] distributed example: CPU per checkpoint per rank, training thread + "
               "background threads, async checkpoint vs the floor (median of the rounds)",
               text(ours), text(floor),
               f"{total['ours'] / total['floor']:.1f}x" if total["floor"] else "-",
               values=values)


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
        live_step, live_values = _live_step_row(tmp, quick)
        throughput, throughput_values = _throughput_row(tmp, quick)
        throughput.insert(0, live_step)
        throughput_values = {**throughput_values, "live_step": live_values}
    except ImportError:
        throughput = [Row("[7] distributed example, async checkpoint every 10 steps vs none",
                          "not run (dvclive absent)", "-", "-", ">= 0.97", "n/a")]
        throughput_values = {}
    return (rows + async_rows + [file_work, should_save, *throughput], [],
            {"ranks_median_s": medians, "async": async_values, "file_work": file_work_values,
             "should_save": should_save_values, "example": throughput_values})
