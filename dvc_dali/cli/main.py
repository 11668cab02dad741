"""The `dvc-dali` command: init, show, run, remove, push, pull, reset, doctor."""

from __future__ import annotations

import argparse
import codecs
import json
import os
import shlex
import shutil
import signal as signals
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from .._version import __version__
from ..core.context import SIGNAL_NAME
from ..core.errors import ConfigError, DvcDaliError, readable
from ..core.log import logger
from ..reading.exp_refs import Row
from ..reading.gitcmd import (  # noqa: F401 (the `show` tests parse git's answers through it)
    parse_batch,
)
from ..reading.best import parse_spec
from ..reading.row_queries import best_row, newest_row, rows as recorded_rows
from . import inputs
from ..reading.metrics_source import DEFAULT_METRICS

TEMPLATES = ("dvc.yaml", "train.py", "params.yaml")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _message(exc: BaseException) -> str:
    """The error's text without a prefix of its own: main adds "dvc-dali CMD: ".
    An OSError's as people read it: the path and the reason, not ``[Errno 2]
    ... 'x\\udcff'``."""
    if isinstance(exc, OSError) and exc.strerror:
        names = [os.fsdecode(n) for n in (exc.filename, exc.filename2) if n is not None]
        return readable(": ".join(names + [exc.strerror]))
    text = readable(str(exc))
    for prefix in ("dvc_dali: ", "dvc-dali: "):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def _project_root(cmd: str) -> Path:
    from ..core.context import repo_root

    root = repo_root()
    if root is None:
        raise DvcDaliError(f"not inside a DVC repository (no .dvc above {Path.cwd()}); run "
                           f"`dvc-dali {cmd}` in the project")
    return root


def cmd_init(args: argparse.Namespace) -> int:
    dest = Path(args.dir)
    blocked = _init_blocked(dest)
    if blocked:
        print(f"dvc-dali init: {blocked}; nothing written.", file=sys.stderr)
        return 1
    source = Path(__file__).parent.parent / "templates"  # dvc_dali/templates
    # `init` then `init --digits` (as init's last line says): the untouched
    # templates are no obstacle, only the samples are written
    existing = [name for name in TEMPLATES if os.path.lexists(dest / name)  # a link too
                and not (args.digits and _same_file(dest / name, source / name))]
    if args.digits and (dest / "data" / "images").exists():
        existing.append("data/images")  # the user's own images are never mixed with samples
    if existing and not args.force:
        print(f"dvc-dali init: {', '.join(str(dest / n) for n in existing)} already "
              f"exist{'s' if len(existing) == 1 else ''}; nothing written. Use --force to "
              "overwrite them.", file=sys.stderr)
        return 1
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"dvc-dali init: cannot make the directory {dest}: {exc.strerror}; give one you "
              "can write; nothing written.", file=sys.stderr)
        return 1
    for name in TEMPLATES:
        print(f"wrote {dest / name}{_write_template(source / name, dest / name)}")
    there = "" if dest.resolve() == Path.cwd().resolve() else f"cd {shlex.quote(args.dir)} && "
    setup = f"{there}{setup_commands(dest)}git add . && git commit -m start && dvc exp run"
    if args.digits:
        from .sample_images import write_digits

        images = dest / "data" / "images"
        print(f"wrote {write_digits(images)} sample images to {images}/<digit>/")
        print(f"next: `{setup}`")
    else:
        digits = "dvc-dali init --digits" + (f" {shlex.quote(args.dir)}" if there else "")
        print(f"next: put images in data/images/<class>/ (or `{digits}` for samples), then "
              f"`{setup}`")
    return 0


def _write_template(source: Path, path: Path) -> str:
    """Write one template at path; a link there is replaced, never written
    through: its target may be anywhere (a dangling one's is a file of another
    name, or a directory that is not there). Says what it replaced."""
    replaced = ""
    if path.is_symlink():
        replaced = f" (replacing the link to {readable(os.readlink(path))})"
        path.unlink()
    shutil.copyfile(source, path)
    return replaced


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.read_bytes() == b.read_bytes()
    except OSError:
        return False


def _init_blocked(dest: Path) -> str:
    """What no --force can write over, found before anything is written (a
    template half written is worse than none): "" when nothing is."""
    there = next((d for d in (dest, *dest.parents) if d.exists()), None)
    if there is not None and not there.is_dir():
        return f"{there} is a file, not a directory: give the project's directory"
    dirs = [str(dest / name) for name in TEMPLATES  # a link to one is replaced, not written in
            if (dest / name).is_dir() and not (dest / name).is_symlink()]
    if dirs:
        return f"{', '.join(dirs)}: a directory where the template writes a file; move it away"
    return ""


def setup_commands(dest: Path) -> str:
    """What a directory still needs before `dvc exp run` can run its stage:
    "git init && " outside a git work tree, "dvc init && " outside a DVC
    project ("" for neither)."""
    here = dest.resolve()
    above = [here, *here.parents]
    git_at = next((d for d in above if (d / ".git").exists()), None)
    needed = [] if git_at else ["git init"]
    if not any((d / ".dvc").is_dir() for d in above):  # --subdir: below the git top
        needed.append("dvc init" + (" --subdir" if git_at not in (None, here) else ""))
    return "".join(f"{command} && " for command in needed)


# --------------------------------------------------------------------------
# show
# --------------------------------------------------------------------------


def _in_step_order(rows: list[Row]) -> Callable[[dict], tuple]:
    """The sort key of a run's rows: by step; rows of one step in recording
    order (by time, then a row after its ancestors: times have whole seconds)."""
    by_sha = {r["sha"]: r for r in rows}
    ancestors: dict[str, int] = {}
    for r in rows:
        seen, node = set(), r
        while node["parent"] in by_sha and node["parent"] not in seen:
            seen.add(node["parent"])
            node = by_sha[node["parent"]]
        ancestors[r["sha"]] = len(seen)
    return lambda r: (r["step"], r["time"], ancestors.get(r["sha"], 0), r["name"])


def group_runs(rows: list[Row]) -> list[list[Row]]:
    """Rows per run (experiment name, baseline and stage: one `dvc exp run`
    of two checkpoint stages names both stages' runs alike, and the recorder
    keeps a lineage per stage), the run with the newest row first, each run's
    rows by step; the newest row of each marked ``latest``
    (row_queries.newest_row)."""
    runs: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        runs.setdefault((row["exp"], row["baseline"] or "", row.get("stage") or ""),
                        []).append(row)
    groups = [sorted(part, key=_in_step_order(part))
              for mine in runs.values() for part in _lineages(mine)]
    parents = {r["parent"] for r in rows}
    for mine in groups:
        newest = newest_row(mine, parents)
        for row in mine:
            row["latest"] = row is newest
    groups.sort(key=lambda g: (-max(r["time"] for r in g), g[0]["exp"], g[0]["baseline"] or "",
                           g[0].get("stage") or ""))
    return groups


def _lineages(rows: list[Row]) -> list[list[Row]]:
    """A run's rows per lineage: a run started again from step 0 under the
    same name (`dvc exp run -f -n NAME`) is a run of its own, not drawn as if
    it went on from the first. A row whose parent is gone (`dvc exp remove`
    of a middle row) stays with the rest."""
    by_sha = {r["sha"]: r for r in rows}
    parts: dict[str | None, list[Row]] = {}
    for r in rows:
        node, seen = r, set()
        while node["parent"] in by_sha and node["sha"] not in seen:
            seen.add(node["sha"])
            node = by_sha[node["parent"]]
        root = node["sha"] if node["parent"] is None else None  # None: a row removed above
        parts.setdefault(root, []).append(r)
    cut = parts.pop(None, [])
    if cut:  # rows cut from their lineage: after the lineage that ends before them
        start = min(r["time"] for r in cut)
        before = [k for k, part in parts.items() if max(r["time"] for r in part) <= start]
        if before:
            parts[max(before, key=lambda k: max(r["time"] for r in parts[k]))] += cut
        else:
            parts[None] = cut
    chains = [part for part in parts.values() if len(part) > 1]
    if len(chains) < 2:  # one lineage, or rows without one (a list by step): one run
        return [rows]
    loose = [r for part in parts.values() if len(part) == 1 for r in part]
    min(chains, key=lambda part: min(r["time"] for r in part)).extend(loose)
    return chains


# the tree's glyphs; ASCII where the output cannot encode them (_fit_output)
GLYPHS = {"tee": "├─", "end": "└─", "bar": "│ ", "latest": "←", "best": "★"}
ASCII_GLYPHS = {"tee": "|-", "end": "`-", "bar": "| ", "latest": "<-", "best": "*"}


def _fit_output() -> None:
    """Where stdout cannot encode the tree's glyphs (PYTHONIOENCODING=ascii,
    a locale that is not UTF-8), they are drawn in ASCII and any other
    character it cannot encode (a row or metric name) is escaped: `show`
    ended in a traceback (found by a sweep). A path that is not UTF-8 in a
    line, on stdout or stderr: its bytes as \\xNN, as in every message, not
    \\udcNN; on stdout `init`'s lines printed the raw byte, or a strict
    UTF-8 stdout (a UTF-8 locale other than C.UTF-8) ended `init` in a
    traceback after its first template (found by a sweep)."""
    try:
        "".join(GLYPHS.values()).encode(getattr(sys.stdout, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        GLYPHS.update(ASCII_GLYPHS)
    codecs.register_error("dvc_dali.readable", _readable_chars)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="dvc_dali.readable")


def _readable_chars(err: UnicodeError) -> tuple[str, int]:
    """An error handler: a byte of a name that is not UTF-8 (a lone
    surrogate) as \\xNN, any other character the stream cannot encode as
    backslashreplace writes it."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    chunk = err.object[err.start:err.end]
    return "".join(readable(c) if "\udc80" <= c <= "\udcff" else
                   c.encode("ascii", "backslashreplace").decode() for c in chunk), err.end


def draw_tree(rows: list[Row]) -> list[str]:
    """A run's checkpoints as a tree by step, oldest first; a branch where a
    run resumed from an older checkpoint of its own. A run whose steps went
    back (``make_checkpoint(3)`` after 5) is drawn as a list by step, rows of
    one step in recording order. The last row of the run, and of each
    branch, is drawn with └─."""
    by_sha = {r["sha"]: r for r in rows}
    order = _in_step_order(rows)
    back = any(r["step"] < by_sha[r["parent"]]["step"] for r in rows if r["parent"] in by_sha)
    children: dict[str | None, list[Row]] = {}
    for r in rows:
        parent = r["parent"] if r["parent"] in by_sha and not back else None
        children.setdefault(parent, []).append(r)
    drawn: list[tuple[int, str]] = []  # (depth, the row's text)

    def chain(start: dict, depth: int) -> None:
        node: dict | None = start
        while node is not None:
            kids = sorted(children.get(node["sha"], []), key=order)
            metrics = "  ".join(f"{k}={v:.4g}" for k, v in sorted(node["metrics"].items()))
            same = ", ".join(node.get("dvc_experiments") or [])
            mark = (f"  {GLYPHS['latest']} latest" if node.get("latest") else "") + (
                f"  {GLYPHS['best']} best" if node.get("best") else "") + (
                f"  (= DVC's experiment {same})" if same else "")
            drawn.append((depth, f"step {node['step']:>7}  {node['name']:<28} "
                                 f"{node['sha'][:7]}  {metrics}".rstrip() + mark))
            for branch in kids[1:]:
                chain(branch, depth + 1)
            node = kids[0] if kids else None

    for root in sorted(children.get(None, []), key=order):
        chain(root, 0)
    lines = []
    for i, (depth, text) in enumerate(drawn):
        # the last of its level: no later row at this depth before one nearer the root
        after = next((d for d, _ in drawn[i + 1:] if d <= depth), -1)
        lines.append(f"{GLYPHS['bar'] * depth}{GLYPHS['tee' if after == depth else 'end']} "
                     f"{text}")
    return lines


def render(groups: list[list[Row]], names: dict[str, str]) -> list[str]:
    """``group_runs``'s runs as text; ``names``: every row's name by sha, to
    say which run a run resumed from."""
    lines = []
    for mine in groups:
        own = {m["name"] for m in mine}
        origin = [names[r["parent"]] for r in mine
                  if r["parent"] in names and names[r["parent"]] not in own]
        resumed = f", resumed from {origin[0]}" if origin else ""
        baseline = (mine[0]["baseline"] or "")[:7]
        stage = f"stage {mine[0]['stage']}, " if _stage_told(mine, groups) else ""
        lines.append(f"{mine[0]['exp']}  ({stage}baseline {baseline}, "
                     f"{_plural(len(mine), 'checkpoint')}{resumed})")
        lines.extend(draw_tree(mine))
    return lines


def _stage_told(mine: list[Row], groups: list[list[Row]]) -> bool:
    """Whether a run's header names its stage: where another run of its name
    is of another stage (one `dvc exp run` of a pipeline, or a `foreach`, runs
    each checkpoint stage under the experiment's name: `show` drew trees of
    one name, no stage said; found by a sweep). Pure."""
    exp, stage = mine[0]["exp"], mine[0].get("stage")
    return stage is not None and any(g[0]["exp"] == exp and g[0].get("stage") != stage
                                     for g in groups)


def _metrics_problem(root: str, rows: list[Row], path: str) -> tuple[str, bool]:
    """Why no row shows a metric from --metrics-file ``path``, and whether
    that refuses the listing (inputs.metrics_problem): the rows' copies are
    read (one git process) only when none has metrics. A file they hold
    that is no metrics file (dvc.yaml, a binary file) listed the rows
    without metrics and said nothing (found by a bad-input sweep)."""
    from ..reading.exp_refs import tree_path
    from ..reading.gitcmd import read_blobs

    if any(r.get("metrics") for r in rows):
        return "", False
    rel = tree_path(root, path)
    return inputs.metrics_problem(path, read_blobs(root, [f"{r['sha']}:{rel}" for r in rows]),
                                  Path(root, path).is_dir())


def _metrics_read(rows: list[Row]) -> str:
    """Where the rows' metrics were read, found as DVC finds them (no
    --metrics-file): `show` lists rows of a stage whose dvc.yaml declares
    another file with that file's metrics (they had none: found by a sweep)."""
    files = list(dict.fromkeys(r["metrics_file"] for r in rows))
    if files == [DEFAULT_METRICS]:
        return (f"read from {DEFAULT_METRICS} at the repository's root, as no dvc.yaml of "
                "theirs declares a JSON metrics file")
    return f"read from {', '.join(files)}, as dvc.yaml declares them"


def _metrics_note(rows: list[Row], given: str | None) -> list[str]:
    """One line under the rows where their metrics are not DVCLive's default
    file at the root: which file (or files) dvc.yaml made `show` read."""
    if given or all(r["metrics_file"] == DEFAULT_METRICS for r in rows):
        return []
    return [f"metrics {_metrics_read(rows)} (--metrics-file reads another)"]


def _row_named(root: str, name: str) -> str:
    """Where ``name`` is a row's name, not a run's (found by a sweep: `show`
    said only that no run had it), which run it is of."""
    from ..reading.row_queries import project_rows

    runs = sorted({row["exp"] for row in project_rows(root) if row.get("name") == name})
    if not runs:
        return ""
    return (f"{name!r} is a row of run {', '.join(map(repr, runs))} (`dvc-dali show "
            f"{runs[0]}` shows that run); ")


def cmd_show(args: argparse.Namespace) -> int:
    root = str(_project_root("show"))
    if args.best is not None:  # named as given (it was best='acc:maxx'), before any git
        parse_spec(args.best, "--best")
    # no --metrics-file: each row's as its dvc.yaml declares, as `dvc exp show` finds them
    rows = recorded_rows(args.exp, root, args.metrics_file, params=args.json)
    problem, refused = (_metrics_problem(root, rows, args.metrics_file)
                        if args.metrics_file and rows else ("", False))
    if problem:
        print(f"dvc-dali show: {problem}", file=sys.stderr)
        if refused:
            return 1
    best = best_row(rows, args.best) if args.best else None
    if best is not None:
        best["best"] = True
    if not rows and args.exp:
        print(f"dvc-dali show: no checkpoints recorded for an experiment named {args.exp!r}; "
              f"{_row_named(root, args.exp)}`dvc-dali show` lists those recorded",
              file=sys.stderr)
        return 1
    groups = group_runs(rows)
    if args.json:
        print(json.dumps([row for mine in groups for row in mine], indent=2))
    elif not rows:
        print("no dvc-dali checkpoints recorded yet")
    else:
        print("\n".join(render(groups, {r["sha"]: r["name"] for r in rows})
                        + _metrics_note(rows, args.metrics_file)))
    if args.best and not args.json and best is not None:
        metric = args.best.rpartition(":")[0]
        print(f"best by {args.best}: {best['name']} (step {best['step']}, {metric}="
              f"{best['metrics'][metric]:.4g}); load it with dvc_dali.load(rev="
              f"{best.get('ref') or best['name']!r})")
    elif args.best and rows and best is None:  # unanswerable: as for an unknown experiment
        metric = args.best.rpartition(":")[0]
        known = sorted({m for r in rows for m in r.get("metrics", {})})
        where = "" if known or args.metrics_file else (
            f"; they were {_metrics_read(rows)}: another file takes --metrics-file <its path>")
        print(f"dvc-dali show: --best {args.best}: no row has {metric} (their metrics: "
              f"{', '.join(known) or 'none'}; nested names take '/', as train/acc{where})",
              file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------
# run, remove, reset
# --------------------------------------------------------------------------


def _checkpoint_step(path: Path) -> int | None:
    """The step of the checkpoint at ``path``, where dvc-dali wrote it; None
    for one it did not (a DVC 2 script's own files: DVC 2's signal file says
    no step either), which the recorder numbers on from the row it follows,
    with a start of its own (rows.first_row_follows: cannot tell)."""
    from ..format import store

    try:
        found = store.latest(path)
        return store.read_manifest(path / found[0][0], found[0][1])["step"] if found else None
    except DvcDaliError:
        return None


def _run_options(args: argparse.Namespace, program: str) -> tuple[int | None, str | None]:
    """--keep-last, --keep-best, --checkpoint and the command's program,
    refused alike in and out of `dvc exp run`, before the command starts
    (outside, they passed silently, and a missing program was Python's
    errno text: found by a bad-input sweep)."""
    from ..core.context import repo_root

    found = repo_root()
    kept = inputs.run_options(args.keep_last, args.keep_best, args.checkpoint,
                              None if found is None else str(found))
    problem = inputs.command_problem(program, os.environ.get("PATH", os.defpath))
    if problem:
        raise ConfigError(problem)
    return kept


def _start(command: list[str], env: dict | None = None) -> subprocess.Popen:
    try:
        return subprocess.Popen(command, env=env)
    except OSError as exc:  # what _run_options cannot see: a script without #!
        raise ConfigError(f"{command[0]!r} ({inputs.COMMAND}) cannot be started: "
                          f"{exc.strerror}; a script needs a #! line, or name its "
                          "interpreter first (`dvc-dali run -- bash train.sh`)") from None


def cmd_run(args: argparse.Namespace) -> int:
    from ..core.context import RECORDS_ITSELF, RunContext
    from ..core.record_request import RecordRequest
    from ..recording import pipeline as recording
    from ..training.signal_file import in_repo, remove_stale

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("dvc-dali run: give the training command after --, e.g. "
              "`dvc-dali run -- ./train --steps 100`", file=sys.stderr)
        return 2
    keep_last, keep_best = _run_options(args, command[0])
    ctx = RunContext.from_environ()
    if ctx.mode != "record":
        print("dvc-dali run: not under DVC 3's `dvc exp run` (or DVC 2 records itself); "
              "running the command without recording", file=sys.stderr)
        return _start(command).wait()  # (the group's Ctrl-C reaches the command too)
    keep = ctx.retention(keep_last, keep_best)
    checkpoint = Path(args.checkpoint)
    # before the child reads its checkpoint: carried into a --temp/queued run,
    # an unchanged rerun of an applied row refused
    branched = recording.start_bare_run(ctx, str(checkpoint))
    root = _project_root("run")
    sig = in_repo(root)
    remove_stale(sig)
    # The child sees DVC 2's protocol; DVC_ROOT is this run's own repository,
    # so parallel --temp/queued runs each watch their own signal file.
    env = {**os.environ, SIGNAL_NAME: "1", "DVC_ROOT": str(root),
           "DVC_DALI_SIGNAL_FILE": str(sig)}
    env.pop(RECORDS_ITSELF, None)  # this process records, not the child
    child = _start(command, env)
    # Not passed on: they reach the command through the process group, as
    # under DVC 2 (twice when passed on too: found by a sweep); outlived, so
    # that the last checkpoint it signals is recorded, then said
    came: list[int] = []
    for sig_num in (signals.SIGINT, signals.SIGTERM):
        signals.signal(sig_num, lambda n, _f: came.append(n))

    def record() -> None:  # record_and_prune logs the row it recorded
        recording.record_and_prune(ctx, RecordRequest(
            _checkpoint_step(checkpoint), out=str(checkpoint), branched=branched), keep)
        sig.unlink(missing_ok=True)

    try:
        _answer_until_done(child, sig, record)
        _say_kept(came)
    except BaseException:
        # As DVC 2 did when a checkpoint failed: the command is killed (it
        # would wait for the signal file to go for ever), the signal removed.
        if child.poll() is None:
            child.kill()
            child.wait()
            print(f"dvc-dali run: the training command (pid {child.pid}) was killed: its "
                  "checkpoint could not be recorded (below)", file=sys.stderr)
        sig.unlink(missing_ok=True)
        raise
    return child.returncode


def _answer_until_done(child: subprocess.Popen, sig: Path, record: Callable[[], None]) -> None:
    """Record each checkpoint the command signals, until it ends."""
    while child.poll() is None:
        if sig.exists():
            record()
        time.sleep(0.01)
    if sig.exists():  # signalled, then died while waiting: the checkpoint is complete
        record()


def _say_kept(came: list[int]) -> None:
    """After a Ctrl-C or SIGTERM: which step is kept, as which row. This
    process recorded the rows; its command, waiting on DVC 2's protocol,
    said none was (found by a sweep) and now says nothing."""
    from ..core import exit_hooks

    if came:
        how = "interrupted (Ctrl-C)" if came[0] == signals.SIGINT else "terminated (SIGTERM)"
        logger.warning(exit_hooks.interruption_line(how, exit_hooks.last_kept()))


def cmd_remove(args: argparse.Namespace) -> int:
    from ..recording.remove import remove_runs

    root = str(_project_root("remove"))
    for gone in remove_runs(root, args.exp):
        rows = f"{_plural(gone.rows, 'row')} of {gone.exp}"
        also = f" and DVC's experiment {gone.exp}" if gone.dvc_ref else ""
        print(f"removed {rows}{also} (baseline {gone.baseline[:7]})")
    print("their data stays in the DVC cache until `dvc gc` removes it")
    return 0


def _git_remote(root: Path, args: argparse.Namespace, verb: str) -> str:
    """The project's root, once the git remote is one git can try: a name no
    remote has (a typo) failed only after the data moved, in git's words
    (found by a bad-input sweep)."""
    from ..reading import gitcmd

    configured = gitcmd.run(["remote"], str(root), check=False, unrunnable=DvcDaliError)
    problem = inputs.git_remote_problem(args.git_remote, configured.stdout.split(), os.getcwd())
    if problem:
        runs = ", ".join(map(shlex.quote, dict.fromkeys(args.exp)))
        raise ConfigError(f"{problem}; nothing {verb} of {runs}")
    return str(root)


def cmd_push(args: argparse.Namespace) -> int:
    from ..recording.share import push_runs

    root = _git_remote(_project_root("push"), args, "pushed")
    for moved in push_runs(root, args.git_remote, args.exp, args.remote):
        print(f"pushed {_plural(moved.rows, 'row')} of {moved.exp} to {args.git_remote}, "
              "with their data")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from ..recording.share import pull_runs

    root = _git_remote(_project_root("pull"), args, "pulled")
    for moved in pull_runs(root, args.git_remote, args.exp, args.remote):
        print(f"pulled {_plural(moved.rows, 'row')} of {moved.exp} from {args.git_remote}, "
              f"with their data; `dvc exp apply <row>` then `dvc exp run` resumes one")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    from ..recording.maintenance import reset_stage

    removed = reset_stage(args.stage, str(_project_root("reset")))
    if not removed:
        print("dvc-dali reset: no persisted dvc-dali checkpoint found; nothing to do")
        return 0
    for item in removed:
        print(f"removed {item}")
    print("the next `dvc exp run` starts from step 0; recorded experiments are kept")
    return 0


# --------------------------------------------------------------------------
# doctor
# --------------------------------------------------------------------------


class _Report:
    """Prints one line per check and counts the failed ones."""

    def __init__(self) -> None:
        self.problems = 0

    def __call__(self, ok: bool, text: str) -> None:
        self.problems += not ok
        print(f"{'ok ' if ok else 'BAD'}  {text}")


def _doctor_versions(report: _Report) -> None:
    from importlib.metadata import version

    import dvc

    from ..dali.dali_state import dali_version

    print(f"dvc-dali {__version__}, DVC {dvc.__version__}, DVCLive {version('dvclive')}, "
          f"DALI {dali_version()}, Python {sys.version.split()[0]}")
    report(dvc.__version__.split(".")[0] == "3",
           f"DVC {dvc.__version__}: dvc-dali records checkpoints on DVC 3 (DVC 2 records "
           "them itself)")


def _doctor_leftovers(report: _Report, root: Path) -> None:
    """Files a killed run leaves behind, on which later runs fail."""
    from ..reading.exp_refs import common_dir, git_dirs
    from ..recording import cut_short
    from ..training.signal_file import in_repo

    stale = in_repo(root)
    report(not stale.exists(), f"{stale}: " + ("stale checkpoint signal from a killed run; "
                                               "remove it if no run is active" if stale.exists()
                                               else "no stale signal"))
    try:  # not root/.git: the DVC root may be below the git top, or in a worktree
        git_dir = Path(git_dirs(str(root))[0])
    except DvcDaliError as exc:
        if "safe.directory" in str(exc):  # git refuses the repository itself
            report(False, str(exc))
        git_dir = root / ".git"
    # git's locks: the index, HEAD, packed-refs..., every ref (DVC's, the rows'),
    # a linked worktree's own (index, HEAD) and those of the refs it shares
    shared = Path(common_dir(str(git_dir)))
    locks = sorted({*git_dir.glob("*.lock"), *shared.glob("*.lock"),
                    *shared.glob("refs/**/*.lock")})
    row_locks = set(cut_short.locks(str(git_dir)))
    for lock in locks:
        what = cut_short.judge(str(git_dir), lock, None)[0] if lock in row_locks else None
        if what == cut_short.COMPLETE:
            report(True, f"{lock}: a row a killed run recorded but did not publish; the next "
                         "`dvc exp run` completes it")
        elif what == cut_short.REMOVE:
            report(True, f"{lock}: a lock left by a killed run without a row in it; the next "
                         "`dvc exp run` removes it")
        else:
            report(False, f"{lock}: a git lock left by a killed `dvc exp run`; DVC fails on it "
                          "(at once, or at the end of the next run). Remove it if no git or "
                          "DVC process is running")
    # DVC writes these in place (its rwlock; the info file of a running
    # experiment, .dvc/tmp/exps/run/<name>/<name>.run); a run killed meanwhile
    # leaves them empty or cut short, and every later DVC command (or
    # `dvc exp run`) then fails to read them.
    tmp = root / ".dvc" / "tmp"
    for left in sorted(tmp.glob("**/rwlock")) + sorted(tmp.glob("exps/run/*/*.run")):
        try:
            json.loads(left.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            report(False, f"{left}: unreadable ({type(exc).__name__}), left by a killed DVC "
                          "command; DVC refuses to run until it goes. Remove it if no DVC "
                          "process is running")


def _doctor_params(report: _Report, root: Path) -> None:
    """DVC applies `dvc exp run -S` by rewriting a params file in place: a
    kill meanwhile leaves it empty or cut short, and every later `-S` fails
    on it ("Could not override ..."). Said when the committed one is not."""
    from ..reading import gitcmd

    for name in params_files(root):
        if not name.endswith((".yaml", ".yml", ".json")):
            continue  # (TOML and Python params files: not parsed here)
        params = root / name
        try:
            now = params.read_text(encoding="utf-8")
            # ./: relative to the DVC root, which may be below the git work tree's top
            committed = gitcmd.run(["show", f"HEAD:./{name}"], str(root), check=False,
                                   unrunnable=DvcDaliError)
        except (OSError, DvcDaliError):
            continue
        if committed.returncode != 0 or not params_cut_short(now, committed.stdout):
            continue
        report(False, f"{params}: {'empty' if not now.strip() else 'cut short'}, while the "
                      "committed one is not (DVC rewrites it in place for `dvc exp run -S`, "
                      "and a kill meanwhile leaves it so); `dvc exp run -S` fails on it. "
                      f"Restore it with `git checkout HEAD -- '{params}'` if you did not "
                      "empty it yourself")


def _doctor_lockfile(report: _Report, root: Path) -> bool:
    """DVC writes dvc.lock in place (open "w", then dump) at the end of a
    stage: a kill meanwhile leaves it cut short, and every later `dvc exp
    run` fails on it ("validation failed"), with nothing said of the rows
    (the kill fuzz found it). The newest row on this commit is named.
    False where DVC cannot read it (nor then load the stages)."""
    from ..reading import gitcmd
    from ..reading.exp_refs import list_rows
    from ..recording import dvc_door

    lock = root / "dvc.lock"
    problem = dvc_door.lockfile_problem(str(lock))
    if problem is None:
        return True
    head = gitcmd.run(["rev-parse", "HEAD"], str(root), check=False, unrunnable=DvcDaliError)
    rows = [r for r in list_rows(str(root)) if r["baseline"] == head.stdout.strip()]
    newest = max(rows, key=lambda r: (r["time"], r["step"]), default=None)
    if newest is not None:
        fix = (f"put the newest row on this commit back with `dvc exp apply {newest['name']}` "
               f"(step {newest['step']} of run {newest['exp']}; `dvc exp show` lists the "
               "others): the next `dvc exp run` resumes from it")
    else:
        fix = f"restore the committed one with `git checkout HEAD -- '{lock}'`"
    report(False, f"{lock}: DVC cannot read it ({problem}). DVC rewrites it in place at the "
                  "end of a stage, and a kill meanwhile leaves it cut short; every `dvc exp "
                  f"run` fails on it. Fix dvc.lock: if no DVC command is running, {fix}")
    return False


def params_files(root: Path) -> list[str]:
    """params.yaml, the files dvc.yaml's ``vars`` name and the params files
    its stages name (``foreach``/``matrix`` stages by their ``do``), relative
    to the DVC root, a stage's wdir taken into account; names DVC would
    interpolate (``${...}``) are left out. dvc.yaml is read as text, not
    through DVC, so this works where DVC cannot load the stages (a params
    file cut short is one such case)."""
    import yaml

    try:
        data = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, ValueError, yaml.YAMLError):
        data = {}
    data = data if isinstance(data, dict) else {}
    found = ["params.yaml"]
    found += [str(v).split(":", 1)[0] for v in _listed(data.get("vars")) if isinstance(v, str)]
    stages = data.get("stages")
    for stage in stages.values() if isinstance(stages, dict) else ():
        stage = stage.get("do", stage) if isinstance(stage, dict) else None
        if not isinstance(stage, dict):
            continue
        wdir = str(stage.get("wdir") or ".")
        for item in _listed(stage.get("params")):
            if isinstance(item, dict):
                found += [os.path.normpath(os.path.join(wdir, str(f))) for f in item]
    return [f for f in dict.fromkeys(found) if "${" not in f]


def _listed(value: object) -> list:
    return value if isinstance(value, list) else []


def params_cut_short(now: str, committed: str) -> bool:
    """A params.yaml that is not a mapping (empty, or cut before its first key
    ended) or not YAML, where the committed one is a mapping. One that holds
    other keys is an edit, not a cut."""
    import yaml

    try:
        was = yaml.safe_load(committed)
    except yaml.YAMLError:
        return False
    if not isinstance(was, dict) or not was:
        return False
    try:
        found = yaml.safe_load(now)
    except yaml.YAMLError:
        return True
    return not isinstance(found, dict)


def _doctor_stages(report: _Report, root: Path) -> None:
    from ..core.context import RunContext
    from ..recording import maintenance

    outputs = maintenance.checkpoint_outputs(str(root))
    if not outputs:
        report(False, f"no stage in {root} has a checkpoint output: nothing would be recorded. "
                      "Declare the output the training saves checkpoints to `persist: true` "
                      "and `checkpoint: true` in dvc.yaml (`dvc-dali init` writes an example)")
    from .migrate import check_project

    flagged = check_project(str(root))  # DVC 2 stages: `dvc-dali migrate` fixes them
    for line in flagged:
        report(False, line)
    ctx = RunContext.from_environ()
    for stage, path in outputs:
        if any(f"stage '{stage}' will not resume" in line for line in flagged):
            continue  # its problem is said once, with the command that fixes it
        try:
            maintenance.check_stage(ctx, path, stage=stage)
            report(True, f"stage {stage}: checkpoint output {os.path.relpath(path, root)} "
                   "is persisted and the stage always runs")
        except DvcDaliError as exc:
            report(False, _message(exc))


def _doctor_gpu(report: _Report) -> None:
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        report(True, f"GPU: {count} CUDA device(s) usable through CuPy")
    except Exception as exc:
        print(f"--   GPU: not usable ({type(exc).__name__}); DALI runs on the CPU "
              "(device_id=None)")


def _doctor_verify(report: _Report, root: Path, row: str | None) -> None:
    """Replay a recorded checkpoint's pipelines and compare their batches."""
    from ..proof import replay
    from ..recording import maintenance

    what = row or "the workspace's checkpoint"
    try:  # a dvc.yaml or dvc.lock DVC cannot read ended doctor without a word of the row
        targets = maintenance.replay_targets(str(root))
    except DvcDaliError as exc:
        report(False, f"--verify: {what} not verified: {_message(exc)}")
        return
    if not targets:  # said nothing of the row asked for (found by a sweep)
        report(False, f"--verify: {what} not verified: no stage declares a checkpoint output, "
                      "so there is no checkpoint to replay (see above)")
    for path, wdir in targets:
        replay.verify(root, os.path.relpath(path, root), row, report, Path(wdir))


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..core.context import repo_root

    report = _Report()
    _doctor_versions(report)
    root = repo_root()
    if root is None:
        report(False, f"no DVC repository at or above {Path.cwd()}: run "
                      f"`{setup_commands(Path.cwd()).removesuffix(' && ') or 'dvc init'}`")
        return 1
    _doctor_leftovers(report, root)
    _doctor_params(report, root)
    if _doctor_lockfile(report, root):  # else DVC loads no stage: its one fix is said
        _doctor_stages(report, root)
        from .row_data import report_rows

        report_rows(report, str(root))  # rows whose data `dvc gc` removed
    _doctor_gpu(report)
    if args.verify is not None:
        _doctor_verify(report, root, args.verify or None)
    return 1 if report.problems else 0


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------


def _subparser(sub: "argparse._SubParsersAction", name: str,
               func: Callable[[argparse.Namespace], int], help_text: str, description: str
               ) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=description)
    p.set_defaults(func=func)
    return p


def _init_parser(sub: "argparse._SubParsersAction") -> None:
    p = _subparser(sub, "init", cmd_init, "write a dvc.yaml stage, params.yaml and a training "
                   "script to start from", "Write dvc.yaml, params.yaml and train.py: a stage "
                   "that trains on data/images/<class>/ and records a checkpoint every few "
                   "steps. Refuses to overwrite existing files without --force.")
    p.add_argument("dir", nargs="?", default=".", help="where to write them (default: .)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--digits", action="store_true",
                   help="also write sample images to data/images: scikit-learn's 1,797 "
                        "handwritten digits as PNG files (needs scikit-learn)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand; with ``command`` "show", not the ones
    that cost imports (`migrate`): `dvc-dali show` starts faster."""
    parser = argparse.ArgumentParser(prog="dvc-dali", description="DALI pipeline state as "
                                     "DVC experiment checkpoints.")
    parser.add_argument("--version", action="version", version=f"dvc-dali {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND",
                                title="commands")
    _init_parser(sub)
    p = _subparser(sub, "show", cmd_show, "recorded checkpoints as a tree per experiment, "
                   "by step", "Recorded checkpoint rows per experiment run, the run with the "
                   "newest row first; each run as a tree by step with its metrics, its newest "
                   "row marked.")
    p.add_argument("exp", nargs="?", help="only this experiment")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.add_argument("--best", metavar="METRIC:max|min",
                   help="mark and print the best row by a DVCLive metric, e.g. train/acc:max")
    p.add_argument("--metrics-file",
                   help="metrics file to show (default: the JSON metrics file the rows' "
                   f"dvc.yaml declares for their stage, as DVC finds it, else {DEFAULT_METRICS})")
    p = _subparser(sub, "run", cmd_run, "run a training command (any language) and record "
                   f"each {SIGNAL_NAME} signal it makes, as a DVC 3 stage command",
                   f"Run CMD with DVC 2's checkpoint protocol ({SIGNAL_NAME}=1; CMD touches "
                   f"$DVC_ROOT/.dvc/tmp/{SIGNAL_NAME} and waits until it is gone) and record "
                   "each checkpoint as an experiment row. Use it as the stage's cmd.")
    p.add_argument("--checkpoint", default="checkpoint",
                   help="the checkpoint output directory (default: checkpoint)")
    p.add_argument("--keep-last", type=int, help="keep only the last N checkpoint rows")
    p.add_argument("--keep-best", help="also keep the best row by a metric, e.g. train/acc:max")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p = _subparser(sub, "remove", cmd_remove, "delete whole experiment runs: all their "
                   "checkpoint rows and DVC's own experiment", "Delete every checkpoint row of "
                   "each named experiment run, on every baseline, and DVC's own experiment "
                   "of that name (as `dvc exp remove`). Only the refs go: the data stays in "
                   "the DVC cache until `dvc gc`.")
    p.add_argument("exp", nargs="+", help="experiment name(s), as `dvc-dali show` lists them")
    for name, func, verb in (("push", cmd_push, "to"), ("pull", cmd_pull, "from")):
        p = _subparser(sub, name, func, f"{name} whole experiment runs, every checkpoint row "
                       f"with its data, {verb} remotes", f"{name.capitalize()} every checkpoint "
                       f"row of each named run (and DVC's own experiment of that name) {verb} "
                       f"the git remote, with the rows' data {verb} the DVC remote (data "
                       f"first). `dvc exp {name}` moves only a run's final experiment.")
        p.add_argument("git_remote", help="git remote name or URL, as for `dvc exp push`")
        p.add_argument("exp", nargs="+", help="experiment run name(s)")
        p.add_argument("-r", "--remote", help="DVC remote (default: the default remote)")
    p = _subparser(sub, "reset", cmd_reset, "start over: delete the persisted checkpoint and "
                   "its dvc.lock entry (DVC 2's `exp run --reset`)", "Start over: delete the "
                   "persisted checkpoint output and its dvc.lock entry, so the next `dvc exp "
                   "run` starts from step 0 (DVC 2's `exp run --reset`). Recorded rows are kept.")
    p.add_argument("--stage", help="only this stage (default: every stage with one)")
    if command != "show":
        from .migrate import add_parser as add_migrate

        add_migrate(sub)
    else:  # named, so that a usage line lists every command
        sub.add_parser("migrate")
    _doctor_parser(sub)
    return parser


def _doctor_parser(sub: "argparse._SubParsersAction") -> None:
    p = _subparser(sub, "doctor", cmd_doctor, "check versions, stage declarations, stale "
                   "signals, GPU; --verify replays a checkpoint", "Check the DVC version, that "
                   "a stage has a checkpoint output DVC 3 can resume from, files killed runs "
                   "leave behind, and the GPU. --verify [ROW]: restore the checkpoint of ROW "
                   "(default: the workspace's) without training, and compare the batches its "
                   "pipelines produce with those the run recorded after it.")
    p.add_argument("--verify", nargs="?", const="", default=None, metavar="ROW",
                   help="replay ROW's checkpoint (default: the workspace's) and compare its "
                        "batches with the recorded digests")


def _closed_pipe() -> int:
    """The reader went away (`dvc-dali show | head`): stop quietly, with the
    status of a process killed by SIGPIPE, as `git log | head` ends."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the exit-time flush must not fail again
    os.close(devnull)
    return 128 + signals.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    first = (sys.argv[1:] if argv is None else argv)[:1]
    args = build_parser(first[0] if first else None).parse_args(argv)
    _fit_output()
    blank = inputs.blank_problem(vars(args))
    if blank:
        print(f"dvc-dali {args.cmd}: {blank}", file=sys.stderr)
        return 1
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here when the output was buffered
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except (DvcDaliError, OSError) as exc:  # OSError: git or DVC missing, a file unreadable
        from ..core.context import debug_requested

        if debug_requested():  # DVC_DALI_DEBUG=1: the traceback too, as DVC's -v
            traceback.print_exc()
        print(f"dvc-dali {args.cmd}: {_message(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
