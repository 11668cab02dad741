"""Which file holds a row's metrics, found as DVC finds a project's metrics:
in the metrics files its dvc.yaml declares. `dvc-dali show` and
`dvc_dali.rows` read each row's metrics there unless told a file.

A row names its stage (``"sub/dvc.yaml:train"``, relative to the DVC root);
the dvc.yaml the row's own commit holds is read, and the first JSON file of:

1. the stage's ``metrics:`` outputs (relative to its ``wdir``);
2. the top-level ``metrics:`` of its dvc.yaml (relative to the dvc.yaml's
   folder; one under the stage's ``wdir`` first: DVCLive's, run there);
3. the top-level ``metrics:`` of the dvc.yaml in the stage's ``wdir``
   (where DVCLive writes its section, run from there, by default);
4. else DVCLive's default, ``dvclive/metrics.json`` at the DVC root.

Paths DVC would interpolate (``${...}``) or that lead out of the project
are skipped: which file they mean is DVC's to say; but in a ``foreach``
stage's ``do:``, ``${item}`` and ``${key}`` are put in where the
``foreach`` is written out in dvc.yaml (foreach_values), as DVC does. No DVC import: the YAML
is parsed with the library DVC parses it with.
"""

from __future__ import annotations

import posixpath
from typing import Any, Mapping, Optional

DEFAULT_METRICS = "dvclive/metrics.json"


def safe_yaml(text: bytes | str | None) -> Any:
    """A YAML file of a row (params.yaml, dvc.yaml, dvc.lock) as plain data;
    None when there is none or it does not parse (the row is listed anyway)."""
    if text is None:
        return None
    from ruamel.yaml import YAML  # DVC's own YAML library; "safe" builds plain data only

    try:
        return YAML(typ="safe", pure=True).load(text)
    except Exception:  # not YAML, or not text
        return None


def split_stage(stage: Optional[str]) -> Optional[tuple[str, str]]:
    """(dvc.yaml path, stage name) of a row's ``stage`` field; None without one."""
    path, sep, name = (stage or "").rpartition(":")
    return (path, name) if sep and path and name else None


def _joined(folder: str, path: Any) -> Optional[str]:
    """``path`` (as dvc.yaml gives it) under ``folder``, normalized; None for
    one that is no plain relative path inside the project."""
    if not isinstance(path, str) or not path or "${" in path or path.startswith("/"):
        return None
    full = posixpath.normpath(posixpath.join(folder, path))
    return None if full == ".." or full.startswith("../") else full


def _json_paths(entries: Any, folder: Optional[str]) -> list[str]:
    """The JSON files of a ``metrics:`` list (``- path`` or ``- path: {...}``)."""
    if folder is None or not isinstance(entries, list):
        return []
    found = []
    for entry in entries:
        key = next(iter(entry), None) if isinstance(entry, dict) and len(entry) == 1 else entry
        path = _joined(folder, key)
        if path is not None and path.lower().endswith(".json"):
            found.append(path)
    return found


def _stage_entry(data: Any, name: str) -> Any:
    """The dvc.yaml entry of stage ``name``; of ``base@key``, the ``do:`` of
    a ``foreach`` (or the ``matrix`` stage itself)."""
    stages = data.get("stages") if isinstance(data, dict) else None
    if not isinstance(stages, dict):
        return None
    entry = stages.get(name)
    if entry is None and "@" in name:
        base, _, key = name.partition("@")
        entry = stages.get(base)
        if isinstance(entry, dict) and "foreach" in entry:
            entry = _substituted(entry.get("do"), foreach_values(entry["foreach"], key))
    return entry if isinstance(entry, dict) else None


def _scalar_str(value: Any) -> Optional[str]:
    """A foreach value as DVC writes it into a stage (its to_str: booleans
    as ``true``/``false``); None for a list or mapping."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return None if isinstance(value, (dict, list)) else str(value)


def foreach_values(foreach: Any, key: str) -> dict[str, str]:
    """What ``${item}`` and ``${key}`` are in the ``do:`` of stage
    ``base@<key>``, where dvc.yaml writes the ``foreach`` out: a list of
    plain values (named by the value: ``${item}``) or a mapping (named by
    its key: ``${key}``, and ``${item}`` where the value is plain), as DVC
    names the generated stages. {} for one DVC interpolates (``${params}``),
    a list of mappings (named by index) or a key it does not hold. Pure."""
    if isinstance(foreach, dict):
        found = {_scalar_str(k): v for k, v in foreach.items()}
        if key not in found:
            return {}
        item = _scalar_str(found[key])
        return {"${key}": key, **({"${item}": item} if item is not None else {})}
    if not isinstance(foreach, list) or any(isinstance(v, (dict, list)) for v in foreach):
        return {}
    return {"${item}": key} if key in {_scalar_str(v) for v in foreach} else {}


def _substituted(entry: Any, values: dict[str, str]) -> Any:
    """A ``do:`` entry with ``${item}``/``${key}`` put in its ``wdir`` and
    ``metrics`` paths (a foreach stage's per-item metrics file was skipped
    as interpolated, so `show --best` and keep_best found no metric: found
    by a sweep); any other ``${...}`` stays, and is skipped as before."""
    if not isinstance(entry, dict) or not values:
        return entry

    def put(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        for token, value in values.items():
            text = text.replace(token, value)
        return text

    metrics = entry.get("metrics")
    if isinstance(metrics, list):
        metrics = [{put(k): v for k, v in m.items()} if isinstance(m, dict) else put(m)
                   for m in metrics]
    return {**entry, "wdir": put(entry["wdir"]) if "wdir" in entry else ".",
            "metrics": metrics}


def _wdir(entry: Any, folder: str) -> Optional[str]:
    """The stage's working directory relative to the DVC root (None: one
    that cannot be told without DVC)."""
    wdir = entry.get("wdir", ".") if isinstance(entry, dict) else "."
    return _joined(folder, wdir)


def wdir_dvcyaml(stage: Optional[str], yamls: Mapping[str, Any]) -> Optional[str]:
    """The dvc.yaml in the stage's ``wdir`` where it is not the stage's own
    (``yamls``: parsed dvc.yaml files by path, the stage's among them)."""
    where = split_stage(stage)
    if where is None or where[0] not in yamls:
        return None
    wdir = _wdir(_stage_entry(yamls[where[0]], where[1]), posixpath.dirname(where[0]) or ".")
    found = _joined(wdir, "dvc.yaml") if wdir is not None else None
    return None if found == posixpath.normpath(where[0]) else found


def metrics_file(stage: Optional[str], yamls: Mapping[str, Any]) -> str:
    """The metrics file of a row of ``stage`` (its lineage's ``stage`` field),
    relative to the DVC root, by the module's rule. ``yamls``: dvc.yaml files
    of the row's commit, parsed (None: missing or not YAML), by path relative
    to the DVC root; a file not in it counts as missing. Pure."""
    where = split_stage(stage)
    if where is None:
        return DEFAULT_METRICS
    path, name = where
    folder = posixpath.dirname(path) or "."
    data = yamls.get(path)
    entry = _stage_entry(data, name)
    wdir = _wdir(entry, folder)
    own = _json_paths(entry.get("metrics") if entry else None, wdir)
    if own:
        return own[0]
    top = _json_paths(data.get("metrics") if isinstance(data, dict) else None, folder)
    under = [p for p in top if wdir not in (None, ".", folder) and p.startswith(wdir + "/")]
    if under or top:
        return (under or top)[0]
    there = wdir_dvcyaml(stage, yamls)
    theirs = yamls.get(there) if there is not None else None
    found = _json_paths(theirs.get("metrics") if isinstance(theirs, dict) else None, wdir)
    return found[0] if found else DEFAULT_METRICS
