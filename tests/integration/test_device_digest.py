"""The GPU batch digest (dvc_dali/proof/device_digest.py) computes digest_model's
``mix64``, the same value the NumPy model gives for the same bytes, however
the batch lies on the device (dense, ragged, unaligned, more samples than a
grid's y, none), ordered after the stream that produced the data; and a
DALI pipeline's and a dynamic-mode batch's GPU outputs digest as their host
bytes do. Needs a CUDA GPU and CuPy: skipped without them."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from dvc_dali.proof import batch_digests, device_digest, digest_model
from tests.helpers.launch import requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


def _dense(n: int, sample: tuple[int, ...], dtype: str = "uint8", seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=n * int(np.prod(sample)) * np.dtype(dtype).itemsize,
                       dtype=np.uint8)
    return raw.view(dtype).reshape((n, *sample))


DENSE = {
    "32 x 64x64x3 uint8": _dense(32, (64, 64, 3)),
    "13-byte samples (words across samples, unaligned)": _dense(7, (13,)),
    "float32": _dense(5, (100,), "float32"),
    "one sample of 3 MB (many blocks)": _dense(1, (3_000_001,)),
    "70000 samples (more than a grid's y)": _dense(70000, (3,)),
    "no samples": _dense(0, (4,)),
    "empty samples": _dense(3, (0,)),
}


def _hex(digest: str) -> str:
    assert digest.split("/")[2].startswith("mix64:"), digest
    return digest.rsplit(":", 1)[1]


@pytest.mark.parametrize("name", list(DENSE))
def test_dense_output_matches_the_model(name):
    import cupy

    host = DENSE[name]
    dev = cupy.asarray(host)
    out = device_digest.Output(host.dtype.name, [host.shape[1:]] * host.shape[0],
                               host.itemsize, base=dev.data.ptr,
                               stride=host.itemsize * int(np.prod(host.shape[1:])))
    cupy.cuda.runtime.deviceSynchronize()
    got = device_digest.begin([out], 0, None)()[0]
    assert _hex(got) == digest_model.hexdigest(host)
    text = digest_model.header_text(host.dtype, [host.shape[1:]] * host.shape[0])
    assert got.split("/")[:2] == [host.dtype.name, f"{zlib.crc32(text.encode()):08x}"]


def test_ragged_output_matches_the_model_at_any_alignment():
    """Samples of 0..4097 bytes, some at odd addresses inside one buffer."""
    import cupy

    sizes = [0, 1, 7, 8, 9, 1000, 4097, 3]
    rng = np.random.default_rng(1)
    samples = [rng.integers(0, 256, size=s, dtype=np.uint8) for s in sizes]
    buffer = cupy.zeros(sum(sizes) + len(sizes) * 3 + 16, cupy.uint8)
    pointers, at = [], 1  # odd offsets: every word load of the first samples is unaligned
    for s in samples:
        buffer[at:at + s.size] = cupy.asarray(s)
        pointers.append(buffer.data.ptr + at)
        at += s.size + 3
    cupy.cuda.runtime.deviceSynchronize()
    out = device_digest.Output("uint8", [s.shape for s in samples], 1, pointers=pointers)
    got = device_digest.begin([out], 0, None)()[0]
    assert _hex(got) == digest_model.hexdigest(samples)


def test_slots_are_reused_and_outputs_kept_apart():
    """Two batches in flight (two recorders), then the same again: each gets
    its own values, and the pool gives the slots back."""
    import cupy

    a, b = DENSE["32 x 64x64x3 uint8"], DENSE["float32"]
    da, db = cupy.asarray(a), cupy.asarray(b)
    cupy.cuda.runtime.deviceSynchronize()

    def out(host, dev):
        return device_digest.Output(host.dtype.name, [host.shape[1:]] * host.shape[0],
                                    host.itemsize, base=dev.data.ptr,
                                    stride=host.itemsize * int(np.prod(host.shape[1:])))

    for _ in range(3):
        first = device_digest.begin([out(a, da), out(b, db)], 0, None)
        second = device_digest.begin([out(b, db)], 0, None)
        assert [_hex(d) for d in second()] == [digest_model.hexdigest(b)]
        assert [_hex(d) for d in first()] == [digest_model.hexdigest(a),
                                              digest_model.hexdigest(b)]


def test_ordered_after_the_stream_that_wrote_the_data():
    """The data is written on another stream, not waited for: the digest,
    launched after it, sees the written bytes."""
    import cupy

    host = DENSE["one sample of 3 MB (many blocks)"]
    stream = cupy.cuda.Stream(non_blocking=True)
    dev = cupy.zeros(host.shape, cupy.uint8)
    cupy.cuda.runtime.deviceSynchronize()
    src = cupy.asarray(host)
    cupy.cuda.runtime.deviceSynchronize()
    with stream:
        for _ in range(20):  # long enough that an unordered digest would read zeros
            dev[...] = src[...] ^ np.uint8(0)
    out = device_digest.Output("uint8", [host.shape[1:]], 1, base=dev.data.ptr,
                               stride=host.size)
    got = device_digest.begin([out], 0, stream.ptr)()[0]
    assert _hex(got) == digest_model.hexdigest(host)


def _host_samples(tl) -> list[np.ndarray]:
    cpu = tl.as_cpu()
    return [np.asarray(cpu[i]) for i in range(len(cpu))]


def _pipeline(data_dir, batch_size=8):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=0, seed=3)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=str(data_dir / "images"), name="reader")
        images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
        crops = fn.random_resized_crop(images, size=(32, 32))
        return images, crops, labels

    return pipe


def test_pipeline_gpu_outputs_digest_as_their_host_bytes(data_dir):
    """A DALI pipeline's ragged (decoded) and dense (cropped) GPU outputs
    and a CPU one: the GPU ones named mix64, of the same value as the model
    over their host copies; the CPU one crc32, as before."""
    p = _pipeline(data_dir)()
    p.build()
    for _ in range(2):
        outputs = p.run()
        got = batch_digests.digest(outputs)
        assert not outputs[0].is_dense_tensor()  # decoded images differ in size: ragged
        for i in (0, 1):
            assert _hex(got[i]) == digest_model.hexdigest(_host_samples(outputs[i]))
        assert got[2].split("/")[2].startswith("crc32:")
        assert batch_digests.begin(outputs)() == got


def test_dynamic_mode_gpu_batch_digested_on_the_device():
    """A dynamic-mode GPU batch (dense and ragged) and a GPU sample: handed
    to the digest as TensorListGPU (nothing copied), of the model's value."""
    import nvidia.dali.experimental.dynamic as ndd

    from dvc_dali.dali import dali_dynamic

    rng = np.random.default_rng(2)
    dense = [rng.integers(0, 256, (4, 5), dtype=np.uint8) for _ in range(6)]
    ragged = [rng.integers(0, 256, (i + 1, 3), dtype=np.uint8) for i in range(5)]
    sample = rng.random(7, dtype=np.float32)
    batch = (ndd.as_batch(dense, device="gpu"), ndd.as_batch(ragged, device="gpu"),
             ndd.as_tensor(sample, device="gpu"), ndd.as_batch(dense))
    outputs = dali_dynamic.digest_outputs(batch)
    assert [type(o).__name__ for o in outputs[:3]] == ["TensorListGPU"] * 3
    got = batch_digests.digest_dynamic(outputs)
    assert [_hex(g) for g in got[:3]] == [digest_model.hexdigest(dense),
                                          digest_model.hexdigest(ragged),
                                          digest_model.hexdigest([sample])]
    assert got[3] == batch_digests.digest_arrays([dense])[0]


def test_recording_digests_gpu_batches_on_the_digest_thread(data_dir, tmp_path):
    """Through a Checkpointer (DALI's default executor: deferred), each GPU
    batch's digest is launched and waited for on the digest thread: what it
    records is the model's value of the batch the loop got, batch after
    batch."""
    import dvc_dali

    ck = dvc_dali.Checkpointer(tmp_path / "ck", resume=False)
    pipe = ck.pipeline("train", _pipeline(data_dir), batch_size=8, num_threads=2,
                       device_id=0, seed=3)
    ck.save(0)
    kept = []
    for _ in range(4):
        outputs = pipe.run()
        kept.append([_host_samples(outputs[0]), _host_samples(outputs[1])])
    ck._batches.wait()  # noqa: SLF001 (the digest in flight)
    recorded = ck._batches._done["train"]  # noqa: SLF001 (what the next save would write)
    assert len(recorded) == 4
    for got, (images, crops) in zip(recorded, kept):
        assert [_hex(got[0]), _hex(got[1])] == [digest_model.hexdigest(images),
                                                digest_model.hexdigest(crops)]
    assert ck._batches.costs.background == 4  # noqa: SLF001
    ck.close()


def test_a_gpu_digest_that_fails_is_recorded_as_failed(data_dir, tmp_path, monkeypatch, capsys):
    """A launch that raises on the digest thread (here: the pool's buffers
    cannot be allocated) is recorded as failed, said once, so a resume says
    that batch is not verified; training goes on."""
    import dvc_dali

    ck = dvc_dali.Checkpointer(tmp_path / "ck", resume=False)
    pipe = ck.pipeline("train", _pipeline(data_dir), batch_size=8, num_threads=2,
                       device_id=0, seed=3)
    ck.save(0)

    def no_memory(*args, **kwargs):
        raise MemoryError("out of pinned memory")

    monkeypatch.setattr(device_digest._Pool, "take", no_memory)  # noqa: SLF001
    for _ in range(2):
        pipe.run()
    ck._batches.wait()  # noqa: SLF001
    recorded = ck._batches._done["train"]  # noqa: SLF001
    assert recorded == [["failed:MemoryError"]] * 2
    assert capsys.readouterr().err.count("out of pinned memory") == 1
    ck.close()


def test_one_launch_of_several_batches_gives_each_output_its_value():
    """Dense and ragged outputs of three batches in one launch (as the digest
    thread hands in a group), the data written on two streams it is ordered
    after: each output the model's value."""
    import cupy

    rng = np.random.default_rng(4)
    dense = [DENSE["32 x 64x64x3 uint8"], DENSE["float32"], DENSE["13-byte samples (words "
                                                                   "across samples, unaligned)"]]
    ragged = [rng.integers(0, 256, (i + 1, 5), dtype=np.uint8) for i in range(6)]
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    on_device, outs = [], []
    for k, host in enumerate(dense):
        with streams[k % 2]:
            dev = cupy.asarray(host)
        on_device.append(dev)
        outs.append(device_digest.Output(host.dtype.name, [host.shape[1:]] * host.shape[0],
                                         host.itemsize, base=dev.data.ptr,
                                         stride=host.itemsize * int(np.prod(host.shape[1:]))))
    with streams[1]:
        samples = [cupy.asarray(s) for s in ragged]
    outs.insert(1, device_digest.Output("uint8", [s.shape for s in ragged], 1,
                                        pointers=[s.data.ptr for s in samples]))
    got = device_digest.begin(outs, 0, [s.ptr for s in streams])()
    want = [dense[0], ragged, dense[1], dense[2]]
    assert [_hex(g) for g in got] == [digest_model.hexdigest(w) for w in want]


def test_two_gpu_pipelines_recorded_in_groups(data_dir, tmp_path, monkeypatch):
    """Two pipelines on GPU 0 (two streams) through one Checkpointer: their
    batches go to the digest thread in groups (fewer launches than batches),
    and each batch's recorded digest is the model's value of what the loop got."""
    import dvc_dali

    monkeypatch.setattr(batch_digests, "GROUP_WINDOW_S", 3600.0)  # the host copies take time
    ck = dvc_dali.Checkpointer(tmp_path / "ck", resume=False)
    pipes = [ck.pipeline(name, _pipeline(data_dir), batch_size=8, num_threads=2, device_id=0,
                         seed=seed) for name, seed in (("a", 3), ("b", 4))]
    ck.save(0)
    kept: dict[str, list] = {"a": [], "b": []}
    for _ in range(12):
        for name, pipe in zip("ab", pipes):
            outputs = pipe.run()
            kept[name].append([_host_samples(outputs[0]), _host_samples(outputs[1])])
    ck._batches.wait()  # noqa: SLF001
    costs = ck._batches.costs  # noqa: SLF001
    assert costs.background == 24 and costs.groups < 24, costs
    for name in "ab":
        recorded = ck._batches._done[name]  # noqa: SLF001
        assert [[_hex(d[0]), _hex(d[1])] for d in recorded] == [
            [digest_model.hexdigest(images), digest_model.hexdigest(crops)]
            for images, crops in kept[name]]
    ck.close()
