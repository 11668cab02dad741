"""A project's experiment rows and refs, read back the one way every test does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from tests.helpers.dvc_project import run


def exp_rows(path: Path, *, all_commits: bool = True, env: dict | None = None
             ) -> dict[str, dict]:
    """{row name: {"rev", "metrics", "step", "deps", "outs", "data"}} from
    `dvc exp show --json`, with every commit's experiments (-A) or, with
    ``all_commits=False``, those of the workspace and HEAD only. "metrics"
    merges every metrics file's values, "step" is its "step"; "data" is the
    row's whole entry (params, metrics and outs by file). DVC's own
    experiment (named without a step) is a row too. ``env``: extra variables
    for `dvc`."""
    cmd = [sys.executable, "-m", "dvc", "exp", "show", "--json"]
    shown = json.loads(run([*cmd, "-A"] if all_commits else cmd, path, env=env).stdout)
    rows = {}
    for node in shown:
        for exp in node.get("experiments") or []:
            for rev in exp.get("revs") or []:
                data = rev.get("data") or {}
                metrics = {}
                for f in (data.get("metrics") or {}).values():
                    metrics.update(f.get("data") or {})
                rows[rev.get("name") or exp.get("name")] = {
                    "rev": rev.get("rev"), "metrics": metrics, "step": metrics.get("step"),
                    "deps": data.get("deps"), "outs": data.get("outs"), "data": data}
    return rows


def exp_refs(path: Path, *, dvc_exec: bool = False) -> list[tuple[str, str]]:
    """(sha, ref) of every experiment ref, refs/exps/<b[:2]>/<b[2:]>/<name>
    (the rows and DVC's own experiments), in git's order; ``dvc_exec``: of
    every ref under refs/exps, DVC's bookkeeping (refs/exps/exec/...) too.
    ``path`` may be a bare repository (a git remote)."""
    out = run(["git", "for-each-ref", "--format=%(objectname) %(refname)", "refs/exps"],
              path).stdout
    refs = []
    for line in out.splitlines():
        sha, ref = line.split()
        parts = ref.split("/")
        if dvc_exec or (len(parts) == 5 and len(parts[2]) == 2):
            refs.append((sha, ref))
    return refs


def row_refs(path: Path) -> dict[str, tuple[str, str]]:
    """row name -> (ref, sha) of the dvc-dali rows (<experiment>-step<N>)."""
    return {ref.rsplit("/", 1)[1]: (ref, sha) for sha, ref in exp_refs(path) if "-step" in ref}


def row_ranks(path: Path, name: str) -> list[tuple[str, str]]:
    """(rank dir, step) of every rank state in row ``name``'s cached checkpoint
    (the .dir listing its dvc.lock names for output ``checkpoint``), sorted."""
    sha = run(["git", "rev-parse", f"refs/exps/{_exp_prefix(path)}/{name}"], path).stdout.strip()
    lock = yaml.safe_load(run(["git", "show", f"{sha}:dvc.lock"], path).stdout)
    md5 = next(out["md5"] for stage in lock["stages"].values() for out in stage.get("outs", [])
               if out["path"] == "checkpoint")
    listing = json.loads((path / ".dvc/cache/files/md5" / md5[:2] / md5[2:]).read_text())
    return sorted({(e["relpath"].split("/")[0], e["relpath"].split("/")[1][5:14])
                   for e in listing if e["relpath"].startswith("rank-")})


def _exp_prefix(path: Path) -> str:
    base = run(["git", "rev-parse", "HEAD"], path).stdout.strip()
    return f"{base[:2]}/{base[2:]}"


def asynchronous_row_steps(project: Path, framework: list[str], name: str = "as",
                           how: tuple[str, ...] = ()) -> list:
    """A 30-step run of the example with DVC_DALI_ASYNC=1 (``framework``: its
    -S arguments; ``how``: e.g. "--temp"): the step each of its rows 10, 20,
    30 holds metrics of."""
    run([sys.executable, "-m", "dvc", "exp", "run", *how, "-n", name, *framework, "-S",
         "train.steps=30"], project, env={"DVC_DALI_ASYNC": "1"})
    rows = exp_rows(project)
    return [rows[f"{name}-step{s}"]["step"] for s in (10, 20, 30)]


def cached_files(project: Path, sha: str) -> dict[str, Path]:
    """checkpoint/<relpath> -> its object in .dvc/cache, for a row's checkpoint."""
    cache = project / ".dvc" / "cache" / "files" / "md5"
    lock = yaml.safe_load(run(["git", "show", f"{sha}:dvc.lock"], project).stdout)
    found = {}
    for entry in lock["stages"].values():
        for out in entry.get("outs", []):
            if out["path"] == "checkpoint":
                listing = cache / out["md5"][:2] / out["md5"][2:]
                for item in json.loads(listing.read_text()):
                    found[f"checkpoint/{item['relpath']}"] = \
                        cache / item["md5"][:2] / item["md5"][2:]
    return found
