"""A minimal training script with dvc-dali checkpoints (run it with `dvc exp run`)."""
import os
import sys

import numpy as np
import yaml
from nvidia.dali import fn, pipeline_def, types

import dvc_dali

p = {"data": "data/images", "steps": 100, "checkpoint_every": 10, "batch_size": 16,
     "seed": 0, "lr": 0.1, **(yaml.safe_load(open("params.yaml")) or {}).get("train", {})}
for key in ("steps", "checkpoint_every", "batch_size", "seed", "lr"):
    kind = "a number" if key == "lr" else "a whole number"
    if isinstance(p[key], bool) or not isinstance(p[key], (int, float) if key == "lr" else int):
        sys.exit(f"train.py: params.yaml train.{key} is {p[key]!r}, not {kind}: set it "
                 f"(`dvc exp run -S train.{key}=...` or in params.yaml), then rerun")
# The file reader labels <data>/<class>/ folders 0, 1, ... in sorted order.
classes = len([d for d in os.listdir(p["data"]) if os.path.isdir(os.path.join(p["data"], d))]
              if os.path.isdir(p["data"]) else [])
if not classes:
    sys.exit(f"train.py: {p['data']} holds no <class>/ folders: put your images in "
             f"{p['data']}/<class>/ (or run `dvc-dali init --digits` for samples), then rerun")


@pipeline_def
def images(data):  # <data>/<class>/<file>.jpg|png; every stateful operator named
    files, labels = fn.readers.file(file_root=data, random_shuffle=True, name="reader")
    imgs = fn.decoders.image(files, output_type=types.GRAY)
    imgs = fn.random_resized_crop(imgs, size=(16, 16), random_area=(0.5, 1.0), name="crop")
    return fn.cast(imgs, dtype=types.FLOAT) / 255.0, labels


os.makedirs("model", exist_ok=True)


def save_model(w):  # a new file renamed over the last, never written through a link into the
    np.save("model/weights.new.npy", w)  # DVC cache (cache.type symlink/hardlink: older rows')
    os.replace("model/weights.new.npy", "model/weights.npy")


# params: what the run trains with (a finished run rerun with other params
# starts anew); total_steps: when it is finished. Resumes from the last checkpoint.
ck = dvc_dali.Checkpointer("checkpoint", params=p, total_steps=p["steps"])
pipe = ck.pipeline("train", images, batch_size=p["batch_size"], num_threads=2,
                   device_id=None, seed=p["seed"], data=p["data"])
w = ck.arrays.get("w", np.zeros((16 * 16, classes), np.float32))
live = ck.live()  # dvclive.Live resumed at ck.step
print(f"{'resuming at step ' + str(ck.step) if ck.resumed else 'starting'}: "
      f"{p['steps']} steps, {classes} classes", flush=True)
for step in range(ck.step + 1, p["steps"] + 1):
    x, y = (np.asarray(out.as_tensor()) for out in pipe.run())
    x, y = x.reshape(len(x), -1), y.reshape(-1)
    logits = x @ w
    prob = np.exp(logits - logits.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    loss = float(-np.log(prob[np.arange(len(y)), y] + 1e-12).mean())
    prob[np.arange(len(y)), y] -= 1
    w -= np.float32(p["lr"]) * (x.T @ prob) / len(y)
    # every checkpoint_every steps, and at once on SIGTERM/SIGUSR1 (then it exits)
    if ck.should_save(step, p["checkpoint_every"]) or step == p["steps"]:
        print(f"step {step}/{p['steps']}: loss {loss:.4f}", flush=True)
        ck.wait()  # DVC_DALI_ASYNC=1: the last checkpoint's row recorded before its files change
        live.step = step  # log first: the recorded checkpoint holds this step's metrics
        live.log_metric("train/loss", loss)
        live.next_step()
        save_model(w)  # every output exists when DVC records it
        ck.make_checkpoint(step, arrays={"w": w}, metadata={"lr": p["lr"]})
save_model(w)
live.end()
