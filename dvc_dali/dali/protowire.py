"""A minimal protobuf wire-format reader.

DALI's checkpoints and serialized pipelines are protobuf messages, but DALI
ships no Python bindings for them. Reading the few fields we need by hand
avoids a protobuf dependency and never executes anything from the bytes.
"""

from __future__ import annotations

from typing import Iterator

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Yield (field number, wire type, value) for each field of a message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == VARINT:
            value, pos = _varint(data, pos)
        elif wire == LEN:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise WireError("truncated length-delimited field")
            value, pos = data[pos : pos + size], pos + size
        elif wire in (I64, I32):
            width = 8 if wire == I64 else 4
            if pos + width > len(data):
                raise WireError("truncated fixed-width field")
            value, pos = data[pos : pos + width], pos + width
        else:
            raise WireError(f"unsupported wire type {wire}")
        yield number, wire, value


def parse(data: bytes) -> dict[int, list[int | bytes]]:
    """Group a message's fields by number (repeated fields keep their order)."""
    out: dict[int, list[int | bytes]] = {}
    for number, _wire, value in fields(data):
        out.setdefault(number, []).append(value)
    return out


# Typed access for readers of untrusted bytes: a field of the wrong wire
# type (an int where bytes are expected) raises WireError, never
# AttributeError or TypeError, so one `except WireError` covers everything.
_MISSING = object()


def _first(msg: dict[int, list[int | bytes]], number: int, kind: type, default: object):
    values = msg.get(number)
    if not values:
        if default is _MISSING:
            raise WireError(f"field {number} is missing")
        return default
    if not isinstance(values[0], kind):
        raise WireError(f"field {number} is not {'bytes' if kind is bytes else 'a varint'}")
    return values[0]


def first_bytes(msg: dict[int, list[int | bytes]], number: int,
                default: object = _MISSING) -> bytes:
    """The first value of length-delimited field ``number`` (``default``
    when absent; WireError when absent without a default or not bytes)."""
    return _first(msg, number, bytes, default)


def first_int(msg: dict[int, list[int | bytes]], number: int, default: object = _MISSING) -> int:
    """The first value of varint field ``number``, as first_bytes."""
    return _first(msg, number, int, default)


def first_text(msg: dict[int, list[int | bytes]], number: int,
               default: object = _MISSING) -> str:
    """The first value of string field ``number``, decoded as UTF-8."""
    value = first_bytes(msg, number, default)
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"field {number} is not UTF-8 ({exc.reason})") from None
