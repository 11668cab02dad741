"""Write scikit-learn's bundled handwritten digits as PNG files in class folders.

    python examples/prepare.py [OUT_DIR] [--size N] [--params params.yaml]

Writes OUT_DIR/<label>/<index>.png (default data/digits): 1797 grayscale
images, 8x8 upscaled to N x N (default: params.yaml `prepare.size`, else 32)
with nearest-neighbour resampling. No download: the data ships with
scikit-learn. The bytes are deterministic, so DVC caches the folder once and
a DALI checkpoint's data digest stays valid across reruns.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np


def read_params(path: Path) -> dict:
    if not path.is_file():
        return {}
    import yaml

    with open(path, encoding="utf-8") as fh:
        return (yaml.safe_load(fh) or {}).get("prepare") or {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=None,
                        help="output directory (default: params prepare.out, else data/digits)")
    parser.add_argument("--size", type=int, default=None,
                        help="side of the written images (default: params prepare.size, else 32)")
    parser.add_argument("--params", default="params.yaml", help="params file (default params.yaml)")
    args = parser.parse_args(argv)

    params = read_params(Path(args.params))
    out = Path(args.out or params.get("out", "data/digits"))
    size = int(args.size or params.get("size", 32))
    if size < 8:
        parser.error(f"--size {size}: must be at least 8 (the digits are 8x8)")

    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    # Pixel values are 0..16; stretch them to 0..255.
    pixels = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    labels = digits.target

    if out.exists():
        shutil.rmtree(out)  # a clean folder: stale files would change the data set
    for label in range(10):
        (out / str(label)).mkdir(parents=True)
    counts = np.zeros(10, dtype=int)
    for index, (image, label) in enumerate(zip(pixels, labels)):
        img = Image.fromarray(image).resize((size, size), Image.Resampling.NEAREST)
        img.save(out / str(label) / f"{index:04d}.png", format="PNG", optimize=False)
        counts[label] += 1
    print(f"prepare: wrote {len(labels)} {size}x{size} PNG images in 10 class folders to {out} "
          f"(per class: {', '.join(str(c) for c in counts)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
