"""A bounded reader for the .npy files dvc-dali writes.

``np.load`` trusts the header: a header declaring shape (10**7, 10**7)
makes it allocate 3.6 TiB before noticing the file holds 100 bytes, and
object dtypes take its pickle path. Here the header is parsed by a strict
pattern (capped at MAX_HEADER bytes), checked against what the manifest
says and against the file's size, and only then is memory allocated: never
more than the file holds. The data is read straight into the final array,
the md5 computed in the same pass.
"""

from __future__ import annotations

import math
import mmap
import re
from typing import Any, BinaryIO

import numpy as np

MAGIC = b"\x93NUMPY"
MAX_HEADER = 1 << 16
MAX_DIMS = 64  # NumPy's own limit
_CHUNK = 4 << 20  # each chunk hashed as it arrives, while in the CPU's cache
_HEADER = re.compile(r"\{\s*'descr':\s*(?P<descr>.+?),\s*'fortran_order':\s*(?P<fortran>True"
                     r"|False),\s*'shape':\s*\((?P<shape>[0-9,\s]*)\),?\s*\}\s*", re.S)
_SIMPLE_DESCR = re.compile(r"'([<>|][biufcmMSUV][0-9]{1,10}(\[[A-Za-z0-9]{1,8}\])?)'")
_DIM = re.compile(r"[0-9]{1,19}")


class NpyError(ValueError):
    """Not a .npy this reader accepts, or not the array the manifest describes."""


# Tokens of a structured dtype's descr, a Python literal such as
# [('a', '<f4'), ('b', '<i8', (2,))]: brackets, commas, quoted strings, ints.
_TOKEN = re.compile(r"""\s*(?:([\[\](),])|'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)"|([0-9]{1,19}))""",
                    re.S)
_MAX_NESTING = 32


def _tokens(text: str) -> list[tuple[str | None, str | None, str | None]]:
    out, pos = [], 0
    while text[pos:].strip():
        match = _TOKEN.match(text, pos)
        if not match:
            raise NpyError(f"descr {text[:60]!r} is not a dtype")
        punct, single, double, number = match.groups()
        text_value = single if single is not None else double
        out.append((punct, text_value, number))
        pos = match.end()
    return out


def _unquote(body: str) -> str:
    # Python's own string escapes (\', \n, \xNN, \uNNNN), decoded without eval
    return body.encode("latin-1", "backslashreplace").decode("unicode_escape")


def _literal(tokens: list, i: int, depth: int) -> tuple[Any, int]:
    """The list/tuple/str/int starting at tokens[i], and the index after it."""
    if depth > _MAX_NESTING or i >= len(tokens):
        raise NpyError("descr is not a dtype (too deep or cut short)")
    punct, text, number = tokens[i]
    if text is not None:
        return _unquote(text), i + 1
    if number is not None:
        return int(number), i + 1
    if punct not in ("[", "("):
        raise NpyError(f"descr is not a dtype (unexpected {punct!r})")
    close, items, i = "]" if punct == "[" else ")", [], i + 1
    while i < len(tokens) and tokens[i][0] != close:
        item, i = _literal(tokens, i, depth + 1)
        items.append(item)
        if i < len(tokens) and tokens[i][0] == ",":
            i += 1
        elif i >= len(tokens) or tokens[i][0] != close:
            raise NpyError("descr is not a dtype (no comma or closing bracket)")
    if i >= len(tokens):
        raise NpyError("descr is not a dtype (cut short)")
    return (items if punct == "[" else tuple(items)), i + 1


def _descr_dtype(text: str) -> np.dtype:
    simple = _SIMPLE_DESCR.fullmatch(text)
    try:
        if simple:
            return np.dtype(simple.group(1))
        if not text.startswith("["):
            raise NpyError(f"descr {text[:60]!r} is not a dtype")
        tokens = _tokens(text)
        descr, end = _literal(tokens, 0, 0)
        if end != len(tokens):
            raise NpyError(f"descr {text[:60]!r} is not a dtype")
        return np.lib.format.descr_to_dtype(descr)
    except NpyError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, UnicodeError) as exc:
        raise NpyError(f"descr {text[:60]!r} is not a dtype ({exc})") from None


def _shape(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if parts and parts[-1] == "":
        parts.pop()  # "(4,)"
    if len(parts) > MAX_DIMS or not all(_DIM.fullmatch(p) for p in parts):
        raise NpyError(f"shape ({text[:60]}) is not a tuple of at most {MAX_DIMS} sizes")
    return tuple(int(p) for p in parts)


def parse_header(prefix: bytes) -> tuple[int, int]:
    """(header length, data offset) from a .npy's first 12 bytes (or fewer)."""
    if prefix[:6] != MAGIC or len(prefix) < 10:
        raise NpyError("no .npy magic number")
    major, minor = prefix[6], prefix[7]
    if (major, minor) == (1, 0):
        length, start = int.from_bytes(prefix[8:10], "little"), 10
    elif (major, minor) in ((2, 0), (3, 0)) and len(prefix) >= 12:
        length, start = int.from_bytes(prefix[8:12], "little"), 12
    else:
        raise NpyError(f".npy format version {major}.{minor} is not one NumPy writes")
    if length > MAX_HEADER:
        raise NpyError(f"header of {length} bytes, more than the {MAX_HEADER} allowed")
    return length, start + length


def parse_dict(header: bytes, encoding: str = "latin-1") -> tuple[np.dtype, tuple[int, ...],
                                                                   bool]:
    """(dtype, shape, fortran_order) from the header's dict literal (latin-1
    in format 1.0 and 2.0, UTF-8 in 3.0)."""
    try:
        text = header.decode(encoding)
    except UnicodeDecodeError:
        raise NpyError(f"header is not {encoding} text") from None
    match = _HEADER.fullmatch(text)
    if not match:
        raise NpyError(f"header {text[:80]!r} is not the dict NumPy writes")
    dtype = _descr_dtype(match.group("descr"))
    if dtype.hasobject:
        raise NpyError(f"dtype {dtype} holds Python objects (pickle); dvc-dali never "
                       "unpickles")
    if dtype.itemsize == 0:
        raise NpyError(f"dtype {dtype} has zero-size elements")
    return dtype, _shape(match.group("shape")), match.group("fortran") == "True"


# From this size on, an array read from a checkpoint lives in its own
# anonymous mapping, its pages mapped in one call (MAP_POPULATE) and 4 KiB
# each. np.empty's memory is madvised for transparent huge pages from 4 MB
# on: with the kernel's defrag=madvise every fault of a fresh array may
# compact memory first, which on a busy machine tripled the CPU a 1 GB
# restore took (benchmark 9). torch.load's memory is not madvised either.
MAP_FROM = 1 << 20
_MAP_FLAGS = (getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
              | getattr(mmap, "MAP_POPULATE", 0))


def empty(shape: tuple[int, ...], dtype: np.dtype, fortran: bool, nbytes: int) -> np.ndarray:
    """A new writable array of ``shape`` (``nbytes`` bytes), not initialised."""
    if nbytes >= MAP_FROM and hasattr(mmap, "MAP_ANONYMOUS"):
        try:
            memory = mmap.mmap(-1, nbytes, flags=_MAP_FLAGS)
        except OSError:  # e.g. a limit on mappings: NumPy's allocator then
            pass
        else:  # the array keeps the mapping alive (its base); unmapped with it
            flat = np.frombuffer(memory, dtype, math.prod(shape))
            return flat.reshape(shape, order="F" if fortran else "C")
    return np.empty(shape, dtype, order="F" if fortran else "C")


def _fill(fh: BinaryIO, buf: memoryview, md5: Any) -> None:
    """Read len(buf) bytes into buf, hashing each chunk as it arrives."""
    pos = 0
    while pos < len(buf):
        got = fh.readinto(buf[pos:pos + _CHUNK])
        if not got:
            raise NpyError(f"ends after {pos} data bytes of {len(buf)} (changed while read)")
        md5.update(buf[pos:pos + got])
        pos += got


def read(fh: BinaryIO, size: int, dtype_str: str, shape: list[int], md5: Any) -> np.ndarray:
    """The array in ``fh`` (``size`` bytes from its current position), which
    must have dtype ``dtype_str`` and ``shape`` (the manifest's entry);
    every byte read goes through ``md5``. Allocates at most ``size`` bytes."""
    prefix = fh.read(min(size, 12))
    length, offset = parse_header(prefix)
    if offset > size:
        raise NpyError(f"header of {length} bytes, but the file has {size}")
    head = prefix + fh.read(offset - len(prefix))
    if len(head) != offset:
        raise NpyError("ends inside its header (changed while read)")
    md5.update(head)
    dtype, got_shape, fortran = parse_dict(head[offset - length:],
                                           "utf-8" if prefix[6] == 3 else "latin-1")
    if dtype.str != np.dtype(dtype_str).str or list(got_shape) != list(shape):
        raise NpyError(f"holds dtype {dtype.str} shape {got_shape}, the manifest says "
                       f"{dtype_str} shape {tuple(shape)}")
    nbytes = math.prod(got_shape) * dtype.itemsize  # Python ints: no overflow
    if nbytes != size - offset:
        raise NpyError(f"shape {got_shape} of {dtype.str} needs {nbytes} data bytes, the file "
                       f"has {size - offset}")
    array = empty(got_shape, dtype, fortran, nbytes)
    if nbytes:
        _fill(fh, memoryview(array.reshape(-1, order="A").view(np.uint8)), md5)
    return array
