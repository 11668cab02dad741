"""Links into the DVC cache: under `dvc config cache.type symlink` (or
`hardlink,symlink` where hard links fail) DVC checks a checkpoint's files out
as symbolic links to its cache objects, after every `dvc exp run` and
`dvc exp apply`, and DVC's filesystem hands a row's files over so. A reader
follows such a link, and only such a one: any other link in a checkpoint is
an edit (the store follows none). One rule for the store and `load`.
"""

from __future__ import annotations

import os
import re

# DVC's <cache>/<2 hex>/<the rest of the hash> (DVC 3 puts them under files/md5/).
_CACHE_OBJECT = re.compile(r".*/[0-9a-f]{2}/[0-9a-f]{30,62}")


def is_cache_object(target: str) -> bool:
    """Whether a link's target has the shape of a DVC cache object's path."""
    return _CACHE_OBJECT.fullmatch(target) is not None


def cache_target(path: str | os.PathLike, name: str | None = None,
                 dir_fd: int | None = None) -> str | None:
    """Where the symbolic link ``path`` points, where that is a DVC cache
    object (a relative target made absolute from the link's directory); None
    for any other link. ``name`` and ``dir_fd``: the link read relative to an
    open directory (the store's), ``path`` then only names it."""
    target = os.readlink(name if name is not None else path, dir_fd=dir_fd)
    if not is_cache_object(target):
        return None
    return os.path.join(os.path.dirname(os.fspath(path)), target)


def missing_object(path: str | os.PathLike, target: str) -> str:
    """The line for a link to a cache object that is not there."""
    return (f"{os.fspath(path)}: a link to the DVC cache object {target}, which is not there "
            "(removed by `dvc gc`, or the cache moved): fetch it with `dvc pull` "
            "(`dvc-dali pull` for a row), or `dvc exp apply` a row the cache holds")
