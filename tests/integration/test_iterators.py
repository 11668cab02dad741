"""Framework iterators (PyTorch, JAX) and DALI dynamic mode resume bit for bit,
in new processes, with the same helper shape as test_exact_resume.py."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.helpers import child_env
from tests.helpers.launch import copy_checkpoint, requires_gpu, run_script

torch = pytest.importorskip("torch", reason="install the test extra's torch==2.13.0 (CPU)")

TOTAL = 14  # 24 samples, batch 5: epochs of 5 batches (4 with DROP)


def run_iter(cfg, data, ckpt, out, until, save_at=(), fresh=False):
    args = [json.dumps(cfg), str(data), str(ckpt), str(out), "--until", str(until)]
    if save_at:
        args += ["--save-at", *map(str, save_at)]
    if fresh:
        args.append("--fresh")
    return run_script("iter_runner.py", args, out)


def events_from(results: dict, start: int) -> list[str]:
    """Batches after step ``start`` (keys name the batch's 1-based step), and
    ends of epoch from ``start`` on (an epoch may end right at the checkpoint)."""
    return sorted(k for k in results if int(k[:4]) > start
                  or (int(k[:4]) == start and k.endswith("epoch_end")))


def assert_same_from(reference: dict, resumed: dict, start: int) -> None:
    assert events_from(resumed, start) == events_from(reference, start), \
        "batches or ends of epoch differ after the restore"
    for key in events_from(reference, start):
        assert np.array_equal(reference[key], resumed[key]), f"{key} differs after the restore"


def epoch_end(cfg) -> int:
    """The step after the last batch of the first epoch (before StopIteration)."""
    return 4 if cfg.get("policy") == "DROP" else 5


CONFIGS = {
    "fill-autoreset": dict(policy="FILL", auto_reset=True),
    "fill-manual-reset": dict(policy="FILL", auto_reset=False),
    "drop-autoreset": dict(policy="DROP", auto_reset=True),
    "drop-manual-reset": dict(policy="DROP", auto_reset=False),
    "partial-autoreset": dict(policy="PARTIAL", auto_reset=True),
    "partial-manual-reset": dict(policy="PARTIAL", auto_reset=False),
    "prefetch-1": dict(policy="FILL", prefetch=1),
    "prefetch-3": dict(policy="FILL", prefetch=3),
    "no-reader-name": dict(policy="FILL", reader_name=False),
    "classification": dict(policy="PARTIAL", iterator="classification"),
}


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    cache = {}

    def get(cfg):
        key = json.dumps(cfg, sort_keys=True)
        if key not in cache:
            d = tmp_path_factory.mktemp("iterref")
            points = sorted({2, epoch_end(cfg), 12})
            out = run_iter(cfg, data_dir, d / "ckpt", d / "ref.npz", TOTAL, points, fresh=True)
            cache[key] = (d, out)
        return cache[key]

    return get


@pytest.mark.parametrize("point", ["mid-epoch", "epoch-end", "epochs-in"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_torch_iterator_resumes_bit_exact(reference, data_dir, tmp_path, name, point):
    cfg = {"framework": "torch", **CONFIGS[name]}
    at = {"mid-epoch": 2, "epoch-end": epoch_end(cfg), "epochs-in": 12}[point]
    ref_dir, ref = reference(cfg)
    ckpt = copy_checkpoint(ref_dir / f"ckpt-{at}", tmp_path / "ckpt")
    assert_same_from(ref, run_iter(cfg, data_dir, ckpt, tmp_path / "r.npz", TOTAL), at)


def test_an_iterator_built_directly_is_refused_and_checkpointer_iterator_keeps_the_epochs_end(
        reference, data_dir, tmp_path):
    """An iterator a user of DALI alone builds over a resumed pipeline
    (DALI's defaults: prepare_first_batch=True, no saved counters) lost the
    end of the epoch a checkpoint after its last batch was taken at; it is
    refused when it is made. Checkpointer.iterator does not lose it."""
    cfg = {"framework": "torch", **CONFIGS["fill-autoreset"]}
    ref_dir, ref = reference(cfg)
    at = epoch_end(cfg)
    assert f"{at:04d}_epoch_end" in ref
    with pytest.raises(AssertionError, match="a DALI iterator was built over it directly"):
        run_iter({**cfg, "plain": True}, data_dir,
                 copy_checkpoint(ref_dir / f"ckpt-{at}", tmp_path / "a"), tmp_path / "p.npz",
                 TOTAL)
    ours = run_iter(cfg, data_dir, copy_checkpoint(ref_dir / f"ckpt-{at}", tmp_path / "b"),
                    tmp_path / "o.npz", TOTAL)
    assert_same_from(ref, ours, at)


@pytest.mark.parametrize("framework", ["torch", "dynamic"])
def test_chained_restores_equal_one_run(reference, data_dir, tmp_path, framework):
    cfg = {"framework": framework, "policy": "PARTIAL"}
    _, ref = reference(cfg)
    ckpt = tmp_path / "ckpt"
    run_iter(cfg, data_dir, ckpt, tmp_path / "0.npz", 3, [3], fresh=True)
    pieces = {}
    for i, (until, save) in enumerate([(5, 5), (9, 9), (TOTAL, None)]):
        pieces.update(run_iter(cfg, data_dir, ckpt, tmp_path / f"{i}.npz", until,
                               [save] if save else []))
    assert_same_from(ref, pieces, 3)


@pytest.mark.parametrize("point, default_rng", [(2, False), (5, False), (12, False), (5, True)])
def test_dynamic_mode_resumes_bit_exact(reference, data_dir, tmp_path, point, default_rng):
    """default_rng: random operators without rng= draw from the thread's
    default RNG (seeded by ndd.random.set_seed), which was not saved: a
    resume drew the seed's numbers again and the proof said the batches
    matched (found by a sweep)."""
    cfg = {"framework": "dynamic", **({"default_rng": True} if default_rng else {})}
    ref_dir, ref = reference({**cfg, "policy": "PARTIAL"})
    ckpt = copy_checkpoint(ref_dir / f"ckpt-{point}", tmp_path / "ckpt")
    assert_same_from(ref, run_iter({**cfg, "policy": "PARTIAL"}, data_dir, ckpt,
                                   tmp_path / "r.npz", TOTAL), point)


@pytest.mark.parametrize("point", [2, 5, 12])
def test_jax_iterator_resumes_bit_exact(reference, data_dir, tmp_path, point):
    pytest.importorskip("jax", reason="JAX is not installed")
    cfg = {"framework": "jax", "policy": "FILL"}
    ref_dir, ref = reference(cfg)
    ckpt = copy_checkpoint(ref_dir / f"ckpt-{point}", tmp_path / "ckpt")
    assert_same_from(ref, run_iter(cfg, data_dir, ckpt, tmp_path / "r.npz", TOTAL), point)


def test_torch_state_dicts_round_trip_and_training_continues_exactly(tmp_path):
    import dvc_dali

    torch.manual_seed(0)

    def make():
        model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        return model, torch.optim.AdamW(model.parameters(), lr=0.01)

    def train(model, opt, steps, start):
        for s in range(start, start + steps):
            g = torch.Generator().manual_seed(s)
            x, y = torch.randn(8, 6, generator=g), torch.randint(0, 2, (8,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    model, opt = make()
    train(model, opt, 3, 0)
    extra = {"bf16": torch.arange(5, dtype=torch.bfloat16) / 3, "ints": torch.arange(4),
             "flags": torch.tensor([True, False])}
    dvc_dali.Checkpointer(tmp_path / "c").save(
        3, arrays={"model": model.state_dict(), "optim": opt.state_dict(), "extra": extra})
    train(model, opt, 4, 3)

    back = dvc_dali.Checkpointer(tmp_path / "c")
    assert isinstance(next(iter(back.arrays["optim"]["state"])), int)  # int keys kept
    for k, v in extra.items():
        got = back.arrays["extra"][k]
        assert got.dtype == v.dtype and torch.equal(got, v), k
    model2, opt2 = make()
    model2.load_state_dict(back.arrays["model"])
    opt2.load_state_dict(back.arrays["optim"])
    train(model2, opt2, 4, 3)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("point", [2, 5, 12])
def test_torch_iterator_on_gpu_resumes_bit_exact(reference, data_dir, tmp_path, point):
    """Mixed (GPU) decoding, CUDA tensors out of the iterator."""
    cfg = {"framework": "torch", "policy": "FILL", "device": "gpu"}
    ref_dir, ref = reference(cfg)
    ckpt = copy_checkpoint(ref_dir / f"ckpt-{point}", tmp_path / "ckpt")
    assert_same_from(ref, run_iter(cfg, data_dir, ckpt, tmp_path / "r.npz", TOTAL), point)


def _script(tmp_path, text: str, first: int):
    """``text`` as train.py beside 10 .npy files (values from ``first``); the
    function running it, killed after a step (0: not killed)."""
    import subprocess
    import sys

    (tmp_path / "data").mkdir()
    for i in range(10):
        np.save(tmp_path / "data" / f"a{i}.npy", np.full((2,), i + first, np.int32))
    (tmp_path / "train.py").write_text(text)

    def run(kill_at: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "train.py", str(kill_at)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=child_env())

    return run


VAL_SCRIPT = '''
import os, signal, sys, dvc_dali
from nvidia.dali import fn, pipeline_def
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
@pipeline_def
def p(shuffle):
    return fn.readers.numpy(file_root="data", random_shuffle=shuffle, name="reader"),
ck = dvc_dali.Checkpointer("ck", total_steps=6)
tp = ck.pipeline("train", p, batch_size=4, num_threads=1, device_id=None, seed=1, shuffle=True)
vp = ck.pipeline("val", p, batch_size=4, num_threads=1, device_id=None, seed=2, shuffle=False)
train = ck.iterator(DALIGenericIterator, tp, ["x"], reader_name="reader", auto_reset=True)
val = ck.iterator(DALIGenericIterator, vp, ["x"], reader_name="reader", auto_reset=True,
                  last_batch_policy=LastBatchPolicy.PARTIAL)
for step in range(ck.step + 1, 7):
    try:
        batch = next(train)
    except StopIteration:  # auto_reset: the next epoch
        batch = next(train)
    print(step, "train", batch[0]["x"][:, 0].tolist(), flush=True)
    if step % 3 == 0:  # a validation every 3 steps, a checkpoint every 2
        print(step, "val", [v[0]["x"][:, 0].tolist() for v in val], flush=True)
    if step % 2 == 0:
        ck.make_checkpoint(step)
    if step == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
ck.close()
'''


def test_a_validation_iterator_first_used_after_a_checkpoint_resumes_exactly(tmp_path):
    """Found by a sweep: a fresh run's validation iterator pulled its first
    batch when it was made (DALI's prepare_first_batch), before the first
    checkpoint, so the digests after it were one batch ahead of what a
    resume pulls: the exact resume was refused as a mismatch blaming the data."""
    run = _script(tmp_path, VAL_SCRIPT, first=0)
    whole = run(0)
    assert whole.returncode == 0, whole.stderr[-3000:]
    (tmp_path / "ck").rename(tmp_path / "whole")
    assert run(3).returncode == -9  # after step 3's validation, between two checkpoints
    resumed = run(0)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.search(r"pipeline 'val': the \d+ batches after the checkpoint at step 2 are "
                     r"those the run it resumes produced", resumed.stderr), resumed.stderr
    assert "differs" not in resumed.stderr, resumed.stderr
    lines = whole.stdout.splitlines()
    after_2 = next(i for i, line in enumerate(lines) if line.startswith("3 "))
    assert resumed.stdout.splitlines() == lines[after_2:], (whole.stdout, resumed.stdout)


IN_PLACE_SCRIPT = '''
import os, signal, sys, threading, time, dvc_dali
from nvidia.dali import fn, pipeline_def
from nvidia.dali.plugin.pytorch import DALIGenericIterator
from dvc_dali.proof import batch_digests
crc = batch_digests._crc
def slow_on_the_digest_thread(data, value=0):  # widens the window a digest there raced in
    if threading.current_thread().name == batch_digests._DigestThread.NAME:
        time.sleep(0.05)
    return crc(data, value)
batch_digests._crc = slow_on_the_digest_thread
@pipeline_def
def p():
    return fn.readers.numpy(file_root="data", random_shuffle=True, name="reader"),
ck = dvc_dali.Checkpointer("ck")
train = ck.iterator(DALIGenericIterator, ck.pipeline("train", p, batch_size=4, num_threads=1,
                    device_id=None, seed=1), ["x"], reader_name="reader", auto_reset=True)
for step in range(ck.step + 1, 7):
    try:
        batch = next(train)
    except StopIteration:  # auto_reset: the next epoch
        batch = next(train)
    x = batch[0]["x"]
    print(step, x[:, 0].tolist(), flush=True)
    x.sub_(x)  # the step writes into the tensor DALI handed out (its memory, shared)
    if step == 2:
        ck.make_checkpoint(step)
    if step == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
ck.close()
'''


def test_a_step_writing_into_its_batch_in_place_resumes_proven(tmp_path):
    """Found by a sweep: PyTorch's iterators hand out tensors that share
    DALI's memory, and the digest thread hashed a batch after the step had
    written into it, so the exact resume was refused as "other bytes". A
    host batch is now hashed before it is handed out."""
    run = _script(tmp_path, IN_PLACE_SCRIPT, first=1)
    whole = run(0)
    assert whole.returncode == 0, whole.stderr[-3000:]
    (tmp_path / "ck").rename(tmp_path / "whole")
    assert run(5).returncode == -9  # steps 3-5 recorded after the checkpoint at step 2
    resumed = run(0)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert ("pipeline 'train': the 3 batches after the checkpoint at step 2 are those the "
            "run it resumes produced") in resumed.stderr, resumed.stderr
    lines = whole.stdout.splitlines()
    assert resumed.stdout.splitlines() == lines[2:], (whole.stdout, resumed.stdout)
