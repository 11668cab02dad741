"""The `dvc-dali` command: init, show, run, reset, doctor."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal as signals
import subprocess
import sys
import time
from pathlib import Path

from ._version import __version__
from .errors import DvcDaliError

TEMPLATES = ("dvc.yaml", "train.py", "params.yaml")


def cmd_init(args: argparse.Namespace) -> int:
    dest = Path(args.dir)
    existing = [name for name in TEMPLATES if (dest / name).exists()]
    if existing and not args.force:
        print(f"dvc-dali init: {', '.join(str(dest / n) for n in existing)} already exist; "
              "nothing written. Use --force to overwrite them.", file=sys.stderr)
        return 1
    source = Path(__file__).with_name("templates")
    dest.mkdir(parents=True, exist_ok=True)
    for name in TEMPLATES:
        shutil.copyfile(source / name, dest / name)
        print(f"wrote {dest / name}")
    print("next: put images in data/images/<class>/, commit, then `dvc exp run`")
    return 0


def _rows_with_metrics(root: str, exp: str | None, metrics_file: str) -> list[dict]:
    from . import dvc_recorder

    rows = dvc_recorder.list_checkpoint_rows(root, exp)
    for row in rows:
        proc = subprocess.run(["git", "show", f"{row['sha']}:{metrics_file}"], cwd=root,
                              capture_output=True, text=True)
        flat: dict[str, float] = {}

        def walk(node, prefix=""):
            for key, value in (node.items() if isinstance(node, dict) else []):
                if isinstance(value, dict):
                    walk(value, f"{prefix}{key}/")
                elif isinstance(value, (int, float)) and key != "step":
                    flat[f"{prefix}{key}"] = value
        if proc.returncode == 0:
            try:
                walk(json.loads(proc.stdout))
            except ValueError:
                pass
        row["metrics"] = flat
    return rows


def _draw_tree(rows: list[dict]) -> list[str]:
    """An experiment's checkpoints as DVC 2 drew them: newest first, a
    branch where a run resumed from an older checkpoint."""
    by_sha = {r["sha"]: r for r in rows}
    children: dict[str | None, list[dict]] = {}
    for r in rows:
        parent = r["parent"] if r["parent"] in by_sha else None
        children.setdefault(parent, []).append(r)
    lines: list[str] = []

    def chain(start: dict, depth: int) -> None:
        node: dict | None = start
        while node is not None:
            kids = sorted(children.get(node["sha"], []), key=lambda r: r["step"])
            metrics = "  ".join(f"{k}={v:.4g}" for k, v in sorted(node["metrics"].items()))
            lines.append(f"{'│ ' * depth}├─ step {node['step']:>7}  {node['name']:<28} "
                         f"{node['sha'][:7]}  {metrics}")
            for branch in kids[1:]:
                chain(branch, depth + 1)
            node = kids[0] if kids else None

    for root in sorted(children.get(None, []), key=lambda r: r["step"]):
        chain(root, 0)
    return lines


def cmd_show(args: argparse.Namespace) -> int:
    from .signal import repo_root

    root = repo_root()
    if root is None:
        print("dvc-dali show: not inside a DVC repository (no .dvc above "
              f"{Path.cwd()}); run it in the project", file=sys.stderr)
        return 1
    rows = _rows_with_metrics(str(root), args.exp, args.metrics_file)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no dvc-dali checkpoints recorded yet" + (f" for {args.exp}" if args.exp else ""))
        return 0
    names = {r["sha"]: r["name"] for r in rows}
    for exp in sorted({r["exp"] for r in rows}):
        mine = [r for r in rows if r["exp"] == exp]
        origin = [names[r["parent"]] for r in mine if r["parent"] in names
                  and names[r["parent"]] not in {m["name"] for m in mine}]
        resumed = f", resumed from {origin[0]}" if origin else ""
        print(f"{exp}  (baseline {mine[0]['baseline'][:7]}, {len(mine)} checkpoints{resumed})")
        print("\n".join(_draw_tree(mine)))
    return 0


def _checkpoint_step(path: Path) -> int | None:
    from . import store

    try:
        found = store.latest(path)
        return store.read_manifest(path / found[0][0], found[0][1])["step"] if found else None
    except DvcDaliError:
        return None


def cmd_run(args: argparse.Namespace) -> int:
    from . import dvc_recorder, signal

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("dvc-dali run: give the training command after --, e.g. "
              "`dvc-dali run -- ./train --steps 100`", file=sys.stderr)
        return 2
    if signal.mode() != "self":
        print("dvc-dali run: not under DVC 3's `dvc exp run` (or DVC 2 records itself); "
              "running the command without recording", file=sys.stderr)
        return subprocess.call(command)
    checkpoint = Path(args.checkpoint)
    dvc_recorder.check_stage(str(checkpoint))
    root = signal.repo_root()
    sig = root / ".dvc" / "tmp" / signal.SIGNAL_NAME
    if sig.exists():
        print(f"dvc-dali run: removing {sig}, a stale signal left by a killed run",
              file=sys.stderr)
        sig.unlink()
    # The child sees DVC 2's protocol; DVC_ROOT is this run's own repository,
    # so parallel --temp/queued runs each watch their own signal file.
    env = {**os.environ, "DVC_CHECKPOINT": "1", "DVC_ROOT": str(root),
           signal.SIGNAL_FILE_ENV: str(sig)}
    child = subprocess.Popen(command, env=env)
    for sig_num in (signals.SIGINT, signals.SIGTERM):
        signals.signal(sig_num, lambda n, _f: child.send_signal(n))
    keep = signal.retention(args.keep_last, args.keep_best)

    def record() -> None:
        result = dvc_recorder.record_checkpoint(_checkpoint_step(checkpoint), out=str(checkpoint))
        dvc_recorder.apply_retention(result.exp_name, *keep)
        print(f"dvc-dali: recorded {result.name} ({result.duration_s * 1000:.0f} ms)",
              file=sys.stderr)
        sig.unlink(missing_ok=True)

    while child.poll() is None:
        if sig.exists():
            record()
        time.sleep(0.01)
    if sig.exists():  # signalled, then died while waiting: the checkpoint is complete
        record()
    return child.returncode


def cmd_reset(args: argparse.Namespace) -> int:
    from . import dvc_recorder

    removed = dvc_recorder.reset_stage(args.stage)
    if not removed:
        print("dvc-dali reset: no persisted dvc-dali checkpoint found; nothing to do")
        return 0
    for item in removed:
        print(f"removed {item}")
    print("the next `dvc exp run` starts from step 0; recorded experiments are kept")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import dvc_recorder, signal

    problems = 0

    def report(ok: bool, text: str) -> None:
        nonlocal problems
        problems += not ok
        print(f"{'ok ' if ok else 'BAD'}  {text}")

    from importlib.metadata import version

    import dvc
    import nvidia.dali

    print(f"dvc-dali {__version__}, DVC {dvc.__version__}, DVCLive {version('dvclive')}, "
          f"DALI {nvidia.dali.__version__}, Python {sys.version.split()[0]}")
    report(dvc.__version__.split(".")[0] == "3",
           f"DVC {dvc.__version__}: dvc-dali records checkpoints on DVC 3 (DVC 2 records "
           "them itself)")
    root = signal.repo_root()
    if root is None:
        report(False, f"no DVC repository at or above {Path.cwd()}: run `dvc init`")
        return 1
    stale = root / ".dvc" / "tmp" / signal.SIGNAL_NAME
    report(not stale.exists(), f"{stale}: " + ("stale checkpoint signal from a killed run; "
                                               "remove it if no run is active" if stale.exists()
                                               else "no stale signal"))
    git_dir = root / ".git"
    locks = sorted(git_dir.glob("refs/exps/**/*.lock")) + sorted(git_dir.glob("index.lock"))
    for lock in locks:
        report(False, f"{lock}: a git lock left by a killed `dvc exp run`; DVC fails on it at "
                      "the end of the next run. Remove it if no git or DVC process is running")
    # DVC rewrites these in place; a run killed meanwhile leaves them empty
    # or cut short, and every later DVC command then fails to read them.
    for rwlock in sorted((root / ".dvc" / "tmp").glob("**/rwlock")):
        try:
            json.loads(rwlock.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            report(False, f"{rwlock}: unreadable ({type(exc).__name__}), left by a killed DVC "
                          "command; DVC refuses to run until it goes. Remove it if no DVC "
                          "process is running")
    for stage, path in dvc_recorder.checkpoint_outputs(str(root)):
        try:
            dvc_recorder.check_stage(path, stage=stage)
            report(True, f"stage {stage}: checkpoint output {os.path.relpath(path, root)} "
                   "is persisted and the stage always runs")
        except DvcDaliError as exc:
            report(False, str(exc))
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        report(True, f"GPU: {count} CUDA device(s) usable through CuPy")
    except Exception as exc:
        print(f"--   GPU: not usable ({type(exc).__name__}); DALI runs on the CPU "
              "(device_id=None)")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dvc-dali", description="DALI pipeline state as "
                                     "DVC experiment checkpoints.")
    parser.add_argument("--version", action="version", version=f"dvc-dali {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init", help="write the dvc.yaml stage, params.yaml and a training "
                       "script to start from")
    p.add_argument("dir", nargs="?", default=".", help="where to write them (default: .)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=cmd_init)
    p = sub.add_parser("show", help="recorded checkpoints as a tree per experiment, by step")
    p.add_argument("exp", nargs="?", help="only this experiment")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.add_argument("--metrics-file", default="dvclive/metrics.json",
                   help="metrics file to show (default: dvclive/metrics.json)")
    p.set_defaults(func=cmd_show)
    p = sub.add_parser("run", help="run a training command (any language) and record each "
                       "DVC_CHECKPOINT signal it makes, as a DVC 3 stage command")
    p.add_argument("--checkpoint", default="checkpoint",
                   help="the checkpoint output directory (default: checkpoint)")
    p.add_argument("--keep-last", type=int, help="keep only the last N checkpoint rows")
    p.add_argument("--keep-best", help="also keep the best row by a metric, e.g. train/acc:max")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("reset", help="start over: delete the persisted checkpoint and its "
                       "dvc.lock entry (DVC 2's `exp run --reset`)")
    p.add_argument("--stage", help="only this stage (default: every stage with one)")
    p.set_defaults(func=cmd_reset)
    p = sub.add_parser("doctor", help="check versions, stage declarations, stale signals, GPU")
    p.set_defaults(func=cmd_doctor)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except DvcDaliError as exc:
        print(f"dvc-dali {args.cmd}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
