"""Benchmark 16: the cost of the proof at runtime, every row of issue 38's
goals table side by side in one run. DALI batches/s with a
Checkpointer.save every 10 steps, batch digests on (the default, every
batch) vs off (DVC_DALI_VERIFY_BATCHES=0), while recording and while a
resume compares each batch with its digest: on the CPU; decoded on GPU 0
(where the digest is computed on the device) wherever a GPU and CuPy are
at hand, else those rows say "not run"; a ``tf_dataset``
(b_tf_digests.py, in a child process). With them, what the digests cost
per batch on the training thread (Recorder.costs: the wrapper's work after
DALI returned, a comparison, a wait for the digest in flight) and on the
digest thread (CPU), and the content digest's time per GB (data_contents,
from the page cache).

Two runs side by side in one process are not alike: here the pipeline made
first runs 3-5% slower whatever it does (the same run twice, digests off in
both: 0.93-0.98 for the first-made, 1.04-1.07 the other way round). So the
rounds are made first by on and off in turn, the ratio is the geometric
mean of the rounds' ratios, and an A/A row (the same run twice) shows what
the method reads where nothing differs.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from common import BENCH, PY, Row, median, run, say, write_jpegs, yes_no

perf = time.perf_counter
EVERY = 10
GOAL = 0.99
GOALS = {("cpu", False): 0.99, ("cpu", True): 0.99, ("gpu", False): 0.99, ("gpu", True): 0.98,
         ("tf", False): 0.95, ("tf", True): 0.95}
GPU_DIGEST_GOAL_US = 50.0


def _checkpointer(ckdir: Path, verify: str, resume: bool):
    import dvc_dali

    os.environ["DVC_DALI_VERIFY_BATCHES"] = verify
    try:
        return dvc_dali.Checkpointer(ckdir, resume=resume)
    finally:
        del os.environ["DVC_DALI_VERIFY_BATCHES"]


def _pipe_args(gpu: bool) -> dict[str, Any]:
    from dali_pipes import PIPE_ARGS

    return {**PIPE_ARGS, "device_id": 0 if gpu else None, "gpu": gpu}


def _prepare_resume(root: Path, ckdir: Path, steps: int, gpu: bool) -> None:
    """A checkpoint at step EVERY followed by ``steps`` recorded batches."""
    from dali_pipes import decode_crop

    import dvc_dali

    shutil.rmtree(ckdir, ignore_errors=True)
    ck = dvc_dali.Checkpointer(ckdir, resume=False)
    pipe = ck.pipeline("train", decode_crop, root=str(root), **_pipe_args(gpu))
    for step in range(1, EVERY + steps + 1):
        pipe.run()
        if step == EVERY:
            ck.save(step)
    ck.close()
    del pipe, ck
    gc.collect()


def paired_blocks(root: Path, tmp: Path, steps: int, resumed: bool,
                  gpu: bool = False, first: str = "on", same: bool = False) -> dict[str, float]:
    """Batches/s with digests on and off, in one process, alternating every
    EVERY steps (one checkpoint interval) between the two runs, so that the
    load of the machine falls on both alike. Recording: each run saves at
    the end of each of its intervals. Resumed: each resumes a checkpoint
    whose next ``steps`` batches were recorded, so (on) every batch is
    compared. ``first``: the run made first, and first in the even blocks
    (the pipeline made first runs a few percent slower here, whatever it
    does: rounds() alternates it); ``same``: both runs with digests off
    (the method's own bias, the A/A row). Also (``caller_us``,
    ``thread_cpu_us``) the digests' cost per batch on the training thread
    and the digest thread's CPU."""
    from dali_pipes import decode_crop

    runs = {}
    order = (first, "off" if first == "on" else "on")
    for verify in order:
        ckdir = tmp / f"ck-{verify}-{'resumed' if resumed else 'recording'}"
        if resumed:
            _prepare_resume(root, ckdir, steps, gpu)
        else:
            shutil.rmtree(ckdir, ignore_errors=True)
        ck = _checkpointer(ckdir, "all" if verify == "on" and not same else "0", resumed)
        runs[verify] = (ck, ck.pipeline("train", decode_crop, root=str(root), **_pipe_args(gpu)))
    elapsed = {"on": 0.0, "off": 0.0}
    w = np.zeros(1024, np.float32)
    costs = runs["on"][0]._batches.costs
    for block in range(steps // EVERY):
        for verify in (order if block % 2 == 0 else order[::-1]):
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
    out = {v: steps / t for v, t in elapsed.items()}
    out["per_launch"] = costs.background / costs.groups if costs.groups else 1.0
    return {**out, **_per_batch(costs)}


def _per_batch(costs: Any) -> dict[str, float]:
    """A Recorder's costs a batch: on the training thread (us), on the digest
    thread (CPU us)."""
    return {"caller_us": costs.caller_s / max(costs.batches, 1) * 1e6,
            "thread_cpu_us": costs.background_cpu_s / max(costs.background, 1) * 1e6}


def step_bound_costs(root: Path, tmp: Path, steps: int = 200) -> dict[str, float]:
    """A loop whose training step is the slower (a 10 ms sleep, as a step
    waiting for a GPU; DALI has the batch ready when asked), digests on, a
    save every EVERY steps: what the digests cost a batch on the training
    thread, where a host batch is digested before it is handed out."""
    from dali_pipes import decode_crop

    ckdir = tmp / "ck-step-bound"
    shutil.rmtree(ckdir, ignore_errors=True)
    ck = _checkpointer(ckdir, "all", False)
    pipe = ck.pipeline("train", decode_crop, root=str(root), **_pipe_args(False))
    for step in range(1, steps + 1):
        pipe.run()
        time.sleep(0.010)
        if step % EVERY == 0:
            ck.save(step)
    ck.wait()
    costs = ck._batches.costs  # noqa: SLF001 (what the benchmark prints)
    ck.close()
    del pipe, ck
    gc.collect()
    return _per_batch(costs)


def gpu_missing() -> str | None:
    """Why the GPU rows cannot run here; None where a GPU and CuPy are at hand."""
    try:
        import cupy
    except ImportError:
        return "no GPU (CuPy absent)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 (no driver, no device: the same answer)
        count = 0
    return None if count else "no GPU"


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


def gpu_digest_us(root: Path) -> tuple[float, float]:
    """(GPU time of the digest of one batch of 32 x 64x64x3 uint8 crops: two
    events on the digest stream around its work (the accumulator's reset,
    the kernel, the copy back), queued behind a kernel that keeps the GPU
    busy for a millisecond, so that the host's launch gaps are not counted;
    the wall time of batch_digests.digest of that batch, from its call to
    its value on the host), medians of 50, in microseconds."""
    import cupy
    from dali_pipes import decode_crop

    from dvc_dali.proof import batch_digests, device_digest

    pipe = decode_crop(root=str(root), **_pipe_args(True))
    pipe.build()
    images = pipe.run()[0]
    stream = device_digest._pool().stream(0)  # noqa: SLF001 (the stream the digests run on)
    spin = cupy.RawKernel(_SPIN, "spin")
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(5):
        batch_digests.digest([images])
    device, wall = [], []
    for _ in range(50):
        with stream:
            spin((1,), (1,), (np.int64(2_000_000),))
        start.record(stream)
        done = device_digest.begin([batch_digests._device_output(images)], 0, None)  # noqa: SLF001
        end.record(stream)
        done()
        device.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
        stream.synchronize()
        t = perf()
        batch_digests.digest([images])
        wall.append((perf() - t) * 1e6)
    del pipe
    return median(device), median(wall)


def tf_rates(tmp: Path, quick: bool) -> dict[str, Any] | str:
    """b_tf_digests.py in a child process: its results, or why not run."""
    import importlib.util

    for module in ("tensorflow", "nvidia.dali.plugin.tf"):
        if importlib.util.find_spec(module) is None:
            return f"not run ({module} absent)"
    out = tmp / "tf.json"
    rounds, steps = ("4", "60") if quick else ("6", "100")  # even: made first in turn
    proc = run([PY, BENCH / "b_tf_digests.py", "--rounds", rounds, "--steps", steps,
                "--json", out], tmp, check=False, timeout=1800)
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return f"error ({tail[0][:200]})"
    say("\n".join(line for line in proc.stdout.splitlines() if line.startswith("round")))
    return json.loads(out.read_text())


def content_digest_s_per_gb(tmp: Path, megabytes: int) -> float:
    """data_contents over ``megabytes`` MB in 200 files, from the page cache."""
    from dvc_dali.proof import data_contents

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


def _first(r: int) -> str:
    """The run made first in round ``r``: on and off in turn, so that the
    few percent the first-made pipeline loses here fall on both alike."""
    return ("on", "off")[r % 2]


def _dali_rounds(root: Path, tmp: Path, steps: int, rounds: int, gpu: bool
                 ) -> dict[bool, list[dict[str, float]]]:
    """{resumed: [paired_blocks of each round]}, rounds made first by on and off in turn."""
    got: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    where = "GPU" if gpu else "CPU"
    for r in range(rounds):
        for resumed in (False, True):
            got[resumed].append(paired_blocks(root, tmp, steps, resumed, gpu, _first(r)))
        say(f"[16] {where} round {r + 1}/{rounds} ({_first(r)} made first): " + "; ".join(
            f"{'resumed' if k else 'recording'} on {v[-1]['on']:.1f}/s off {v[-1]['off']:.1f}/s"
            f", {v[-1]['caller_us']:.0f} us a batch on the training thread"
            for k, v in got.items()))
    return got


def paired_ratio(rounds: list[dict[str, float]]) -> float:
    """The geometric mean of the rounds' on/off ratios: with as many rounds
    made first by each, the first-made run's loss cancels out."""
    return statistics.geometric_mean(r["on"] / r["off"] for r in rounds)


def _ratio_row(label: str, goal: float | None, rounds: list[dict[str, float]], what: str
               ) -> Row:
    paired = paired_ratio(rounds)
    ratios = sorted(r["on"] / r["off"] for r in rounds)
    return Row(f"16 {label}, {what}",
               f"{median(r['on'] for r in rounds):.1f}/s",
               f"{median(r['off'] for r in rounds):.1f}/s",
               f"{paired:.3f} ({ratios[0]:.2f}-{ratios[-1]:.2f})",
               f">= {goal}" if goal else "-", yes_no(paired >= goal) if goal else "n/a",
               {"on": [r["on"] for r in rounds], "off": [r["off"] for r in rounds],
                "paired_ratio": paired, "caller_us": [r["caller_us"] for r in rounds],
                "thread_cpu_us": [r["thread_cpu_us"] for r in rounds]})


def _cost_row(label: str, rounds: dict[bool, list[dict[str, float]]], unit: str) -> Row:
    rec, res = rounds[False], rounds[True]
    grouped = median(r.get("per_launch", 1.0) for r in rec)
    launches = f", {grouped:.1f} batches a launch" if grouped > 1 else ""
    return Row(f"16 {label}: what the digests cost a {unit} on the training thread "
               "(recording / resuming), and on the digest thread (CPU, recording)",
               f"{median(r['caller_us'] for r in rec):.0f} us / "
               f"{median(r['caller_us'] for r in res):.0f} us",
               f"{median(r['thread_cpu_us'] for r in rec):.0f} us{launches}", "-")


def _not_run(label: str, why: str, goal: str) -> Row:
    return Row(f"16 {label}", why, "-", "-", goal, "n/a")


def _gpu_rows(root: Path, tmp: Path, steps: int, rounds: int) -> tuple[list[Row], dict]:
    missing = gpu_missing()
    labels = [("GPU (DALI decoding on GPU 0), recording", GOALS["gpu", False]),
              ("GPU, resuming (each batch compared before it is returned)", GOALS["gpu", True])]
    if missing:
        return ([_not_run(f"{label}, digests on vs off", f"not run ({missing})", f">= {goal}")
                 for label, goal in labels] +
                [_not_run("the digest of one GPU batch of 32 x 64x64x3 uint8, device time",
                          f"not run ({missing})", f"<= {GPU_DIGEST_GOAL_US:.0f} us")], {})
    got = _dali_rounds(root, tmp, steps, rounds, gpu=True)
    rows = [_ratio_row(label, goal, got[resumed], f"digests on vs off, save every {EVERY}")
            for (label, goal), resumed in zip(labels, (False, True))]
    rows.append(_cost_row("GPU", got, "batch"))
    device_us, wall_us = gpu_digest_us(root)
    rows.append(Row("16 the digest of one GPU batch of 32 x 64x64x3 uint8: GPU time (events "
                    "on its stream, launches queued) and the wall time of a digest() call",
                    f"{device_us:.0f} us ({wall_us:.0f} us)",
                    "-", "-", f"<= {GPU_DIGEST_GOAL_US:.0f} us",
                    yes_no(device_us <= GPU_DIGEST_GOAL_US)))
    return rows, {"rounds": got, "digest_device_us": device_us, "digest_wall_us": wall_us}


def _tf_rows(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    got = tf_rates(tmp, quick)
    labels = (("recording", "recording"), ("resumed", "resuming (each element compared "
                                                      "before it is returned)"))
    if isinstance(got, str):
        return [_not_run(f"tf_dataset, {what}, digests on vs off", got, f">= {GOALS['tf', r]}")
                for r, (_key, what) in zip((False, True), labels)], {}
    mb = got["megabytes"]
    rows = [_ratio_row(f"tf_dataset ({mb:.1f} MB elements), {what}",
                       GOALS["tf", key == "resumed"], got[key],
                       "digests on vs off, eager iteration")
            for key, what in labels]
    rows.append(_cost_row("tf_dataset", {False: got["recording"], True: got["resumed"]},
                          "element"))
    return rows, got


def _rates(rounds: list[dict[str, float]], key: str) -> str:
    return ", ".join(f"{r[key]:.1f}" for r in rounds)


def run_all(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    # an even number of rounds: as many made first by on as by off (_first)
    n_images, steps, rounds, mb = (2000, 600, 4, 256) if quick else (2000, 2000, 6, 1024)
    say(f"[16] writing {n_images} JPEGs")
    root = write_jpegs(tmp / "jpegs", n_images, classes=8)
    cpu = _dali_rounds(root, tmp, steps, rounds, gpu=False)
    same = [paired_blocks(root, tmp, steps, False, first=_first(r), same=True)
            for r in range(2)]
    every = f"digests on vs off, save every {EVERY}"
    rows = [_ratio_row("CPU DALI batches/s, recording", GOALS["cpu", False], cpu[False], every),
            _ratio_row("CPU DALI batches/s, a resume comparing each batch", GOALS["cpu", True],
                       cpu[True], every),
            _ratio_row("the method itself (A/A): CPU, recording, the same run twice (digests "
                       "off in both)", None, same, "should read 1.0 within its noise"),
            _cost_row("CPU", cpu, "batch")]
    bound = step_bound_costs(root, tmp)
    rows.append(Row("16 CPU, a loop whose training step is the slower (a 10 ms sleep a step): "
                    "what the digests cost a batch on the training thread",
                    f"{bound['caller_us']:.0f} us", "-", "-", values=bound))
    gpu_rows, gpu = _gpu_rows(root, tmp, steps, rounds)
    tf_rows, tf = _tf_rows(tmp, quick)
    per_gb = content_digest_s_per_gb(tmp, mb)
    rows += gpu_rows + tf_rows
    rows.append(Row("16 content digest (data_contents), seconds per GB from the page cache",
                    f"{per_gb:.2f} s/GB", "-", "-", values={"s_per_gb": per_gb}))
    notes = [f"[16] {n_images} JPEGs 96-128 px, crop 64x64, batch 32 (384 KB a batch); in each "
             f"of {rounds} rounds two runs in one process, digests on and off, {steps} steps "
             f"each, alternating every {EVERY} steps, made first by on and off in turn; "
             "ratio = geometric mean of the rounds' ratios (their range); "
             "CPU: " + "; ".join(f"{'resumed' if k else 'recording'} on {_rates(v, 'on')}, "
                                 f"off {_rates(v, 'off')}" for k, v in cpu.items()),
             "[16] tf_dataset: bench/b_tf_digests.py in a child process (32 x 224x224x3 float32, "
             "blocks of 5 elements alternating on and off)",
             f"[16] content digest over {mb} MB in 200 files, median of 3"]
    return rows, notes, {"cpu": cpu, "step_bound": bound, "gpu": gpu, "tf": tf,
                         "content_s_per_gb": per_gb}
