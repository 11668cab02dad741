"""The `evaluate` stage: the best checkpoint row of the training run so far,
read with dvc_dali.load (no resume, no DALI), scored on every image of the
data set; writes eval/metrics.json.

Usage: python examples/evaluate.py [--metric train/acc:max] [--out eval/metrics.json]
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


def accuracy(w: dict, x: np.ndarray, y: np.ndarray) -> float:
    h = np.maximum(x @ w["w1"] + w["b1"], 0)
    return float(((h @ w["w2"] + w["b2"]).argmax(axis=1) == y).mean())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metric", default="train/acc:max")
    parser.add_argument("--out", default="eval/metrics.json")
    args = parser.parse_args(argv)
    p = read_params(Path("params.yaml"))
    best = dvc_dali.best_row(dvc_dali.rows(), args.metric)
    # the best recorded row; before any row exists, the workspace checkpoint
    state = dvc_dali.load(rev=best["name"]) if best else dvc_dali.load()
    report = {"row": state.row or "workspace", "step": state.step}
    if p["framework"] == "numpy":  # the torch variant saves a state_dict instead
        x, y = images(Path(p["data"]))
        report["acc"] = accuracy({k: np.asarray(state.arrays[k]) for k in
                                  ("w1", "b1", "w2", "b2")}, x, y)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"evaluate: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
