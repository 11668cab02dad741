"""Benchmarks 1-3: make_checkpoint() inside `dvc exp run`.

1. blocking time per checkpoint, ours (DVC 3, synchronous) vs DVC 2.58's
   own `dvc.api.make_checkpoint()` (and our Checkpointer under DVC 2's
   watcher), outputs of 1 KB, 10 MB and 200 MB;
2. asynchronous mode: blocking time vs the in-memory snapshot alone;
3. 200 MB end to end vs copying + md5-hashing the same file, per DVC
   cache type, with a breakdown of where the time goes.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from common import (BENCH, DVC3, PY, Row, dvc_project, fmt_s, median, read_log, run,
                    say, write_jpegs, yes_no)

KB, MB = 1024, 1024 * 1024
SIZES = (("1 KB", KB), ("10 MB", 10 * MB), ("200 MB", 200 * MB))
PHASES = ("open", "save", "cache", "lockfile", "commit", "publish")

OURS_YAML = """\
stages:
  train:
    cmd: {cmd}
    deps: [train.py, data]
    outs:
      - checkpoint:
          persist: true
    metrics:
      - metrics.json:
          cache: false
    always_changed: true
"""

# DVC 2: its own checkpoint output (deleted and restored by DVC itself), and
# no always_changed (DVC 2 reruns a checkpoint stage anyway).
DVC2_YAML = OURS_YAML.replace("persist: true", "checkpoint: true").replace(
    "    always_changed: true\n", "")
assert "checkpoint: true" in DVC2_YAML and "always_changed" not in DVC2_YAML


def dvc2_paths() -> tuple[Path, Path] | str:
    """(dvc, python) of the DVC 2.58 venv, or why there is none."""
    try:  # bench/run.py puts the repository root on sys.path
        from tests.helpers import dvc2_venv

        return dvc2_venv.ensure_dvc2(), dvc2_venv.python()
    except Exception as exc:  # Dvc2Unavailable, Dvc2InstallError
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def run_exp(tmp: Path, name: str, images: Path, *, plan: list[tuple[int, int]],
            dvc: list[Any], yaml: str, script: str, stage_python: Path | str,
            asynchronous: bool = False, pipe: bool = True, floor: bool = False,
            cache_type: str | None = None,
            extra_env: dict[str, str] | None = None) -> dict[int, list[dict]]:
    """One `dvc exp run` of a fresh project making plan's checkpoints
    ((bytes, count), size after size); the script's events by size."""
    path = tmp / name
    cmd = f"{shlex.quote(str(stage_python))} train.py"
    dvc_project(path, dvc, {"train.py": (BENCH / script).read_text(),
                            "dvc.yaml": yaml.format(cmd=cmd),
                            ".gitignore": "__pycache__/\n"},
                {"cache.type": cache_type} if cache_type else None)
    shutil.copytree(images, path / "data" / "images")
    run(["git", "add", "-A"], path)
    run(["git", "commit", "-q", "-m", "data"], path)
    log = tmp / f"{name}.jsonl"
    floor_dir = tmp / f"{name}-floor"
    floor_dir.mkdir()
    bench_env = {"BENCH_LOG": str(log), "BENCH_PLAN": ",".join(f"{b}:{n}" for b, n in plan),
                 "BENCH_ASYNC": "1" if asynchronous else "0", "BENCH_PIPE": "1" if pipe else "0",
                 **({"BENCH_FLOOR_DIR": str(floor_dir)} if floor else {}), **(extra_env or {})}
    run([*dvc, "exp", "run", "-n", name], path, bench_env)
    events = [e for e in read_log(log) if e.get("event") == "checkpoint"]
    if len(events) != sum(n for _, n in plan):
        raise RuntimeError(f"{name}: {len(events)} of {sum(n for _, n in plan)} checkpoints "
                           f"logged ({log})")
    shutil.rmtree(path / ".dvc" / "cache", ignore_errors=True)  # free the disk early
    out: dict[int, list[dict]] = {}
    for e in events:
        out.setdefault(e["size"], []).append(e)
    return out


def steady(events: list[dict], key: str = "blocked") -> list[float]:
    """Values after the first checkpoint of a size (the very first one pays
    imports and opening the repo; the first of a size, a new allocation)."""
    return [e[key] for e in events[1:]]


def reflink_supported(tmp: Path) -> bool:
    a, b = tmp / "reflink-probe-a", tmp / "reflink-probe-b"
    a.write_bytes(b"x")
    ok = subprocess.run(["cp", "--reflink=always", str(a), str(b)],
                        capture_output=True).returncode == 0
    a.unlink()
    b.unlink(missing_ok=True)
    return ok


def breakdown(events: list[dict]) -> dict[str, float]:
    """Median seconds per part of a synchronous make_checkpoint."""
    ev = events[1:] or events
    out = {"blocked": median(e["blocked"] for e in ev),
           "save (our write+md5+fsync+publish)": median(e.get("write", 0) for e in ev)}
    for p in PHASES:
        out[f"record.{p}"] = median(e.get("phases", {}).get(p, 0.0) for e in ev)
    out["record (total)"] = median(e.get("record", 0) for e in ev)
    out["retention"] = median(e.get("retention", 0) for e in ev)
    out["other (capture, signal)"] = median(
        e["blocked"] - e.get("write", 0) - e.get("record", 0) - e.get("retention", 0) for e in ev)
    # across the parts above: fsyncs (ours and DVC's) and git subprocesses
    out[f"[{median(e.get('fsync_n', 0) for e in ev):.0f} fsyncs]"] = median(
        e.get("fsync_s", 0) for e in ev)
    for sub in sorted({k for e in ev for k in e.get("git", {})}):
        out[f"[git {sub}]"] = median(e.get("git", {}).get(sub, 0) for e in ev)
    for fn in sorted({k for e in ev for k in e.get("fine", {})}):
        out[f"[{fn}]"] = median(e.get("fine", {}).get(fn, 0) for e in ev)
    return out


def fmt_breakdown(parts: dict[str, float]) -> str:
    return ", ".join(f"{k} {fmt_s(v)}" for k, v in parts.items())


def run_all(tmp: Path, quick: bool) -> tuple[list[Row], list[str], dict[str, Any]]:
    rows: list[Row] = []
    notes: list[str] = []
    raw: dict[str, Any] = {}
    counts = {KB: 5, 10 * MB: 3, 200 * MB: 3} if quick else {KB: 12, 10 * MB: 8, 200 * MB: 6}
    plan = [(size, counts[size]) for _, size in SIZES]
    label_of = {size: label for label, size in SIZES}
    images = write_jpegs(tmp / "images", 12, classes=2, side=(16, 24))
    dvc2 = dvc2_paths()
    if isinstance(dvc2, str):
        say(f"[1] DVC 2.58 unavailable: {dvc2}")
        notes.append(f"DVC 2.58 reference unavailable: {dvc2}")
    what = ", ".join(f"{label_of[b]} x {n}" for b, n in plan)

    # --- 1 + 3 (default cache type): synchronous, ours vs DVC 2 --------------
    say(f"[1] ours (DVC 3): {what}")
    ours = run_exp(tmp, "ours", images, plan=plan, dvc=DVC3, yaml=OURS_YAML,
                   script="train_ckpt.py", stage_python=PY, floor=True)
    ref: dict[int, list[dict]] = {}
    watched: list[dict] = []
    if not isinstance(dvc2, str):
        say(f"[1] DVC 2.58 dvc.api.make_checkpoint: {what}")
        ref = run_exp(tmp, "dvc2", images, plan=plan, dvc=[dvc2[0]], yaml=DVC2_YAML,
                      script="train_dvc2.py", stage_python=dvc2[1])
        if not quick:
            say(f"[1] ours (Checkpointer, watched by DVC 2.58): 1 KB x {counts[KB]}")
            watched = run_exp(tmp, "watched", images, plan=[(KB, counts[KB])], dvc=[dvc2[0]],
                              yaml=DVC2_YAML, script="train_ckpt.py", stage_python=PY)[KB]

    for label, size in SIZES:
        o = median(steady(ours[size]))
        r = median(steady(ref[size])) if size in ref else float("nan")
        ratio = o / r if r == r else float("nan")
        goal = size == KB
        rows.append(Row(
            f"1 make_checkpoint blocking {label} (DVC 3 vs DVC 2.58 api)",
            fmt_s(o), fmt_s(r), f"{ratio:.3f}" if ratio == ratio else "n/a",
            "<= 1/30 (0.033)" if goal else "-",
            (yes_no(ratio <= 1 / 30) if ratio == ratio else "n/a") if goal else "n/a",
            {"ours_s": o, "ref_s": r, "ratio": ratio,
             "ours_all_s": [e["blocked"] for e in ours[size]],
             "ref_all_s": [e["blocked"] for e in ref.get(size, [])]}))
        first = " (the run's first checkpoint: {})".format(fmt_s(ours[size][0]["blocked"])) \
            if size == plan[0][0] else ""
        notes.append(f"[1] {label} ours{first}: {fmt_breakdown(breakdown(ours[size]))}")
        if size in ref:
            notes.append(f"[1] {label} DVC 2.58: write {fmt_s(median(steady(ref[size], 'write')))}"
                         f" + make_checkpoint() {fmt_s(median(steady(ref[size], 'signal')))} "
                         f"(all: {', '.join(fmt_s(e['blocked']) for e in ref[size])})")
    if watched:
        o, r = median(steady(watched)), median(steady(ref[KB]))
        rows.append(Row("1 ours under DVC 2.58's watcher 1 KB (vs DVC 2.58 api)", fmt_s(o),
                        fmt_s(r), f"{o / r:.3f}", "-", "n/a",
                        {"ours_s": o, "ref_s": r, "all_s": [e["blocked"] for e in watched]}))
    raw["sync"] = ours
    raw["dvc2"] = ref
    raw["watched"] = watched

    # --- 2: asynchronous ------------------------------------------------------
    say(f"[2] ours asynchronous: {what}")
    asy = run_exp(tmp, "async", images, plan=plan, dvc=DVC3, yaml=OURS_YAML,
                  script="train_ckpt.py", stage_python=PY, asynchronous=True)
    for label, size in SIZES:
        ev = asy[size]
        b, s = median(steady(ev)), median(steady(ev, "snapshot"))
        over = median(x - y for x, y in zip(steady(ev), steady(ev, "snapshot")))
        rows.append(Row(f"2 async make_checkpoint blocking {label} (vs snapshot alone)",
                        fmt_s(b), fmt_s(s), f"{'+' if over >= 0 else '-'}{fmt_s(abs(over))}",
                        "<= snapshot + 5 ms", yes_no(over <= 0.005),
                        {"blocked_s": b, "snapshot_s": s, "median_excess_s": over,
                         "blocked_all_s": [e["blocked"] for e in ev],
                         "snapshot_all_s": [e["snapshot"] for e in ev]}))
        # the background work of checkpoint k is logged with checkpoint k+1
        bg = [e["background"] for e in ev[2:] if e.get("background")]
        if bg:
            notes.append(f"[2] {label}: in the background, save "
                         f"{fmt_s(median(x.get('write', 0) for x in bg))}, record "
                         f"{fmt_s(median(x.get('record', 0) for x in bg))} per checkpoint")
    raw["async"] = asy

    # --- 3: 200 MB end to end vs floor, per cache type ------------------------
    n200 = counts[200 * MB]
    types = [("reflink,copy (default)", None, ours[200 * MB], {}),
             ("hardlink", "hardlink", None, {})]
    if not quick:
        types.append(("copy", "copy", None, {}))
    if reflink_supported(tmp):
        types.append(("reflink", "reflink", None, {}))
    else:
        notes.append(f"[3] reflink: not supported by this filesystem ({tmp}); the default "
                     "reflink,copy falls back to copy")
    measured: dict[str, dict[str, float]] = {}
    for label, cache_type, events, extra in types:
        if events is None:
            say(f"[3] ours 200 MB, {label} x {n200}")
            events = run_exp(tmp, f"cache-{cache_type}", images, plan=[(200 * MB, n200)],
                             dvc=DVC3, yaml=OURS_YAML, script="train_ckpt.py",
                             stage_python=PY, floor=True, extra_env=extra,
                             cache_type=cache_type)[200 * MB]
        ev = events[1:]
        total = median(e["blocked"] for e in ev)
        py_floor = median(e["floor"]["copyfile"] + e["floor"]["md5"] for e in ev)
        cli_floor = median(e["floor"]["cp"] + e["floor"]["md5sum"] for e in ev)
        fl = min(py_floor, cli_floor)
        parts = breakdown(events)
        measured[cache_type or "default"] = {**parts, "floor": fl}
        rows.append(Row(f"3 200 MB save+record, cache.type {label} (vs copy+md5 floor)",
                        fmt_s(total), fmt_s(fl), f"{total / fl:.2f}x", "<= 1.3x",
                        yes_no(total / fl <= 1.3),
                        {"total_s": total, "floor_s": fl, "floor_python_s": py_floor,
                         "floor_cli_s": cli_floor, "breakdown": parts}))
        pieces = {k: median(e["floor"][k] for e in ev) for k in ev[0]["floor"]}
        measured[cache_type or "default"].update({f"piece.{k}": v for k, v in pieces.items()})
        notes.append(f"[3] {label}: {fmt_breakdown(parts)}")
        notes.append(f"[3] {label}, pieces on the same bytes (each after os.sync): " + ", ".join(
            f"{k} {fmt_s(v)}" for k, v in pieces.items())
            + f"; floor = min(copyfile+md5 {fmt_s(py_floor)}, cp+md5sum {fmt_s(cli_floor)})")
        raw[f"cache-{cache_type or 'default'}"] = events
    return rows, notes, raw
