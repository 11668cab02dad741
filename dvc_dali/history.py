"""The recorded rows as data: what `dvc-dali show` draws, for code.

    rows = dvc_dali.rows("a")                       # every row of run "a"
    best = dvc_dali.best_row(rows, "train/acc:max")
    state = dvc_dali.load(rev=best["name"])
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from .context import parse_keep_best
from .errors import DvcDaliError

DEFAULT_METRICS = "dvclive/metrics.json"


def flatten_metrics(node: object, prefix: str = "") -> dict[str, float]:
    """{"train/acc": 0.9, ...}: a DVCLive metrics file's numbers but the step."""
    flat: dict[str, float] = {}
    for key, value in (node.items() if isinstance(node, dict) else []):
        if isinstance(value, dict):
            flat.update(flatten_metrics(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and key != "step":
            flat[f"{prefix}{key}"] = value
    return flat


def parse_batch(out: bytes, count: int) -> list[bytes | None]:
    """The ``count`` answers of `git cat-file --batch`: a blob's bytes, or None
    for an object that is missing, ambiguous or not a blob."""
    found: list[bytes | None] = []
    pos = 0
    for _ in range(count):
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        pos = end + 1
        if len(header) == 3 and header[2].isdigit():  # <oid> <type> <size>, then the bytes
            size = int(header[2])
            found.append(out[pos:pos + size] if header[1] == b"blob" else None)
            pos += size + 1
        else:  # "<name> missing" / "<name> ambiguous"
            found.append(None)
    return found


def read_blobs(root: str, specs: list[str]) -> list[bytes | None]:
    """Every "<sha>:<path>" in ``specs`` read by one git process (one
    `git show` per row took seconds for a thousand rows)."""
    if not specs:
        return []
    try:
        proc = subprocess.run(["git", "cat-file", "--batch"], cwd=root, capture_output=True,
                              input="".join(f"{s}\n" for s in specs).encode(), check=False)
    except OSError as exc:
        raise DvcDaliError(f"cannot run git in {root}: {exc}") from None
    if proc.returncode != 0:
        raise DvcDaliError(f"`git cat-file --batch` failed in {root} (exit {proc.returncode}): "
                           f"{proc.stderr.decode(errors='replace').strip()}")
    return parse_batch(proc.stdout, len(specs))


def _flatten_params(node: object, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in (node.items() if isinstance(node, dict) else []):
        if isinstance(value, dict) and value:
            flat.update(_flatten_params(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _params(blob: bytes | None) -> dict[str, Any]:
    if blob is None:
        return {}
    from ruamel.yaml import YAML  # DVC's own YAML library; "safe" builds plain data only

    try:
        return _flatten_params(YAML(typ="safe", pure=True).load(blob.decode()))
    except Exception:  # a params file that does not parse: list the row anyway
        return {}


def rows(exp: str | None = None, repo: str | Path | None = None,
         metrics_file: str = DEFAULT_METRICS, params: bool = True) -> list[dict[str, Any]]:
    """The recorded checkpoint rows of the repository at ``repo`` (default:
    the one around the working directory), of run ``exp`` or all: each a
    dict with name, exp, step, parent (sha), sha, baseline, time, metrics
    (flattened DVCLive metrics), params (the row's params.yaml, flattened
    "train.lr"; ``params=False`` skips reading them) and dvc_experiments
    (DVC's own experiments holding the same outputs: the ref `dvc exp run`
    commits when it ends)."""
    from .context import repo_root
    from .recording import list_rows
    from .recording.remove import exp_refs

    root = str(Path(repo) if repo is not None else (repo_root() or Path.cwd()))
    refs = exp_refs(root)  # refuses a repository git reads only in part (a broken ref)
    found = list_rows(root, exp)
    files = (metrics_file, "params.yaml") if params else (metrics_file,)
    blobs = read_blobs(root, [f"{r['sha']}:{p}" for r in found for p in files])
    for i, row in enumerate(found):
        metrics = blobs[len(files) * i]
        try:
            row["metrics"] = flatten_metrics(json.loads(metrics)) if metrics is not None else {}
        except ValueError:  # a metrics file cut short or not JSON: list the row anyway
            row["metrics"] = {}
        if params:
            row["params"] = _params(blobs[len(files) * i + 1])
    mark_dvc_duplicates(root, found, refs)
    return found


def _lock_outs(blob: bytes | None) -> set[str]:
    """The outs digests (as rows' lineage records them) of a dvc.lock's stages."""
    from ruamel.yaml import YAML

    from .recording.rows import outs_digest

    try:
        data = YAML(typ="safe", pure=True).load(blob.decode()) if blob else None
        return {outs_digest(entry) for entry in (data.get("stages") or {}).values()
                if isinstance(entry, dict) and entry.get("outs")}
    except Exception:  # not a dvc.lock we can read: no match
        return set()


def mark_dvc_duplicates(root: str, found: list[dict[str, Any]],
                        refs: list[tuple[str, str]]) -> None:
    """DVC's own experiment of an invocation (`dvc exp run -n NAME` commits it
    when the run ends) holds the same outputs as the run's last row: name it
    on that row ("dvc_experiments"), so the two are not taken for two states."""
    shas = {r["sha"] for r in found}
    theirs = [(ref, sha) for ref, sha in refs if sha not in shas]
    blobs = read_blobs(root, [f"{sha}:dvc.lock" for _, sha in theirs])
    by_outs: dict[str, list[str]] = {}
    for (ref, _), blob in zip(theirs, blobs, strict=True):
        for digest in _lock_outs(blob):
            by_outs.setdefault(digest, []).append(ref.rsplit("/", 1)[-1])
    for row in found:
        row["dvc_experiments"] = sorted(set(by_outs.get(row.get("outs") or "", [])))


def best_row(found: list[dict[str, Any]], spec: str) -> dict[str, Any] | None:
    """The row with the highest (``metric:max``) or lowest (``metric:min``)
    metric; the later step where they tie; None when no row has it."""
    parse_keep_best(spec, "best")  # the same '<metric>:max|min' form, checked
    metric, _, mode = spec.rpartition(":")
    scored = [r for r in found if isinstance(r.get("metrics", {}).get(metric), (int, float))]
    if not scored:
        return None
    sign = 1 if mode == "max" else -1
    return max(scored, key=lambda r: (sign * r["metrics"][metric], r["step"], r["time"]))
