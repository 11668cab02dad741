"""The training loop the checkpoint benchmarks run as a stage under `dvc exp run`
(copied into a temporary project as train.py; DVC 3, or DVC 2 in 'watched' mode).

Environment: BENCH_LOG (JSON lines written here), BENCH_PLAN
("<bytes>:<checkpoints>,..." : that many checkpoints of an array of that
many bytes, size after size), BENCH_ASYNC=1 (asynchronous Checkpointer),
BENCH_PIPE=1 (a DALI pipeline over data/images is part of the checkpoint),
BENCH_FLOOR_DIR (after each checkpoint of >= 200 MB, time copying and
hashing the written array there: the floor of benchmark 3), BENCH_PRESEED=1
(hand DVC the md5 of the snapshot's files before recording: a proposal).

The package is timed from outside: Checkpointer._write (the save),
recording.record_request and retention.prune are wrapped (attributes
looked up at call time); nothing in dvc_dali is changed.
"""

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

import dvc_dali
from dvc_dali.format import arrays as arrays_mod
from dvc_dali.core.context import RunContext
from dvc_dali.format import store

perf = time.perf_counter
LOG = os.environ["BENCH_LOG"]
PLAN = [tuple(int(x) for x in part.split(":")) for part in os.environ["BENCH_PLAN"].split(",")]
FLOOR_MIN = 200 * 1024 * 1024
ASYNC = os.environ.get("BENCH_ASYNC") == "1"
PIPE = os.environ.get("BENCH_PIPE") == "1"
FLOOR_DIR = os.environ.get("BENCH_FLOOR_DIR")
cur: dict = {}


def log(**event):
    with open(LOG, "a") as fh:
        fh.write(json.dumps(event) + "\n")


def wrap(module, name, key):
    orig = getattr(module, name)

    def timed(*args, **kwargs):
        t = perf()
        try:
            result = orig(*args, **kwargs)
        finally:
            cur[key] = cur.get(key, 0.0) + perf() - t
        phases = getattr(result, "phases", None)
        if phases is not None:
            cur["phases"] = dict(phases)
        return result

    setattr(module, name, timed)


# the whole save: write + md5 + fsync + publish LATEST + remove the previous one
wrap(dvc_dali.Checkpointer, "_write", "write")
MODE = RunContext.from_environ().mode
if MODE == "record":  # DVC 3: we record; under DVC 2 its watcher does
    from dvc_dali.reading import gitcmd
    from dvc_dali.recording import commit as rec_commit
    from dvc_dali.recording import pipeline as recording
    from dvc_dali.recording import lockfile as rec_lockfile
    from dvc_dali.recording import retention as rec_retention
    from dvc_dali.recording import stage as rec_stage

    wrap(recording, "record_request", "record")
    wrap(rec_retention, "prune", "retention")

# Where the small costs go: every fsync and every git subprocess of a checkpoint.
_real_fsync = os.fsync


def _timed_fsync(fd):
    t = perf()
    try:
        _real_fsync(fd)
    finally:
        cur["fsync_n"] = cur.get("fsync_n", 0) + 1
        cur["fsync_s"] = cur.get("fsync_s", 0.0) + perf() - t


os.fsync = _timed_fsync
if MODE == "record":
    _real_git = gitcmd.run

    def _timed_git(args, *rest, **kwargs):
        t = perf()
        try:
            return _real_git(args, *rest, **kwargs)
        finally:
            git = cur.setdefault("git", {})
            words, skip = [], False
            for a in args:  # the subcommand, past "-c x=y" and "--git-dir DIR"
                if skip:
                    skip = False
                elif a in ("-c", "--git-dir"):
                    skip = True
                elif not a.startswith("-") or not words:
                    words.append(a)
                if len(words) == 1 and a in ("-u", "-A"):
                    words.append(a)
            sub = " ".join(words[:2]) if words[:1] == ["add"] else (words or ["?"])[0]
            git[sub] = git.get(sub, 0.0) + perf() - t

    gitcmd.run = _timed_git

    # Inside record.save/commit: looking the stage up again (repo.index: YAML
    # of dvc.yaml and dvc.lock), re-reading dvc.lock (ruamel round trip),
    # the paths to commit, the commit itself.
    def _fine(name, module):
        orig = getattr(module, name, None)
        if orig is None:
            return

        def timed(*args, **kwargs):
            t = perf()
            try:
                return orig(*args, **kwargs)
            finally:
                fine = cur.setdefault("fine", {})
                fine[name] = fine.get(name, 0.0) + perf() - t

        setattr(module, name, timed)

    _fine("cached_stage", rec_stage)
    _fine("find_stage", rec_stage)
    _fine("current", rec_lockfile)
    _fine("write_atomic", rec_lockfile)
    _fine("build_commit", rec_commit)  # in-process (pygit2): git add -u/-A, write-tree, commit
    _fine("create_ref", rec_commit)

def floor(src: Path, w: np.ndarray) -> dict:
    """Copy + md5 of the file just written (the floor), and the pieces a
    save + record is made of, each on the same bytes. The dirty pages of
    the previous piece are flushed (os.sync, untimed) before each one, so
    the kernel's writeback throttling does not land on a random piece."""
    out = {}
    d = Path(FLOOR_DIR)

    def piece(name, fn, sync=True):
        if sync:
            os.sync()
        t = perf()
        fn()
        out[name] = perf() - t

    def md5_file(path):
        with open(path, "rb") as fh:
            hashlib.file_digest(fh, "md5").hexdigest()

    piece("copyfile", lambda: shutil.copyfile(src, d / "copy.npy"))
    piece("md5", lambda: md5_file(src))
    piece("cp", lambda: subprocess.run(["cp", str(src), str(d / "cp.npy")], check=True))
    piece("md5sum", lambda: subprocess.run(["md5sum", str(src)], check=True,
                                           capture_output=True))

    # The pieces of a save of one array: write (ndarray.tofile), fsync, hashes.
    def write_plain():
        with open(d / "plain.npy", "wb") as fh:
            np.lib.format.write_array(fh, w, allow_pickle=False)

    def do_fsync():
        fd = os.open(d / "plain.npy", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    def write_hashing():  # what store.write_capture does per array file, fsync included
        store._write_hashed(d / "hashing.npy", store._npy_parts(w))

    piece("write_plain", write_plain)
    piece("fsync", do_fsync, sync=False)  # right after its write, as in a save
    piece("write_hashed_fsynced", write_hashing)
    piece("md5_memory", lambda: hashlib.md5(memoryview(w)).hexdigest())
    piece("hardlink", lambda: os.link(d / "plain.npy", d / "linked.npy"))
    for name in ("copy.npy", "cp.npy", "plain.npy", "hashing.npy", "linked.npy"):
        (d / name).unlink()
    os.sync()  # the next checkpoint starts as clean as the floor did
    cur.clear()  # the fsyncs above are not the next checkpoint's
    return out


def main():
    pipe = None
    total = sum(n for _, n in PLAN)
    ck = dvc_dali.Checkpointer("checkpoint", params={"plan": os.environ["BENCH_PLAN"]},
                               total_steps=total, asynchronous=ASYNC)
    if PIPE:
        from nvidia.dali import fn, pipeline_def, types

        @pipeline_def
        def images(root):
            jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="reader")
            decoded = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            return fn.random_resized_crop(decoded, size=(16, 16), name="crop"), labels

        pipe = ck.pipeline("train", images, root="data/images", batch_size=2, num_threads=1,
                           device_id=None, seed=1)
    rng = np.random.default_rng(0)
    log(event="start", mode=MODE, resumed=ck.resumed)
    step = 0
    for size, n in PLAN:
        w = rng.integers(0, 256, size, dtype=np.uint8)
        for _ in range(n):
            step += 1
            if pipe is not None:
                pipe.run()
            w[:8] = rng.integers(0, 256, 8, dtype=np.uint8)  # new content: DVC stores it anew
            Path("metrics.json").write_text(json.dumps({"step": step, "loss": 1.0 / step}))
            event = {"event": "checkpoint", "step": step, "size": size}
            if ASYNC:
                ck.wait()  # the previous checkpoint is finished first, untimed
                event["background"] = dict(cur)
                cur.clear()
                # untimed once, so the timed copy and the one inside
                # make_checkpoint both reuse memory just freed
                arrays_mod.snapshot({"w": w})  # dropped at once
                t = perf()
                held = [arrays_mod.snapshot({"w": w})]
                event["snapshot"] = perf() - t
                held.clear()  # freed after the timing, as make_checkpoint keeps its copy
            t = perf()
            ck.make_checkpoint(step, arrays={"w": w})
            event["blocked"] = perf() - t
            if not ASYNC:
                event.update(cur)
                cur.clear()
                if FLOOR_DIR and size >= FLOOR_MIN:
                    name = (Path("checkpoint") / store.LATEST).read_text().split()[0]
                    event["floor"] = floor(Path("checkpoint") / name / "arrays" / "00000.npy", w)
            log(**event)
        del w
    ck.wait()
    if ASYNC and cur:
        log(event="background", background=dict(cur))
    log(event="end")


main()
