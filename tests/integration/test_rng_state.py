"""The global random generators (random, NumPy's, torch's) saved with a
checkpoint and restored on resume: a torch loop with dropout, a torch.rand
augmentation, random.random() and np.random draws, SIGKILLed after a
checkpoint and resumed in a new process, equals an uninterrupted run bit for
bit; with DVC_DALI_RNG=0 it does not (the comparison can fail)."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

import dvc_dali
from dvc_dali.training import rng_state

from tests.helpers import HELPERS, child_env

TOTAL, KILL_AT = 10, 6  # an epoch is 6 steps: the kill lands on its end, the rest in the next


def _run(data, ckpt, out, until, env=None, kill_at=0, fresh=False):
    args = [sys.executable, str(HELPERS / "rng_runner.py"), str(data), str(ckpt), str(out),
            "--until", str(until)]
    if kill_at:
        args += ["--kill-at", str(kill_at)]
    if fresh:
        args.append("--fresh")
    proc = subprocess.run(args, capture_output=True, text=True,
                          env=child_env(env))
    if kill_at:
        assert proc.returncode == -9, proc.stderr[-3000:]
        return None
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("rng-ref")
    return _run(data_dir, d / "ckpt", d / "ref.npz", TOTAL, fresh=True)


def _killed_then_resumed(data_dir, tmp_path, env=None):
    ckpt = tmp_path / "ckpt"
    _run(data_dir, ckpt, tmp_path / "a.npz", TOTAL, env, kill_at=KILL_AT, fresh=True)
    return _run(data_dir, ckpt, tmp_path / "b.npz", TOTAL, env)


def test_killed_and_resumed_loop_equals_uninterrupted_run(reference, data_dir, tmp_path):
    resumed = _killed_then_resumed(data_dir, tmp_path)
    keys = sorted(k for k in reference if k[:4].isdigit() and int(k[:4]) > KILL_AT)
    assert sorted(k for k in resumed if k[:4].isdigit()) == keys
    for k in keys + ["final_weights"]:
        assert np.array_equal(reference[k], resumed[k]), f"{k} differs after the resume"


def test_without_the_generators_the_resumed_loop_differs(reference, data_dir, tmp_path):
    resumed = _killed_then_resumed(data_dir, tmp_path, {"DVC_DALI_RNG": "0"})
    assert not np.array_equal(reference[f"{KILL_AT + 1:04d}_draws"],
                              resumed[f"{KILL_AT + 1:04d}_draws"])
    assert not np.array_equal(reference["final_weights"], resumed["final_weights"])


def test_rng_false_saves_nothing_and_names_are_reserved(tmp_path):
    ck = dvc_dali.Checkpointer(tmp_path / "a", rng=False)
    ck.save(1, arrays={"w": np.zeros(2)})
    ck.close()
    saved = dvc_dali.load(tmp_path / "a")
    assert sorted(saved.arrays) == ["w"]
    ck = dvc_dali.Checkpointer(tmp_path / "b")
    with pytest.raises(ValueError, match="dvc-dali's own"):
        ck.save(1, arrays={rng_state.KEY: np.zeros(2)})
    ck.save(1)
    ck.close()
    assert rng_state.KEY in dvc_dali.load(tmp_path / "b").arrays
    assert dvc_dali.Checkpointer(tmp_path / "b").arrays == {}  # not the user's


def test_restored_once_at_the_first_read(tmp_path):
    """Draws made before the loop reads the checkpoint (a model's seeded
    initialisation) do not shift the resumed draws; later reads do not reset."""
    random.seed(1)
    ck = dvc_dali.Checkpointer(tmp_path / "c")
    ck.save(3)
    expected = [random.random() for _ in range(3)]
    ck.close()
    random.seed(1)
    ck = dvc_dali.Checkpointer(tmp_path / "c")
    random.random()  # the model's initialisation
    assert ck.step == 3
    first = random.random()
    assert ck.arrays == {} and ck.step == 3
    assert [first, random.random(), random.random()] == expected


def _generator_states():
    torch = pytest.importorskip("torch")
    return (random.getstate(), np.random.get_state(legacy=False)["state"]["key"].tobytes(),
            torch.get_rng_state().numpy().tobytes())


def test_only_the_resume_point_sets_the_generators_back(tmp_path):
    """Reading any property or attribute but the checkpoint's contents
    (step, arrays, live()) leaves random, NumPy's and torch's generators as
    they are, and the resume point pending: the next ck.step sets them back."""
    torch = pytest.importorskip("torch")
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    ck = dvc_dali.Checkpointer(tmp_path / "p")
    ck.save(4, arrays={"w": np.ones(2)}, metadata={"m": 1})
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    ck.close()
    random.seed(7), np.random.seed(8), torch.manual_seed(9)
    ck = dvc_dali.Checkpointer(tmp_path / "p", params={"lr": 0.1})
    before = _generator_states()
    seen = (ck.resumed, ck.metadata, ck.path, ck.tf_datasets, ck.preempted, ck.timings,
            ck.params, ck.rank, ck.world_size, ck.total_steps, ck.asynchronous,
            ck.batch_failure)
    assert seen[0] is True and seen[1] == {"m": 1} and seen[7] == 0
    assert _generator_states() == before  # untouched
    assert ck.step == 4  # the resume point: still pending, set back now
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    ck.close()


def test_a_bad_switch_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("DVC_DALI_RNG", "no")
    with pytest.raises(dvc_dali.ConfigError, match="DVC_DALI_RNG='no'"):
        dvc_dali.Checkpointer(tmp_path / "d")


@pytest.mark.gpu
def test_cuda_generators_come_back(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.manual_seed(5)
    torch.rand(3, device="cuda")  # CUDA initialised: its generators are saved too
    ck = dvc_dali.Checkpointer(tmp_path / "g")
    ck.save(1)
    expected = torch.rand(4, device="cuda").cpu()
    ck.close()
    torch.manual_seed(9)
    ck = dvc_dali.Checkpointer(tmp_path / "g")
    assert ck.step == 1
    assert torch.equal(torch.rand(4, device="cuda").cpu(), expected)


@pytest.mark.parametrize("damage,says", [
    (lambda s: s.update(blob=s["blob"][:-1]), "runs past the blob"),
    (lambda s: s.update(parts=[["python", "<f8", 625]]), "parts\\[0\\] is not"),
    (lambda s: s["parts"].pop(), "cover"),
    (lambda s: s["python"].update(version="3"), "python.version"),
    (lambda s: s["numpy"].update(bit_generator="PCG64"), "numpy is not a state"),
], ids=["short", "dtype", "extra-bytes", "version", "bit-generator"])
def test_a_damaged_state_is_refused_naming_the_field(damage, says):
    saved = rng_state.capture()
    damage(saved)
    with pytest.raises(dvc_dali.CheckpointCorruptError, match=says):
        rng_state.check(saved, "manifest.json").apply()


def test_checking_a_state_touches_no_generator():
    """rng_state.check (a Checkpointer's construction) reads and checks only:
    a damaged torch part is refused naming it, and nothing is set."""
    torch = pytest.importorskip("torch")
    saved = rng_state.capture()
    random.random(), np.random.rand(), torch.rand(1)
    before = _generator_states()
    rng_state.check(saved, "manifest.json")
    assert _generator_states() == before
    names = [p[0] for p in saved["parts"]]
    i = names.index("torch")
    offset = sum(count * np.dtype(dtype).itemsize for _, dtype, count in saved["parts"][:i])
    size = saved["parts"][i][2]
    saved["blob"] = np.concatenate([saved["blob"][:offset + size - 8],
                                    saved["blob"][offset + size:]])
    saved["parts"][i][2] = size - 8
    with pytest.raises(dvc_dali.CheckpointCorruptError, match="torch is not a state"):
        rng_state.check(saved, "manifest.json")
    assert _generator_states() == before


def test_a_dynamic_checkpoint_without_the_default_rngs_state_says_so_at_the_resume(
        tmp_path, monkeypatch, capsys):
    """Found by a sweep: a dynamic-mode checkpoint an earlier dvc-dali saved
    (without the thread's default RNG) resumed with random operators drawing
    from the seed again, not bit-exact, and said nothing."""
    ndd = pytest.importorskip("nvidia.dali.experimental.dynamic",
                              reason="DALI without dynamic mode")
    from dvc_dali.dali import dali_dynamic

    with monkeypatch.context() as m:  # what an earlier dvc-dali saved: no default RNG
        m.setattr(dali_dynamic, "take_default_rng", lambda ckpt, name: None)
        ck = dvc_dali.Checkpointer(tmp_path / "ck")
        ck.dynamic().register(ndd.random.RNG(seed=1), "mine")
        assert ck.step == 0
        ck.save(1)
        ck.close()
    capsys.readouterr()
    ck = dvc_dali.Checkpointer(tmp_path / "ck")
    ck.dynamic().register(ndd.random.RNG(seed=1), "mine")
    assert ck.step == 1
    said = capsys.readouterr().err
    assert "dynamic-mode checkpoint 'dynamic' holds no state of the default RNG" in said, said
    assert "not those of the run it resumes" in said
    ck.save(2)  # the resume goes on; its next checkpoint is saved as the first was
    ck.close()
    ck = dvc_dali.Checkpointer(tmp_path / "ck2")  # a fresh one takes it, and says nothing
    ck.dynamic()
    assert ck.step == 0
    ck.save(1)
    ck.close()
    ck = dvc_dali.Checkpointer(tmp_path / "ck2")
    ck.dynamic()
    assert ck.step == 1
    assert "default RNG" not in capsys.readouterr().err
    ck.close()


def test_keras_global_seed_generator_comes_back_at_the_resume_point(tmp_path):
    """Found by a sweep: keras.random.normal(shape) without seed= (a Noise
    layer) drew other numbers after a resume; the resumed fit ended with
    other weights, without a word."""
    keras = pytest.importorskip("keras")
    keras.random.normal((2,))  # Keras makes its global generator and draws
    ck = dvc_dali.Checkpointer(tmp_path / "ck")
    assert ck.step == 0
    ck.save(1)
    ck.close()
    want = np.asarray(keras.random.normal((3,)))
    keras.random.normal((5,))  # drawn on past the checkpoint
    ck = dvc_dali.Checkpointer(tmp_path / "ck")
    assert ck.step == 1  # the resume point
    assert np.array_equal(np.asarray(keras.random.normal((3,))), want)
    ck.close()
