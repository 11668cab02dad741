"""What the `dvc-dali` command refuses in its arguments, as decisions of
their own: each answers "" (fine) or the one line to say, naming the input
and what to give instead. Found by a bad-input sweep of the command: these
passed silently, or ended in the raw text of Python, git or DVC."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from typing import Sequence

from ..core.context import parse_keep_best, parse_keep_last
from ..reading.metrics_source import DEFAULT_METRICS

COMMAND = "the training command after --"


# what each argument is and what to give, for a blank one: an empty name
# was taken as none (`show ''` said no rows were recorded, `--metrics-file ''`
# read the default, `init ''` wrote into .) or as a name nothing has
BLANK = {
    "exp": ("experiment name", "a run's name, as `dvc-dali show` lists them"),
    "metrics_file": ("--metrics-file", f"a DVCLive metrics file (default {DEFAULT_METRICS})"),
    "git_remote": ("git remote", "a remote `git remote -v` lists, or its URL"),
    "stage": ("--stage", "a stage `dvc stage list` names, or leave it out for every stage"),
    "dir": ("directory", "the project's directory (default: .)"),
    "checkpoint": ("--checkpoint", "the checkpoint output directory the stage declares "
                   "(default: checkpoint)"),
}


def blank_problem(given: dict[str, object]) -> str:
    """The first argument in ``given`` (a parsed command line's values by
    name) that is empty or only spaces, as a line; "" when none is."""
    for name, (label, what) in BLANK.items():
        value = given.get(name)
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            return f"{label} {next(v for v in values if not v.strip())!r} is empty: give {what}"
    return ""


def run_options(keep_last: object, keep_best: object, checkpoint: str,
                root: str | None) -> tuple[int | None, str | None]:
    """`dvc-dali run`'s --keep-last and --keep-best, checked as under `dvc exp
    run` (ConfigError naming the option), and --checkpoint, which must lie in
    the DVC project ``root`` (None: outside one, nothing to compare with)."""
    from ..core.errors import ConfigError

    last = parse_keep_last(keep_last, "--keep-last")
    best = parse_keep_best(keep_best, "--keep-best")
    problem = checkpoint_problem(checkpoint, root)
    if problem:
        raise ConfigError(problem)
    return last, best


def checkpoint_problem(checkpoint: str, root: str | None) -> str:
    """--checkpoint: a directory a stage of the project declares as an
    output, so a non-empty path inside the project."""
    if root is None:
        return ""
    top = os.path.realpath(root)
    full = os.path.realpath(os.path.join(os.getcwd(), checkpoint))
    if full == top or os.path.commonpath([top, full]) != top:
        where = "is the DVC project itself" if full == top else f"is outside the DVC project {root}"
        return (f"--checkpoint {shlex.quote(checkpoint)} {where}: give the checkpoint output "
                "directory the stage declares in dvc.yaml (default: checkpoint)")
    return ""


def command_problem(program: str, path_env: str | None = None, cwd: str | None = None) -> str:
    """Why ``program`` (the command's first word) cannot be started: a path
    that is missing, a directory or not executable, or a name not on PATH
    (``path_env``: the PATH the command gets); "" when it can."""
    if os.sep not in program:
        if shutil.which(program, path=path_env) is not None:
            return ""
        return (f"{program!r} ({COMMAND}): no such command on PATH; give the program's path "
                f"(./{program}) or install it. Nothing was run")
    full = os.path.join(cwd or os.getcwd(), program)
    if not os.path.lexists(full) or not os.path.exists(full):
        why = "no such file" + (f" in {cwd or os.getcwd()}" if not os.path.isabs(program) else "")
        return (f"{program!r} ({COMMAND}): {why}; give the training program's path. "
                "Nothing was run")
    if os.path.isdir(full):
        return (f"{program!r} ({COMMAND}): a directory, not a program; give the training "
                "program's path. Nothing was run")
    if not os.access(full, os.X_OK):
        return (f"{program!r} ({COMMAND}): not executable; `chmod +x {shlex.quote(program)}` "
                "(and commit the mode), or name its interpreter first "
                f"(`dvc-dali run -- bash {shlex.quote(program)}`). Nothing was run")
    return ""


def metrics_problem(path: str, blobs: Sequence[bytes | None], is_dir: bool = False
                    ) -> tuple[str, bool]:
    """Why no row shows a metric from --metrics-file ``path``, given each
    row's copy of it (None: the row holds no such file, or a directory
    there), and whether that refuses the listing: ("", False) when one holds
    a DVCLive metric. A metrics file of the step alone (a trainer that logs
    no metric yet) is said, and the rows listed. ``is_dir``: ``path`` is a
    directory in the workspace."""
    fix = (f"(--metrics-file: a DVCLive metrics file, relative to the DVC project; default "
           f"{DEFAULT_METRICS})")
    found = [blob for blob in blobs if blob is not None]
    if not found:
        return f"no row holds {path}{', a directory here' if is_dir else ''} {fix}", True
    kinds = {_metrics_kind(blob) for blob in found}
    if "metrics" in kinds:
        return "", False
    if "no numbers" in kinds:
        return (f"no row's {path} holds a metric: it holds no number (the step aside); the "
                f"rows are listed without metrics {fix}", False)
    why = ("it is not JSON (not a metrics file, or not text)" if kinds == {"unreadable"} else
           "it is JSON, but not an object of metrics")
    return f"no row's {path} holds metrics: {why} {fix}", True


def _metrics_kind(blob: bytes) -> str:
    """"metrics" (a JSON object with a number that is not the step),
    "no numbers", "not an object" (other JSON) or "unreadable"."""
    from ..reading.row_queries import flatten_metrics

    try:
        data = json.loads(blob)
    except ValueError:  # UnicodeDecodeError too
        return "unreadable"
    if not isinstance(data, dict):
        return "not an object"
    return "metrics" if flatten_metrics(data) else "no numbers"


def git_remote_problem(given: str, configured: Sequence[str], cwd: str) -> str:
    """A git remote that is neither a configured name, a URL (``scheme://``,
    ``host:path``) nor an existing path: git would fail on it after the data
    moved. "" when git may try it."""
    if given in configured or "://" in given or os.path.exists(os.path.join(cwd, given)):
        return ""
    if re.match(r"^[^/]+:", given) and not given.startswith("-"):  # scp-like host:path
        return ""
    names = ", ".join(configured) or "none"
    if "/" in given or given.startswith("."):
        return (f"git remote {given!r}: no such path (nor a remote of that name; configured: "
                f"{names}); give the path of a git repository, or a remote `git remote -v` "
                "lists")
    return (f"git remote {given!r}: no remote of that name here (configured: {names}), nor a "
            "URL or a path; give one `git remote -v` lists, or add it with `git remote add "
            f"{shlex.quote(given)} <url>`")
