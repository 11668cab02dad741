"""DALI pipelines of benchmarks 4 and 5: file reader with shuffle, decoding,
random crop. Imported by the bench and its child processes, so a restore
sees the very pipeline that saved. `run.py --gpu` sets DVC_DALI_BENCH_GPU=1:
decoding then runs on device 0 ("mixed") and the crop on the GPU (``gpu=``
chooses, for a benchmark that runs both: 16)."""

import os

from nvidia.dali import fn, pipeline_def, types

GPU = os.environ.get("DVC_DALI_BENCH_GPU") == "1"


@pipeline_def
def decode_crop(root, size=64, gpu=GPU):
    jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="reader")
    images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)
    images = fn.random_resized_crop(images, size=(size, size), name="crop")
    return images, labels


PIPE_ARGS = dict(batch_size=32, num_threads=2, device_id=0 if GPU else None, seed=7)
