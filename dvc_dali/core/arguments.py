"""Checks of the Python API's arguments shared by its entry points: a bad
value is refused in one line naming the argument and what to pass
(``ArgumentTypeError``, also a TypeError; ``ArgumentError``, also a
ValueError), not a traceback from deep inside."""

from __future__ import annotations

import numbers
import os
from typing import Any

from .errors import ArgumentError, ArgumentTypeError


def kind_of(value: object) -> str:
    """'an int', 'a list': the type of a refused value, for a message."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def shown(value: Any) -> str:
    """``repr(value)``, cut short for a line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def given(where: str, value: Any) -> str:
    """How a message names an argument and its value: ``step=5``, or in a
    call (``where`` opens it: ``load(path``) ``load(path=5)``."""
    return f"{where}={shown(value)}" + (")" if "(" in where else "")


def check_path(value: Any, where: str, example: str, none_ok: bool = False) -> None:
    """``value`` is a path (a str or os.PathLike, not empty); ``where`` names
    the argument (``load(path``), ``example`` what to pass."""
    if value is None and none_ok:
        return
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentTypeError(f"{given(where, value)}: must be a path (a str or "
                                f"pathlib.Path) such as {example}, not {kind_of(value)}")
    if not os.fspath(value):
        raise ArgumentError(f"{given(where, value)}: an empty path names nothing; pass one "
                            f"such as {example}")


def check_str(value: Any, where: str, example: str, none_ok: bool = True) -> None:
    """``value`` is a str (or None where ``none_ok``)."""
    if not (isinstance(value, str) or (value is None and none_ok)):
        none = ", or None" if none_ok else ""
        raise ArgumentTypeError(f"{given(where, value)}: must be a str such as {example}"
                                f"{none}, not {kind_of(value)}")


def check_count(value: Any, where: str, what: str) -> None:
    """``value`` is None or a positive int (a NumPy integer too; not a bool,
    a float or a str such as '3', which read as a count hid a typo);
    ``what`` says what it counts."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{given(where, value)}: must be a positive int, {what}, not "
                                f"{kind_of(value)}; None keeps the default")
    if value < 1:
        raise ArgumentError(f"{given(where, value)}: must be a positive int, {what}; None "
                            "keeps the default")
