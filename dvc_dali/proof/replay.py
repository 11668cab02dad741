"""`dvc-dali doctor --verify [ROW]`: a recorded checkpoint's pipelines
restored and run without training, their batches compared with the digests
the run recorded after that checkpoint (batch_digests.py).

Each checkpoint's manifest holds its DALI pipelines serialized
(``pipe.serialize()``, base64, the entry's ``serialized``): a pipeline is
rebuilt from that with the saved state, on the CPU (GPU 0 when its
operators need one). A pipeline fed by a Python ``external_source``
callable cannot be rebuilt without the training script (DALI does not
serialize the callable): it is named and skipped. The pipelines run in
the stage's working directory, where the training ran, so that a relative
path in them (a reader's ``file_root``) names the same files; one that
cannot be rebuilt or run there (its data missing) is a problem, said with
its cause.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path
from typing import Callable

from . import batch_digests
from ..dali import dali_state
from ..format import store
from ..core.errors import DvcDaliError

KEY = "serialized"  # a pipeline entry's manifest field


def _snapshots(root: Path, path: str, row: str | None, tmp: Path
               ) -> tuple[list[store.Snapshot], dict]:
    """The checkpoint to replay (the workspace's, or ``row``'s), each rank's
    snapshot (none: no dvc-dali checkpoint), and its row. Every rank of a
    checkpoint of several processes: it was refused with the resume's
    advice, which named torchrun and `dvc-dali reset` (found by a sweep)."""
    ck, found = _checkpoint_dir(root, path, row, tmp)
    entries = store.latest(ck)
    ranks = len(entries) if entries else 1
    snaps = [store.read_snapshot(ck, rank=r, world_size=ranks) for r in range(ranks)]
    return [s for s in snaps if s is not None], found


def _checkpoint_dir(root: Path, path: str, row: str | None, tmp: Path) -> tuple[Path, dict]:
    """Where the checkpoint to replay is (a row's copied into ``tmp``), and its row."""
    if row is None:
        return root / path, {}
    from ..reading.loading import _resolve, revision_fs

    try:
        row.encode()
    except UnicodeEncodeError:  # bytes no name has (the codec's error was said instead)
        raise DvcDaliError(f"no row named {row!r}: row names are UTF-8 text. `dvc-dali show` "
                           "lists the rows.") from None
    sha, found, where = _resolve(row, str(root))
    try:
        fs, in_tree = revision_fs(where, sha, path)
        fs.get(in_tree, str(tmp / "ck"), recursive=True)
    except Exception as exc:
        raise DvcDaliError(f"cannot read {path} of row {row!r}: {exc}. `dvc-dali show` lists "
                           "the rows; `dvc exp pull <remote> <row>` fetches one.") from None
    return tmp / "ck", found or {}


def _recorded(root: Path, path: str, manifest: dict, row: dict
              ) -> tuple[dict[str, list[list[str]]], str]:
    """The digests of the batches after the checkpoint: beside it, else in
    the row its run recorded next; and, where its companion file could not
    all be read and no row holds them, why (``<file> <problem>``)."""
    log_id = batch_digests.log_id_of(manifest)
    if log_id is None:
        return {}, ""
    # where the resume looks: also where its run wrote them before a `.dvc`
    # appeared or went above the checkpoint (batch_digests.companion_dirs)
    places = [root / batch_digests.COMPANION, *batch_digests.companion_dirs(root / path, {})]
    log = batch_digests.find_log(list(dict.fromkeys(places)), log_id)
    why = ("" if log.problem in ("", batch_digests.MISSING) or log.path is None else
           f"{_shown(log.path, root)} {log.problem}")
    if log.found or not row.get("sha"):
        return log.found, why
    from ..reading.row_queries import rows

    children = (r for r in rows(repo=str(root)) if r.get("parent") == row["sha"])
    found = batch_digests.from_rows(path, children, log_id, str(root))
    return found, "" if found else why


def _shown(file: Path, root: Path) -> str:
    """``file`` relative to the repository where it is inside it."""
    try:
        return str(file.relative_to(root))
    except ValueError:
        return str(file)


def verify(root: Path, path: str, row: str | None, report: Callable[[bool, str], None],
           wdir: Path) -> None:
    """Replay each pipeline of the checkpoint in ``wdir`` (its stage's
    working directory) and report each comparison."""
    with tempfile.TemporaryDirectory(prefix="dvc-dali-verify-") as tmp:
        snaps, found = _snapshots(root, path, row, Path(tmp))
        if not snaps:
            _nothing_to_replay(path, row, report)
            return
        label = found.get("name") or row or f"{path} (workspace)"
        for rank, snap in enumerate(snaps):
            who = label if len(snaps) == 1 else f"{label} rank {rank}/{len(snaps)}"
            _verify_rank(root, path, who, snap, found, report, wdir)


def _verify_rank(root: Path, path: str, label: str, snap: store.Snapshot, found: dict,
                 report: Callable[[bool, str], None], wdir: Path) -> None:
    """One rank's pipelines, each against the digests its own stream recorded."""
    recorded, damaged = _recorded(root, path, snap.manifest, found)
    if damaged:  # what was read is compared; what was not is said
        report(False, f"{label}: the batch digests after step {snap.step}: {damaged}, so "
                      "the batches past those read from it are not verified")
    here = os.getcwd()
    os.chdir(wdir)  # DALI resolves a relative file_root against the current directory
    try:
        for name, entry in sorted(snap.manifest["pipelines"].items()):
            _verify_one(label, snap.step, name, entry, snap.pipeline_states.get(name, b""),
                        recorded.get(name, []), report, bool(damaged))
    finally:
        os.chdir(here)


def _nothing_to_replay(path: str, row: str | None, report: Callable[[bool, str], None]
                       ) -> None:
    """No dvc-dali checkpoint (no LATEST): the workspace's before the first
    run or after `dvc-dali reset` is said; a row asked for is a problem (a
    bare make_checkpoint() output holds no DALI state to replay)."""
    if row is None:
        print(f"--   {path} (workspace): not verified, it holds no dvc-dali checkpoint (before "
              "the first run, or after `dvc-dali reset`); `dvc-dali doctor --verify ROW` "
              "verifies a recorded row (`dvc-dali show` lists them)")
        return
    report(False, f"{path} of row {row!r}: not verified, it holds no dvc-dali checkpoint (no "
                  "LATEST: a bare make_checkpoint() output has no DALI state to replay); "
                  "`dvc-dali show` lists the rows of dvc-dali checkpoints")


def _skipped(entry: dict, digests: list[list[str]], step: int, damaged: bool) -> str | None:
    """Why a pipeline is not replayed (said as a note, not a problem; "": not
    said, the unreadable digests were), or None where it is."""
    if entry.get("kind", dali_state.KIND) != dali_state.KIND or KEY not in entry:
        return "not replayable here (a TensorFlow dataset, or saved before pipelines were " \
               "serialized)"
    if dali_state.has_python_source(entry["description"]):
        return ("fed by a Python external_source callable, which DALI does not serialize: "
                "resume the run to check it (the resume compares every batch)")
    if not digests:
        return "" if damaged else (f"no batch digests recorded after step {step} (the run "
                                   "ended or was killed right after it)")
    return None


def _verify_one(label: str, step: int, name: str, entry: dict, state: bytes,
                digests: list[list[str]], report: Callable[[bool, str], None],
                damaged: bool = False) -> None:
    where = f"{label}, pipeline {name!r}"
    skipped = _skipped(entry, digests, step, damaged)
    if skipped is not None:
        if skipped:
            print(f"--   {where}: {skipped}")
        return
    try:
        pipe = dali_state.rebuild(base64.b64decode(entry[KEY]), entry["description"], state)
    except Exception as exc:  # noqa: BLE001 (said as a problem, with its cause)
        report(False, _not_replayed(where, "it could not be rebuilt", exc))
        return
    checks = []
    for i, want in enumerate(digests):
        try:
            outputs = pipe.run()
        except Exception as exc:  # noqa: BLE001 (said as a problem, with its cause)
            report(False, _not_replayed(where, f"batch {i + 1} after step {step} could not be "
                                               "produced", exc))
            return
        try:
            got = batch_digests.digest(outputs)
        except Exception as exc:  # noqa: BLE001 (nothing told: not verified, said)
            got = batch_digests.failed_marker(exc)
        found = batch_digests.check(want, got)
        if found.outcome == batch_digests.DIFFERS:
            report(False, f"{where}: batch {i + 1} after step {step} differs from the one "
                          f"recorded: {'; '.join(found.lines)}")
            return
        checks.append(found)
    if all(c.outcome == batch_digests.MATCHED for c in checks):
        report(True, f"{where}: the {len(digests)} batches recorded after step {step} are "
                     "reproduced exactly")
        return
    # nothing differs, and not a proof either: said as such, not counted as a problem
    print(f"--   {where}: the batches recorded after step {step}: "
          f"{batch_digests.outcomes(checks, 1, 'batch')}; so not proven exact")


def _not_replayed(where: str, what: str, exc: Exception) -> str:
    return (f"{where}: not replayed: {what} ({_cause(exc)}). Is its data missing? Restore it "
            "(`dvc checkout`, or `dvc pull` where the cache lacks it) and run `dvc-dali doctor "
            "--verify` again")


def _cause(exc: Exception) -> str:
    """The line of ``exc`` that names the cause: a DALI error's follows
    'encountered:' (its first lines name the operator and its source line)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if "encountered:" in lines[:-1]:
        return lines[lines.index("encountered:") + 1]
    return lines[0] if lines else type(exc).__name__
