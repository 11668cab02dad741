"""JSON read from a checkpoint, parsed only below a nesting limit.

``json.loads`` recurses once per nesting level, so a document nested
100,000 levels deep raises RecursionError, and code walking a parsed
document 900 levels deep can too. :func:`depth` measures the nesting on the
bytes first (C-level replaces and a numpy pass, no recursion), so
:func:`loads` parses only what every later walk can handle.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..core.errors import CheckpointCorruptError

# Deep enough for any manifest dvc-dali writes (an arrays tree of 64 levels
# takes ~200), far below Python's recursion limit (1000).
MAX_DEPTH = 256
DEFAULT_FIX = ("restore an earlier checkpoint with `dvc exp apply <row>`, or start over "
               "with `dvc-dali reset`")

_QUOTE = ord('"')
_CHUNK = 1 << 20  # bytes scanned at once: ~7 MiB of temporaries
_STEP = np.zeros(256, np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in UTF-8 JSON ``data``.

    Exact for valid JSON (what json.loads accepts); for invalid JSON a
    number json.loads will reject anyway. Memory: at most two copies of
    ``data`` (only when it holds backslashes) plus ~7 MiB.
    """
    # Escaped backslashes first (left to right, so a run of n leaves n % 2),
    # then escaped quotes: every quote left opens or closes a string.
    codes = np.frombuffer(data.replace(b"\\\\", b"").replace(b'\\"', b""), np.uint8)
    level = deepest = 0
    inside = False  # within a string at the end of the previous chunk
    for start in range(0, len(codes), _CHUNK):
        chunk = codes[start:start + _CHUNK]
        # odd number of quotes so far: a bracket here is text in a string
        in_string = np.logical_xor.accumulate(chunk == _QUOTE)
        if inside:
            np.logical_not(in_string, out=in_string)
        steps = _STEP[chunk]
        steps[in_string] = 0
        sums = np.cumsum(steps, dtype=np.int32)
        deepest = max(deepest, level + int(sums.max()))
        level += int(sums[-1])
        inside = bool(in_string[-1])
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(data: bytes | str, *, where: str, max_depth: int = MAX_DEPTH,
          allow_constants: bool = True, fix: str = DEFAULT_FIX) -> Any:
    """Parse ``data`` (UTF-8 JSON), refusing documents nested deeper than
    ``max_depth``. Every failure is a CheckpointCorruptError that names
    ``where`` (a file, or a file and what inside it) and ends with ``fix``.
    ``allow_constants=False`` also refuses NaN and Infinity."""
    try:
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        text = raw.decode("utf-8")  # the byte scan below is exact only for UTF-8
    except (UnicodeError, TypeError) as exc:
        raise CheckpointCorruptError(f"{where}: not valid JSON (not UTF-8 text: {exc}): "
                                     f"{fix}") from None
    found = depth(raw)
    if found > max_depth:
        raise CheckpointCorruptError(f"{where}: JSON nested {found} levels deep, more than "
                                     f"the {max_depth} dvc-dali reads (edited or damaged): "
                                     f"{fix}")
    try:
        if allow_constants:
            return json.loads(text)
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # RecursionError: a deep call stack already
        raise CheckpointCorruptError(f"{where}: not valid JSON ({exc}): {fix}") from None
