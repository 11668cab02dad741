"""Sample images for `dvc-dali init --digits`: scikit-learn's bundled
handwritten digits (no download) as PNG files in class folders, so the
Quickstart trains before a user has data of their own.

PNG is written here with zlib (8-bit grayscale, no filter): Pillow is not
a dependency, and DALI decodes these files as any other PNG.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from ..core.errors import ConfigError

SIDE = 16  # the 8x8 digits upscaled (nearest), the template's crop size


def png_bytes(rows: list[bytes]) -> bytes:
    """A grayscale PNG of the given rows (one byte per pixel, equal lengths)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", len(rows[0]), len(rows), 8, 0, 0, 0, 0)
    raw = b"".join(b"\x00" + row for row in rows)  # filter type 0 on every row
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def write_digits(dest: Path) -> int:
    """Write <dest>/<label>/<index>.png for the 1,797 digits; the count."""
    try:
        import numpy as np
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError("dvc-dali init --digits: the sample images come from scikit-learn, "
                          "which is not installed: pip install 'dvc-dali[example]' (or put "
                          "your own images in data/images/<class>/)") from None
    digits = load_digits()
    pixels = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    scale = SIDE // pixels.shape[1]
    for index, (image, label) in enumerate(zip(pixels, digits.target)):
        big = image.repeat(scale, axis=0).repeat(scale, axis=1)
        folder = dest / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index:04d}.png").write_bytes(png_bytes([bytes(r) for r in big]))
    return len(pixels)
