"""Checks of the Python API's arguments shared by its entry points: a bad
value is refused in one line naming the argument and what to pass
(``ArgumentTypeError``, also a TypeError; ``ArgumentError``, also a
ValueError), not a traceback from deep inside."""

from __future__ import annotations

import functools
import numbers
import os
import types
from typing import Any, Callable

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


def checked_call(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with Python's own TypeError for arguments that do not fit
    its signature (an unknown keyword, one missing, too many) turned into an
    ``ArgumentTypeError`` naming the call, the argument and (for a misspelt
    keyword) the close match: one line through the exit hook, not a
    traceback. The call is made as is and only a failed call is looked at,
    so a good call costs one frame; a TypeError from inside ``func`` (its
    frame started) passes unchanged. ``functools.wraps`` keeps the name,
    docstring and signature (``help()``, the API reference)."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TypeError as exc:
            if exc.__traceback__ is None or exc.__traceback__.tb_next is not None:
                raise  # raised inside func: its frame started, so the arguments bound
            refusal = _unbound(func, args, kwargs)
            if refusal is None:
                raise
            from .exit_hooks import install_hook

            install_hook()  # raised before func's own install: one line all the same
            raise refusal from None
    return call


def checked_methods(cls: type) -> type:
    """``checked_call`` on ``cls.__init__`` and each public method (not the
    properties: ``ck.step`` is read in the training loop)."""
    for name, value in list(vars(cls).items()):
        public = name == "__init__" or not name.startswith("_")
        if public and isinstance(value, types.FunctionType):
            setattr(cls, name, checked_call(value))
    return cls


def _unbound(func: Callable[..., Any], args: tuple, kwargs: dict) -> ArgumentTypeError | None:
    """The refusal of ``func(*args, **kwargs)`` whose arguments do not bind
    to its signature; None where they do (the TypeError was another)."""
    import inspect

    sig = inspect.signature(func)
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        what = str(exc)
    else:
        return None
    params = list(sig.parameters.values())
    owner, _, name = func.__qualname__.rpartition(".")
    if params and params[0].name == "self" and owner:
        params = params[1:]  # a method: its self is not the caller's to pass
        name = owner if name == "__init__" else f"{owner}.{name}"
    what = _misspelt(params, kwargs) or what
    takes = ", ".join(_shown_params(params))
    return ArgumentTypeError(f"{name}(): {what}; it takes {name}({takes})")


def _misspelt(params: list[Any], kwargs: dict) -> str:
    """What Python says of a keyword ``params`` lack, with its close match:
    said first, as a misspelt keyword also makes a required one missing."""
    import difflib

    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY)]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return ""
    for key in kwargs:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            return f"got an unexpected keyword argument {key!r}" + (
                f" (did you mean {close[0]!r}?)" if close else "")
    return ""


def _shown_params(params: list[Any]) -> list[str]:
    """``step``, ``*``, ``out=None``: the parameters (``inspect.Parameter``)
    as a message lists them, with the ``*`` before keyword-only ones."""
    shown_, starred = [], False
    for param in params:
        if param.kind is param.KEYWORD_ONLY and not starred:
            shown_.append("*")
        starred = starred or param.kind in (param.VAR_POSITIONAL, param.KEYWORD_ONLY)
        shown_.append(_shown_param(param))
    return shown_


def _shown_param(param: Any) -> str:
    """``step``, ``out=None``, ``*args``: a parameter as a message lists it."""
    if param.kind is param.VAR_POSITIONAL:
        return f"*{param.name}"
    if param.kind is param.VAR_KEYWORD:
        return f"**{param.name}"
    if param.default is param.empty:
        return param.name
    return f"{param.name}={shown(param.default)}"


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
