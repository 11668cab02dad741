"""The `evaluate` stage: the best checkpoint row of the run whose checkpoint
this stage depends on (the checkpoint output here, under `--temp` and queued
runs the temporary repository's), read with dvc_dali.load (no resume, no
DALI), scored on every image of the data set; writes eval/metrics.json.

The run: dvc_dali.current_row names the recorded row the checkpoint holds,
dvc_dali.rows(run=...) that row's run, best_row its best. Another run, one
of another experiment or of the same name on another commit, is never
scored. A checkpoint that is no recorded row (`dvc repro`) is scored itself.

Every variant is scored, with NumPy (the same MLP: dense, ReLU, dense): its
weights as its trainer saves them, `w1 b1 w2 b2` (numpy), the state_dict
under `model` (torch: fc1, fc2, weights transposed; lightning: under
`lightning`'s `state_dict`), the model's variables under `keras` (keras: its
two dense layers' kernel and bias; the dropout does nothing at inference).
Evaluating needs no TensorFlow: NumPy's float32 sums, in another order than
TensorFlow's, differ from its logits in the last bits only, which changes an
image's top class only where two classes tie to those bits.

Usage: python examples/evaluate.py [--metric train/acc:max] [--out eval/metrics.json]
                                   [--checkpoint checkpoint]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

import dvc_dali

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CROP, read_params  # noqa: E402


def images(data: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every image, resized to the model's input, and its label (the file
    reader's: class folders in sorted order)."""
    classes = sorted(d.name for d in data.iterdir() if d.is_dir())
    xs, ys = [], []
    for label, name in enumerate(classes):
        for path in sorted((data / name).iterdir()):
            img = Image.open(path).convert("L").resize((CROP, CROP), Image.BILINEAR)
            xs.append(np.asarray(img, np.float32).reshape(-1) / 255.0)
            ys.append(label)
    return np.stack(xs), np.asarray(ys)


def _f32(value) -> np.ndarray:
    """A NumPy float32 copy of a NumPy, CuPy (train.device gpu) or torch array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
    elif type(value).__module__.split(".")[0] == "cupy":
        value = value.get()
    return np.asarray(value, dtype=np.float32)


def _keras_weights(arrays: dict, metadata: dict) -> dict | None:
    """The two dense layers of examples/train_keras.py by variable path
    (keras_callback stores the values and, in the metadata, their paths)."""
    paths = (metadata.get("keras") or {}).get("model") or []
    values = dict(zip(paths, (arrays.get("keras") or {}).get("model") or []))
    dense = [p[:-len("/kernel")] for p in paths if p.endswith("/kernel")]
    if len(dense) != 2 or not all(f"{d}/bias" in values for d in dense):
        return None
    return {"w1": values[f"{dense[0]}/kernel"], "b1": values[f"{dense[0]}/bias"],
            "w2": values[f"{dense[1]}/kernel"], "b2": values[f"{dense[1]}/bias"]}


def _torch_weights(state_dict) -> dict | None:
    """fc1 and fc2 of a torch state_dict (torch.nn.Linear keeps its weight
    as outputs x inputs), under any prefix (Lightning's module: "net.")."""
    if not isinstance(state_dict, dict):
        return None
    prefix = next((k[:-len("fc1.weight")] for k in state_dict if k.endswith("fc1.weight")), None)
    if prefix is None or f"{prefix}fc2.bias" not in state_dict:
        return None
    return {"w1": _f32(state_dict[f"{prefix}fc1.weight"]).T, "b1": state_dict[f"{prefix}fc1.bias"],
            "w2": _f32(state_dict[f"{prefix}fc2.weight"]).T, "b2": state_dict[f"{prefix}fc2.bias"]}


def mlp_weights(state, where: str) -> dict:
    """{"w1": inputs x hidden, "b1", "w2": hidden x classes, "b2"}, float32,
    from the checkpoint of any of the example's trainers."""
    arrays = state.arrays
    if "keras" in arrays:
        found = _keras_weights(arrays, state.metadata)
    elif "model" in arrays:  # examples/train_torch.py: the model's state_dict
        found = _torch_weights(arrays["model"])
    elif "lightning" in arrays:  # examples/train_lightning.py: Lightning's checkpoint
        found = _torch_weights((arrays["lightning"] or {}).get("state_dict"))
    else:
        found = {k: arrays[k] for k in ("w1", "b1", "w2", "b2")} if "w1" in arrays else None
    if found is None:
        sys.exit(f"evaluate: {where} (step {state.step}) holds no model of the example's "
                 f"trainers (arrays {sorted(arrays)}); evaluate a checkpoint that "
                 "examples/train.py, train_torch.py, train_keras.py or train_lightning.py "
                 "wrote")
    return {k: _f32(v) for k, v in found.items()}


def accuracy(w: dict, x: np.ndarray, y: np.ndarray) -> float:
    h = np.maximum(x @ w["w1"] + w["b1"], 0)
    return float(((h @ w["w2"] + w["b2"]).argmax(axis=1) == y).mean())


def best_of_own_run(checkpoint: str, metric: str) -> dict | None:
    """The best row (by ``metric``) of the run the checkpoint output holds;
    None when the checkpoint is no recorded row."""
    here = dvc_dali.current_row(checkpoint)
    if here is None:
        return None
    return dvc_dali.best_row(dvc_dali.rows(run=here, params=False), metric) or here


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metric", default="train/acc:max")
    parser.add_argument("--out", default="eval/metrics.json")
    parser.add_argument("--checkpoint", default="checkpoint", help="the stage's checkpoint dep")
    args = parser.parse_args(argv)
    p = read_params(Path("params.yaml"))
    best = best_of_own_run(args.checkpoint, args.metric)
    state = dvc_dali.load(args.checkpoint, rev=best) if best else dvc_dali.load(args.checkpoint)
    report = {"row": state.row or "workspace", "step": state.step}
    weights = mlp_weights(state, state.ref or args.checkpoint)
    report["acc"] = accuracy(weights, *images(Path(p["data"])))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"evaluate: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
