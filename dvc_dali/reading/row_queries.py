"""The recorded rows as data: what `dvc-dali show` draws, for code.

    rows = dvc_dali.rows("a")                       # every row named "a", any baseline
    here = dvc_dali.current_row("checkpoint")       # the row the checkpoint output holds
    best = dvc_dali.best_row(dvc_dali.rows(run=here), "train/acc:max")  # of its run
    state = dvc_dali.load(rev=best)                 # the row itself: never ambiguous
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from .best import best_row as _best_row, parse_spec
from ..core.arguments import check_path, check_str, kind_of, shown as _shown
from ..core.checked_calls import checked_call
from ..core.errors import ArgumentError, ArgumentTypeError, DvcDaliError
from .exp_refs import (Row, baseline_and_name, exp_refs, git_dirs, outs_digest, rows_and_lineage,
                       tree_path)
from ..core.flat_keys import flat_keys
from ..core.log import logger
from .gitcmd import read_blobs
from .metrics_source import (DEFAULT_METRICS, metrics_file as declared_metrics_file,
                             safe_yaml as _safe_yaml, split_stage, wdir_dvcyaml)


def flatten_metrics(node: object) -> dict[str, float]:
    """{"train/acc": 0.9, ...}: a DVCLive metrics file's numbers but the step."""
    return flat_keys(node, sep="/", empty_as_leaf=False,
                     keep=lambda key, value: isinstance(value, (int, float)) and key != "step")


def _params(blob: bytes | None) -> dict[str, Any]:
    return flat_keys(_safe_yaml(blob))


@checked_call
def rows(exp: str | None = None, repo: str | Path | None = None,
         metrics_file: str | None = None, params: bool = True, *,
         run: Row | str | None = None) -> list[Row]:
    """The recorded checkpoint rows (what `dvc-dali show` draws).

    All, of experiment name ``exp``, or of one run. Each is a plain dict
    (``row["step"]``) with the fields `Row` lists, metrics and params
    included.

    Args:
        exp: only the rows of this experiment (run) name, on every baseline.
        repo: the repository. Default: this one; in a stage under
            `dvc exp run`, the one it records into (``DVC_ROOT``).
        metrics_file: the DVCLive metrics file of each row's metrics,
            relative to the DVC root. Default: as DVC finds metrics, the
            JSON metrics file the dvc.yaml of the row's commit declares for
            its stage (its ``metrics:``, then dvc.yaml's top-level
            ``metrics:``), else ``dvclive/metrics.json``; each row's
            ``metrics_file`` says which.
        params: ``False`` skips reading each row's params.
        run: only the rows of one run (its experiment name on its commit,
            and the commits it was resumed on): a row (from here or
            `current_row`), its ref or sha, or a row name only one row has.

    Returns:
        The rows.

    Raises:
        ConfigError: ``run`` names no recorded row, or several; a
            ``metrics_file`` outside the DVC project.
        ArgumentTypeError: an argument of another type (``exp=5``).
        DvcDaliError: git cannot read the repository's experiment refs; no
            ``repo``, and the working directory is in no DVC project.
    """
    _entry()
    _check_rows_args(exp, repo, metrics_file, params, run)
    root = rows_root(repo)
    if metrics_file is not None:
        metrics_file = os.fspath(metrics_file)
        in_project(root, metrics_file, "the metrics file")
    every, refs = _rows_and_refs(root)
    mine = [row for row, fields in every if of_project(fields.get("root"), project_of(root))]
    found = mine if run is None else run_rows(
        mine, the_row(mine, run, f"run={_label(run)}", root))
    found = [r for r in found if exp is None or r["exp"] == exp]
    every_row = [row for row, _ in every]  # a sibling project's rows are no DVC experiment
    theirs = _dvc_experiments(every_row, refs)
    # one git process for the rows' files and the dvc.lock of DVC's own experiments
    lock = tree_path(root, "dvc.lock")
    bad: list[tuple[Row, str]] = []
    locks = _read_row_files(root, found, metrics_file, params,
                            [f"{sha}:{lock}" for _, sha in theirs], bad)
    if bad and metrics_file is None:  # one given by hand: `show` says it its own way
        say_unread_metrics(bad, "the row is listed without metrics")
    mark_dvc_duplicates(root, found, refs, locks, every_row)
    return found


def project_of(root: str) -> str:
    """The DVC project at ``root`` as its rows' lineage lines say it
    (``root=``): its folder relative to the git repository's top, ``.`` at
    the top, quoted; the recorder's rows.project_address, which the reading
    layer cannot import (tests/unit/test_stage_projects.py holds them equal)."""
    rel = os.path.relpath(os.path.realpath(root), os.path.realpath(git_dirs(root)[1]))
    return quote(rel.replace(os.sep, "/"), safe="/:@")


def of_project(row_root: str | None, here: str) -> bool:
    """Whether a row whose lineage says ``row_root`` is of the project
    ``here`` (project_of). Pure. Two projects of one repository (`dvc init
    --subdir`) share its refs: `show` in one listed the other's runs, without
    their metrics (found by a sweep). A row that says none (an older
    release's) cannot tell, and is listed, as before."""
    return row_root is None or row_root == here


def project_rows(root: str) -> list[Row]:
    """The rows of the DVC project at ``root`` only (of_project), as
    list_rows gives them."""
    here = project_of(root)
    return [row for row, fields in rows_and_lineage(root) if of_project(fields.get("root"), here)]


def read_metrics(root: str, found: list[Row]) -> list[tuple[Row, str]]:
    """Each row's ``metrics_file`` and ``metrics`` into it, by the one rule
    `rows`, `dvc-dali show`, `best_row` and retention's ``keep_best`` follow
    (metrics_source.py); returns (row, why) for each row whose file is
    there but holds no metrics object (JSON of a list, a number; not JSON):
    its metrics are unknown, not absent."""
    bad: list[tuple[Row, str]] = []
    _read_row_files(root, found, None, False, [], bad)
    return bad


def say_unread_metrics(bad: list[tuple[Row, str]], then: str) -> None:
    """One line for rows whose metrics file holds no metrics object (they
    were listed without metrics and nothing said it: found by a sweep)."""
    row, why = bad[0]
    more = f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""
    logger.warning("%s of row %s%s %s, not a DVCLive metrics object: %s; fix what writes it "
                   "(dvc.yaml's metrics: declares it)", row["metrics_file"], row["name"], more,
                   why, then)


def _read_row_files(root: str, found: list[Row], metrics_file: str | None, params: bool,
                    extra: list[str], bad: list[tuple[Row, str]]) -> list[bytes | None]:
    """Each row's metrics (and params) into it; returns the blobs ``extra``
    names, and adds to ``bad`` the rows whose metrics file holds no metrics
    object. One git process: the rows' dvc.yaml files are read with
    DVCLive's default metrics file; another only for rows whose dvc.yaml
    declares a metrics file elsewhere (a third where it is the wdir's)."""
    got: dict[tuple[str, str], bytes | None] = {}
    paths: dict[str, str] = {}  # each path's place in the commits, worked out once

    def ask(pairs: list[tuple[str, str]], also: tuple[str, ...] = ()) -> list[bytes | None]:
        pairs = [p for p in dict.fromkeys(pairs) if p not in got]
        for _, path in pairs:
            if path not in paths:
                paths[path] = tree_path(root, path)
        specs = [f"{sha}:{paths[path]}" for sha, path in pairs] + list(also)
        blobs = read_blobs(root, specs) if specs else []
        got.update(zip(pairs, blobs))
        return blobs[len(pairs):]

    first = [(r["sha"], metrics_file or DEFAULT_METRICS) for r in found]
    first += [(r["sha"], "params.yaml") for r in found if params]
    if metrics_file is None:
        first += [(r["sha"], where[0]) for r in found if (where := split_stage(r["stage"]))]
    extra_blobs = ask(first, tuple(extra))
    files = ([metrics_file] * len(found) if metrics_file is not None
             else _declared_files(found, got, ask))
    ask([(r["sha"], f) for r, f in zip(found, files, strict=True)])
    for row, file in zip(found, files, strict=True):
        row["metrics_file"] = file
        row["metrics"], why = _metrics(got[(row["sha"], file)])
        if why:
            bad.append((row, why))
        if params:
            row["params"] = _params(got[(row["sha"], "params.yaml")])
    return extra_blobs


def _metrics(blob: bytes | None) -> tuple[dict[str, float], str]:
    """The metrics of a row's file, flattened, and why it holds none where
    it is there but no JSON object (the row is listed anyway)."""
    if blob is None:
        return {}, ""
    try:
        data = json.loads(blob)
    except ValueError:  # cut short, or not JSON (UnicodeDecodeError too)
        return {}, "is not JSON"
    if not isinstance(data, dict):
        return {}, f"is JSON, but {_json_kind(data)}"
    return flatten_metrics(data), ""


def _json_kind(data: object) -> str:
    """'a list', 'a number': JSON's name of a value that is no object."""
    if data is None or isinstance(data, bool):
        return json.dumps(data)
    return {list: "a list", str: "a string"}.get(type(data), "a number")


def _declared_files(found: list[Row], got: dict[tuple[str, str], bytes | None],
                    ask: Callable[[list[tuple[str, str]]], Any]) -> list[str]:
    """Each row's metrics file by metrics_source's rule, from the dvc.yaml
    files its commit holds (``got``: blobs read, by (sha, path); ``ask``
    reads more): the dvc.yaml of the stage's wdir only where the stage's
    own declares none. Decided once per stage and dvc.yaml text, not per
    row (a thousand rows share a few)."""
    texts: dict[bytes | None, Any] = {}

    def parsed(blob: bytes | None) -> Any:
        if blob not in texts:
            texts[blob] = _safe_yaml(blob)
        return texts[blob]

    own: dict[tuple[str | None, bytes | None], tuple[str, str | None]] = {}
    keys = []
    for row in found:
        where = split_stage(row["stage"])
        key = (row["stage"], got.get((row["sha"], where[0])) if where else None)
        if key not in own:
            have = {where[0]: parsed(key[1])} if where else {}
            file = declared_metrics_file(row["stage"], have)
            own[key] = (file, wdir_dvcyaml(row["stage"], have) if file == DEFAULT_METRICS
                        else None)
        keys.append(key)
    ask([(r["sha"], own[k][1]) for r, k in zip(found, keys, strict=True) if own[k][1]])
    files = []
    for row, key in zip(found, keys, strict=True):
        file, there = own[key]
        if there is not None:  # the wdir's dvc.yaml: DVCLive's section, run from there
            where = split_stage(row["stage"])
            file = declared_metrics_file(row["stage"], {
                where[0]: parsed(key[1]), there: parsed(got.get((row["sha"], there)))})
        files.append(file)
    return files


def _check_rows_args(exp: Any, repo: Any, metrics_file: Any, params: Any, run: Any) -> None:
    """rows()'s arguments of a type it does not take, named (exp=5 found no
    row without a word; repo=5 was a traceback)."""
    check_str(exp, "rows(exp", "'a' (an experiment name)")
    check_path(repo, "rows(repo", "'.'", none_ok=True)
    check_path(metrics_file, "rows(metrics_file", repr(DEFAULT_METRICS), none_ok=True)
    if not isinstance(params, bool):
        raise ArgumentTypeError(f"rows(params={_shown(params)}): must be True or False")
    if run is not None and not isinstance(run, (str, dict)):
        raise ArgumentTypeError(f"rows(run={_shown(run)}): must be a row (a dict from "
                                "dvc_dali.rows() or current_row()), its ref, sha or name, "
                                f"not {kind_of(run)}")


def _entry() -> None:
    """At each entry of the read API: a refusal that ends the script is one
    line, as `load`'s (the hook's import is light)."""
    from ..core.exit_hooks import install_hook

    install_hook()


def in_project(root: str, path: str, what: str) -> None:
    """Refuse ``path`` (a file of each row, relative to the DVC root
    ``root``) when it leads out of the project: rows hold no such file."""
    from ..core.errors import ConfigError

    top = os.path.realpath(root)  # as tree_path reads the path from it
    full = os.path.normpath(os.path.join(top, os.fspath(path)))
    if os.path.commonpath([top, full]) != top:
        raise ConfigError(f"{what} {path!r} is outside the DVC project {root}: a row holds "
                          "only the project's files; give a path relative to the project "
                          f"(default {DEFAULT_METRICS})")


def _rows_and_refs(root: str
                   ) -> tuple[list[tuple[Row, dict[str, str]]], list[tuple[str, str]]]:
    """Every row with its lineage's fields, of every project (a ref that is
    a row is never DVC's own experiment, whatever is asked), and every
    experiment ref. exp_refs refuses a repository git
    reads only in part (a broken ref); its git process runs beside
    list_rows' (two reads of refs/exps), its error first."""
    got: dict[str, Any] = {}
    reader = threading.Thread(target=_into, args=(got, exp_refs, root), daemon=True)
    reader.start()
    try:
        every = rows_and_lineage(root)
    finally:
        reader.join()
        if "error" in got:
            raise got["error"]
    return every, got["value"]


def _into(got: dict[str, Any], func: Callable[..., Any], *args: Any) -> None:
    """func(*args) on a thread: its value or its exception into ``got``."""
    try:
        got["value"] = func(*args)
    except BaseException as exc:  # handed to the caller's thread, raised there
        got["error"] = exc


def rows_root(repo: str | os.PathLike | None = None) -> str:
    """Where the rows are: ``repo``; else, in a stage under `dvc exp run`,
    the repository DVC records into (DVC_ROOT: for `--temp` and queued runs
    not the run's own, which holds no rows); else the DVC repository around
    the working directory."""
    from ..core.context import repo_root

    if repo is not None:
        return os.fspath(repo)
    env = os.environ.get("DVC_ROOT")
    if env and os.path.isdir(os.path.join(env, ".dvc")):
        return env
    root = repo_root()
    if root is None:  # a monorepo's git top, above `dvc init --subdir`: paths would miss
        raise DvcDaliError(f"not inside a DVC repository (no .dvc above {Path.cwd()}); run "
                           "inside the DVC project (the directory holding .dvc, or below "
                           "it), or pass repo=")
    return str(root)


def _label(row: object) -> str:
    return str(row.get("ref") or row.get("name")) if isinstance(row, dict) else repr(row)


def matching_rows(found: list[Row], key: object) -> list[Row]:
    """The rows ``key`` names: a row dict (by its sha), a full ref, a sha (7
    hex digits at least) or a row name (which may repeat on other baselines)."""
    if isinstance(key, dict):
        return [r for r in found if r["sha"] == key.get("sha")]
    if not isinstance(key, str) or not key:
        return []
    if key.startswith("refs/"):
        return [r for r in found if r["ref"] == key]
    named = [r for r in found if r["name"] == key]
    return named or [r for r in found if len(key) >= 7 and r["sha"].startswith(key)]


def the_row(found: list[Row], key: object, what: str, root: str) -> Row:
    """The one row ``key`` names (see :func:`matching_rows`), else ConfigError."""
    from ..core.errors import ConfigError

    named = matching_rows(found, key)
    if len(named) > 1:
        raise ConfigError(
            f"{what}: {len(named)} rows match it ({', '.join(r['ref'] for r in named)}: "
            "a run name used again on another commit); pass the row from dvc_dali.rows() "
            "or its full ref instead")
    if not named:
        raise ConfigError(f"{what}: no recorded row of {root} has this name, ref or sha; "
                          "`dvc-dali show` lists them (a pruned row is gone)")
    return named[0]


def run_rows(found: list[Row], row: Row) -> list[Row]:
    """The rows of ``row``'s run, as retention counts them: its experiment
    name on its baseline, and on the other baselines the run went on to
    when it was resumed there (rows linked by parent). Pure."""
    by_sha = {r["sha"]: r for r in found}
    same = [r for r in found if r["exp"] == row["exp"]]
    links: dict[str, set[str]] = {}
    for r in same:
        parent = by_sha.get(r["parent"] or "")
        if parent is not None and parent["exp"] == r["exp"]:
            links.setdefault(r["baseline"], set()).add(parent["baseline"])
            links.setdefault(parent["baseline"], set()).add(r["baseline"])
    seen, todo = {row["baseline"]}, [row["baseline"]]
    while todo:
        for baseline in links.get(todo.pop(), set()) - seen:
            seen.add(baseline)
            todo.append(baseline)
    return [r for r in same if r["baseline"] in seen]


@checked_call
def current_row(path: str | os.PathLike = "checkpoint", repo: str | os.PathLike | None = None
                ) -> Row | None:
    """The recorded row the checkpoint output at ``path`` holds.

    The one whose ``dvc.lock`` gives that output the md5 the stage's
    ``dvc.lock`` here gives it, at the step of the checkpoint's manifest
    (the newest such row). ``rows(run=row)`` is then the run trained there.
    The row has no ``metrics`` or ``params``: ``rows(run=row)`` reads them.

    Args:
        path: the stage's checkpoint output.
        repo: where the rows are, as for `rows` (in a stage under
            `dvc exp run`, ``--temp`` and queued runs too, ``DVC_ROOT``'s).

    Returns:
        The row, or None when the checkpoint is no recorded row (no
        ``dvc.lock`` entry yet, or a checkpoint written since). Check it:
        ``rows(run=None)`` is every row.

    Raises:
        ArgumentTypeError: ``path`` or ``repo`` is not a path.
    """
    _entry()
    check_path(path, "current_row(path", "'checkpoint'")
    check_path(repo, "current_row(repo", "'.'", none_ok=True)
    ckpt = Path(os.path.realpath(path))
    entry = _lock_entry(ckpt)
    if entry is None:
        return None
    lock, stage, out, md5 = entry
    root, step = rows_root(repo), _checkpoint_step(ckpt)
    found = [r for r in project_rows(root) if step is None or r["step"] == step]
    rel = tree_path(root, str(lock))
    blobs = read_blobs(root, [f"{r['sha']}:{rel}" for r in found])
    hits = [r for r, blob in zip(found, blobs, strict=True)
            if blob is not None and _out_md5(blob, stage, out) == md5]
    return max(hits, key=lambda r: (r["time"], r["step"])) if hits else None


def _checkpoint_step(ckpt: Path) -> int | None:
    """The step of the checkpoint at ``ckpt``; None where none is readable."""
    from ..format import store

    try:
        entries = store.latest(ckpt)
        return store.read_manifest(ckpt / entries[0][0], entries[0][1])["step"] if entries \
            else None
    except (DvcDaliError, OSError, KeyError):
        return None


def _lock_yaml(text: bytes | str | None) -> dict[str, Any]:
    """The stages of a dvc.lock; {} when it does not parse (no match)."""
    data = _safe_yaml(text)
    stages = data.get("stages") if isinstance(data, dict) else None
    return stages if isinstance(stages, dict) else {}


def _out_md5(text: bytes | str, stage: str, out: str) -> str | None:
    """The md5 a dvc.lock gives output ``out`` of ``stage``."""
    entry = _lock_yaml(text).get(stage)
    for item in (entry.get("outs") or []) if isinstance(entry, dict) else []:
        if isinstance(item, dict) and item.get("path") == out:
            return item.get("md5")
    return None


def _lock_entry(ckpt: Path) -> tuple[str, str, str, str] | None:
    """(dvc.lock relative to its DVC repository, stage, output path, md5) of
    the stage whose outputs hold ``ckpt``, from the nearest dvc.lock above it."""
    from ..core.context import repo_root

    top = repo_root(ckpt.parent)
    if top is None:
        return None
    for folder in (ckpt.parent, *ckpt.parent.parents):
        lock = folder / "dvc.lock"
        stages = _lock_yaml(lock.read_bytes()) if lock.is_file() else {}
        for stage, entry in stages.items():
            for item in (entry.get("outs") or []) if isinstance(entry, dict) else []:
                if isinstance(item, dict) and isinstance(item.get("path"), str) and \
                        Path(os.path.realpath(folder / item["path"])) == ckpt and \
                        item.get("md5"):
                    return (os.path.relpath(lock, top), stage, item["path"], item["md5"])
        if folder == top:
            break
    return None


def _lock_outs(blob: bytes | None) -> set[str]:
    """The outs digests (as rows' lineage records them) of a dvc.lock's stages."""
    return {outs_digest(entry) for entry in _lock_yaml(blob or None).values()
            if isinstance(entry, dict) and entry.get("outs")}


def _dvc_experiments(every: list[Row], refs: list[tuple[str, str]]
                     ) -> list[tuple[str, str]]:
    """The refs under refs/exps that are not rows (DVC's own experiments);
    ``every``: all the rows, not only those asked for."""
    shas, names = {r["sha"] for r in every}, {r["ref"] for r in every}
    return [(ref, sha) for ref, sha in refs if sha not in shas and ref not in names]


def newest_row(rows: list[Row], parents: set[str | None]) -> Row:
    """The newest of ``rows`` (``parents``: every row's parent). Commit times
    have whole seconds: where they tie, the end of a chain of rows beats its
    parents, then the higher step wins."""
    return max(rows, key=lambda r: (r["time"], r["sha"] not in parents, r["step"]))


def dvc_matches(every: list[Row], theirs: list[tuple[str, set[str]]]) -> dict[str, list[str]]:
    """{row sha: names of DVC's experiments it is}: ``theirs`` (each DVC
    experiment's ref, and the outs digests of its dvc.lock) against ``every``
    row. Only rows on the experiment's baseline with its outputs; of those,
    its own run's (the same name) if any; of them the newest, one row. Pure."""
    parents = {r["parent"] for r in every}
    matched: dict[str, list[str]] = {}
    for ref, digests in theirs:
        where = baseline_and_name(ref)
        if where is None:
            continue
        same = [r for r in every if r["baseline"] == where[0] and r.get("outs") in digests]
        same = [r for r in same if r["exp"] == where[1]] or same
        if same:
            row = newest_row(same, parents)
            matched.setdefault(row["sha"], []).append(where[1])
    return matched


def mark_dvc_duplicates(root: str, found: list[Row],
                        refs: list[tuple[str, str]],
                        locks: list[bytes | None] | None = None,
                        every: list[Row] | None = None) -> None:
    """DVC's own experiment of an invocation (`dvc exp run -n NAME` commits it
    when the run ends) holds the same outputs as the run's last row: name it
    on that row ("dvc_experiments"), so the two are not taken for two states.
    ``locks``: their dvc.lock files, already read (else read here);
    ``every``: all the rows (default ``found``), ``found`` among them."""
    every = found if every is None else every
    theirs = _dvc_experiments(every, refs)
    if locks is None:
        lock = tree_path(root, "dvc.lock")
        locks = read_blobs(root, [f"{sha}:{lock}" for _, sha in theirs])
    matched = dvc_matches(every, [(ref, _lock_outs(blob))
                                  for (ref, _), blob in zip(theirs, locks, strict=True)])
    for row in found:
        row["dvc_experiments"] = sorted(set(matched.get(row["sha"], [])))


@checked_call
def best_row(found: list[Row], spec: str) -> Row | None:
    """The best row by a metric.

    The row with the highest (``metric:max``) or lowest (``metric:min``)
    metric; the later step on a tie; rows without the metric, or with NaN,
    are no candidates. The one rule retention's ``keep_best`` and
    `dvc-dali show --best` follow too (``dvc_dali/reading/best.py``).

    Args:
        found: rows from `rows`.
        spec: ``"<metric>:max"`` or ``"<metric>:min"``, the metric as
            `dvc-dali show` prints it (``train/acc``).

    Returns:
        The best row, or None when no row has the metric.

    Raises:
        ArgumentError: a ``spec`` without ``:max`` or ``:min`` (a
            `ConfigError`, and a ``ValueError``).
        ArgumentTypeError: ``found`` is not a list of rows; ``spec`` is
            not a str.
    """
    _entry()
    found = _rows_arg(found, spec)
    parse_spec(spec, "best_row(spec", ArgumentError if isinstance(spec, str) else ArgumentTypeError)
    return _best_row(found, spec)


def _rows_arg(found: Any, spec: Any) -> list[Row]:
    """best_row's rows as a list; refused naming the argument unless they are
    rows (dicts): the arguments swapped, a string, a single row."""
    example = f"best_row(dvc_dali.rows(), {spec if isinstance(spec, str) else 'acc:max'!r})"
    if isinstance(found, (str, bytes, dict)) or not hasattr(found, "__iter__"):
        raise ArgumentTypeError(f"best_row(found={_shown(found)}): must be a list of rows "
                                f"(from dvc_dali.rows()), not {kind_of(found)}: {example}")
    found = list(found)
    for i, row in enumerate(found):
        if not isinstance(row, dict):
            raise ArgumentTypeError(f"best_row(found): item {i} is {kind_of(row)}, not a row "
                                    f"(a dict from dvc_dali.rows()): {example}")
    return found
