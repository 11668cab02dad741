"""Calls of the public API whose arguments do not fit its signature (an
unknown keyword, one missing, too many): Python's own TypeError turned into
an ``ArgumentTypeError`` naming the call, the argument and the close match,
one line through the exit hook. Apart from ``arguments.py`` because it
installs that hook (``exit_hooks`` imports, through ``run.py``, what
imports ``arguments``)."""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

from .arguments import shown
from .errors import ArgumentTypeError


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
