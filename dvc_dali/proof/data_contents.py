"""Proof at runtime: the contents of the files a pipeline's readers read.

A pipeline's description (dali_state) holds a digest of the names and sizes
under each ``file_root`` (and of a ``file_list``'s own text), so a fresh
checkout with new mtimes still resumes. A file rewritten in place with its old
size is invisible to it, and, when its mtime is kept, to DVC too. Here, where
a location's data (a file_root, a file_list's files, or files a reader names
one by one: FILE_ARGS) is at most ``DVC_DALI_CONTENT_DIGEST_MAX`` bytes (default
1 GB) and 10,000 files, a CRC-32 of every file's contents is computed on a
thread started when the pipeline is registered; it goes into the manifest
(the pipeline entry's optional ``contents``), joined by the first save that
needs it, and a resume compares it with the data now before the first step,
naming each file whose contents changed.

Each location's record: ``{"files": N, "bytes": B, "crc32": "<8 hex digits
per file>"}``, the files in the order of the walk the description's own
digest uses (a file_root's) or of the list's lines (a file_list's): the
description check, which runs first, proves the names and order equal, so
the i-th CRC belongs to the same file before and after.

Both digests depend on how a file_root is walked (dali_state.WALKS). The
pipeline entry names the walk (dali_state.WALK_KEY); a digest of another walk
is made again with it where this release knows it, and is otherwise not
verified, never "changed" (``verdict``). One without the name was written by
a release before walks were named, by one of UNNAMED_WALKS: where the data
now, walked as one of those releases walked it, gives the recorded digest
but this release's walk does not (a class folder that is a link, which
releases before f8b2f2a skipped), it is not verified; where no walk gives it,
the data changed.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from typing import Any, Callable

from ..core.errors import PipelineMismatchError
from ..dali import dali_state
from ..core.log import logger
from ..core.process_state import STATE

KEY = "contents"  # the pipeline entry's manifest field
LOCATION_ARGS = ("file_root", "file_list")
# readers that name their files one by one (webdataset's paths, TFRecord's
# path and index_paths, numpy's files, COCO's annotations_file, the video
# reader's filenames, caffe's LMDB directory (path), ...); a directory named so
# is read whole, as a file_root is
FILE_ARGS = ("files", "paths", "path", "index_paths", "index_path", "annotations_file",
             "filenames")
# nemo_asr's manifests: JSON lines naming the audio files (audio_filepath)
MANIFEST_ARGS = ("manifest_filepaths",)
# LMDB's lock file holds readers' slots, not data: any reader that locks rewrites it
_NOT_DATA = frozenset({"lock.mdb"})
MAX_FILES = 10_000  # 8 hex digits a file in every manifest (80 KB at most); a resume
# reads every file: 100,000 small files would cost seconds
_CHUNK = 1 << 20
_SHOWN = 5  # changed files named in a refusal
_UNREADABLE = "00000000"  # a file that cannot be read (a dangling link): no bytes
MATCHED, CHANGED, NOT_VERIFIED = "matched", "changed", "not verified"
# the walks a manifest that names none may have been written with
UNNAMED_WALKS = ("walk0", "walk1", "walk2", "walk3")
OLDER_WALK = "recorded by an older dvc-dali that walked the data another way"


def locations(description: dict[str, Any]) -> dict[str, tuple[Any, str | None]]:
    """{"<operator>.<arg>": (path or paths, file_root of the same operator)}
    of the readers' file_root, file_list and file-naming arguments."""
    found: dict[str, tuple[Any, str | None]] = {}
    for inst, op in sorted(description.get("operators", {}).items()):
        args = op.get("args", {})
        root = args.get("file_root")
        root = root if isinstance(root, str) and root else None
        for arg in LOCATION_ARGS + FILE_ARGS + MANIFEST_ARGS:
            value = args.get(arg)
            named = isinstance(value, list) and value and all(isinstance(v, str) for v in value)
            if (isinstance(value, str) and value) or (arg not in LOCATION_ARGS and named):
                found[f"{inst}.{arg}"] = (value, root)
    return found


def verdict(recorded: Any, walk: str | None, now: Callable[[str], Any]) -> tuple[str, str]:
    """How a recorded data digest ends: (MATCHED, CHANGED or NOT_VERIFIED,
    why it is not verified). ``walk``: the walk the manifest names (None: it
    names none); ``now(walk)``: the data now, digested with that walk (None:
    it cannot be)."""
    if walk is not None and walk not in dali_state.WALKS:
        return NOT_VERIFIED, f"recorded by a dvc-dali that walks the data another way ({walk})"
    if walk is not None:  # made again as it was made
        return (MATCHED, "") if recorded == now(walk) else (CHANGED, "")
    if recorded == now(dali_state.WALK):
        return MATCHED, ""
    others = [now(w) for w in UNNAMED_WALKS if w != dali_state.WALK]
    if recorded in others or None in others:  # the data as an older walk saw it, or unknown
        return NOT_VERIFIED, OLDER_WALK
    return CHANGED, ""  # another digest whichever walk made it


def data_verdicts(old: dict[str, Any], new: dict[str, Any],
                  walk: str | None) -> dict[str, tuple[str, str]]:
    """{location: verdict()} of each data digest of description ``old`` (the
    checkpoint's, of ``walk``) that is not this release's digest in ``new``."""
    old_data, new_data = old.get("data") or {}, new.get("data") or {}
    found = {}
    for where, digest in old_data.items():
        if where not in new_data or (digest == new_data[where] and walk in (None, dali_state.WALK)):
            continue

        def now(w: str, where: str = where) -> str | None:
            if w == dali_state.WALK:
                return new_data[where]
            return dali_state.data_digest(new, where, w)

        found[where] = verdict(digest, walk, now)
    return found


def _named(value: Any, root: str | None,
           walk: str = dali_state.WALK) -> list[tuple[str, str, int]]:
    """The files an argument names one by one (relative ones under file_root)."""
    out = []
    for name in [value] if isinstance(value, str) else value:
        path = os.path.join(root, name) if root and not os.path.isabs(name) else name
        if os.path.isdir(path):  # caffe's LMDB: every file in it (it failed: "a directory")
            out += [f for f in dali_state.data_files(path, f"{name.rstrip('/')}/", walk)
                    if os.path.basename(f[0]) not in _NOT_DATA]
        else:
            out.append((name, path, os.stat(path).st_size))
    return out


def _manifested(value: Any) -> list[tuple[str, str, int]]:
    """nemo_asr's manifests and the audio files their lines name
    (``audio_filepath``: absolute, or relative to the manifest's directory)."""
    out = []
    for manifest in [value] if isinstance(value, str) else value:
        out.append((manifest, manifest, os.stat(manifest).st_size))
        with open(manifest, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                audio = json.loads(line).get("audio_filepath") if line.strip() else None
                if isinstance(audio, str) and audio:
                    path = os.path.join(os.path.dirname(manifest), audio)
                    out.append((audio, path, os.stat(path).st_size))
    return out


def _listed(file_list: str, root: str | None) -> list[tuple[str, str, int]]:
    """The files a DALI file_list names (``<path> <label>`` a line), relative
    to file_root if given, else to the list's directory."""
    base = root or os.path.dirname(file_list)
    out = []
    with open(file_list, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            name = line.strip().rsplit(None, 1)[0] if len(line.split()) > 1 else line.strip()
            if name:
                path = os.path.join(base, name)
                out.append((name, path, os.stat(path).st_size))
    return out


def _listing(where: str, path: Any, root: str | None,
             walk: str = dali_state.WALK) -> list[tuple[str, str, int]]:
    """(name, path, size) of the files behind location ``where``, in its order."""
    if where.endswith(".file_list"):
        return _listed(path, root)
    if where.endswith(".file_root"):
        return dali_state.data_files(path, walk=walk)
    if where.endswith(MANIFEST_ARGS):
        return _manifested(path)
    return _named(path, root if where.endswith(".files") else None, walk)


def _printable(name: str) -> str:
    """A file name a message can print: one that is not UTF-8 with its bytes escaped."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _crc(path: str) -> str:
    from ..format.store import crc32_function  # ISA-L's where installed: the same CRC-32, faster

    crc32, crc = crc32_function(), 0
    # never blocked on a FIFO a reader's argument names, never an endless device
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return _UNREADABLE
        while chunk := fh.read(_CHUNK):
            crc = crc32(chunk, crc)
    return f"{crc:08x}"


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


class Contents:
    """The content digests of one pipeline's data, computed on a thread of
    its own from registration on; :meth:`result` joins it."""

    def __init__(self, name: str, description: dict[str, Any], limit: int) -> None:
        self.name = name
        self.limit = limit
        self._locations = locations(description) if limit > 0 else {}
        self._records: dict[str, dict[str, Any]] = {}
        self._files: dict[str, list[str]] = {}  # location -> names, for messages
        self._crcs: dict[str, str] = {}  # path -> CRC, for another walk's record
        self._walked: dict[tuple[str, str], dict[str, Any] | None] = {}  # (where, walk)
        # data locations whose digest is of another walk ({location: why}), said once
        self.unverified: dict[str, str] = {}
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"dvc-dali-contents-{name}")
        if self._locations:
            self._thread.start()

    def _run(self) -> None:
        for where, (path, root) in self._locations.items():
            try:
                files = _listing(where, path, root)
                record = self._record(where, files)
            except (OSError, ValueError, AttributeError) as exc:  # DALI's build names a
                # missing file itself; a manifest that is not JSON lines of objects
                logger.warning("pipeline %r: could not read the data of %s to digest its "
                               "contents (%s); a resume will not check their contents",
                               self.name, where, exc)
                continue
            if record is None:
                self._say_over_limit(where, path, files)
                continue
            self._files[where] = record.pop("names")
            self._records[where] = record

    def _record(self, where: str, files: list[tuple[str, str, int]]) -> dict[str, Any] | None:
        """The record of these files (and their names); None over the limits."""
        total = sum(max(size, 0) for _, _, size in files)
        if total > self.limit or len(files) > MAX_FILES:
            return None
        crcs = []
        for _, p, size in files:
            if p not in self._crcs:
                self._crcs[p] = _crc(p) if size >= 0 else _UNREADABLE
            crcs.append(self._crcs[p])
        return {"files": len(files), "bytes": total, "crc32": "".join(crcs),
                "names": [rel for rel, _, _ in files]}

    def _say_over_limit(self, where: str, path: Any, files: list[tuple[str, str, int]]) -> None:
        if (where, str(path)) not in STATE.said_digest_limit:  # once per process
            STATE.said_digest_limit.add((where, str(path)))
            logger.info(
                "pipeline %r: the data of %s (%s) is %s in %d files, over "
                "DVC_DALI_CONTENT_DIGEST_MAX=%d bytes (or %d files): a resume checks "
                "its files' names and sizes, not their contents",
                self.name, where, path, _size(sum(max(s, 0) for _, _, s in files)),
                len(files), self.limit, MAX_FILES)

    def result(self) -> dict[str, dict[str, Any]]:
        """{location: record} of every location under the threshold."""
        if self._thread.ident is not None:  # started
            self._thread.join()
        return self._records

    def _walk(self, where: str, walk: str) -> dict[str, Any] | None:
        """Location ``where``'s record were its data walked with ``walk``, with
        the names (None: over the limits, or unreadable)."""
        if walk == dali_state.WALK:
            record = self.result().get(where)
            return record and {**record, "names": self._files[where]}
        if (where, walk) not in self._walked:
            path, root = self._locations[where]
            try:
                self._walked[where, walk] = self._record(where, _listing(where, path, root, walk))
            except (OSError, ValueError, AttributeError):
                self._walked[where, walk] = None
        return self._walked[where, walk]

    def changed(self, saved: dict[str, Any], walk: str | None = dali_state.WALK) -> list[str]:
        """'<location> (<path>): changed a, b' for each location whose saved
        record (of ``walk``: see :func:`verdict`) differs from the data now
        (one checked on both sides); a location whose record is of another
        walk goes to ``unverified``."""
        lines = []
        now = self.result()
        for where, old in sorted(saved.items()):
            if now.get(where) is None or where not in self._locations:
                continue

            def digest(w: str, where: str = where) -> tuple[int, str] | None:
                record = self._walk(where, w)
                return record and (record["files"], record["crc32"])

            outcome, why = verdict((old["files"], old["crc32"]), walk, digest)
            if outcome == NOT_VERIFIED:
                self.unverified.setdefault(where, why)
            elif outcome == CHANGED:
                lines.append(self._changed_line(where, old, walk))
        return lines

    def _changed_line(self, where: str, old: dict[str, Any], walk: str | None) -> str:
        """The files of a changed location, by name where a walk lists as many
        as were recorded (the recorded walk's, else this release's first)."""
        path = self._locations[where][0]
        path = path if isinstance(path, str) else ", ".join(path[:3]) + (
            ", ..." if len(path) > 3 else "")
        walks = [walk] if walk else [dali_state.WALK, *UNNAMED_WALKS]
        same = [r for r in map(lambda w: self._walk(where, w), walks)
                if r and r["files"] == old["files"]]
        if not same:
            return f"{where} ({path}): {old['files']} files -> {self._records[where]['files']}"
        new = same[0]
        names = [new["names"][i] for i in range(new["files"])
                 if old["crc32"][8 * i:8 * i + 8] != new["crc32"][8 * i:8 * i + 8]]
        more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
        shown = ", ".join(_printable(n) for n in names[:_SHOWN])
        return f"{where} ({path}): changed {shown}{more}"


def start(name: str, description: dict[str, Any], limit: int) -> Contents:
    """Begin digesting pipeline ``name``'s data (``limit``: the byte threshold)."""
    return Contents(name, description, limit)


def check(contents: Contents, saved_entry: dict[str, Any], manifest_path: str,
          inexact: bool) -> bool:
    """Refuse (or, with DVC_DALI_INEXACT=1, say) data whose contents changed
    since the checkpoint was written; True where a change was let through.
    Data whose digests are of another walk is said not verified, once."""
    saved = saved_entry.get(KEY)
    lines = []
    if saved and contents.limit <= 0:
        logger.warning("pipeline %r: the contents of its data, digested when %s was written, "
                       "are not checked (DVC_DALI_CONTENT_DIGEST_MAX=0): this resume checks "
                       "their names and sizes only", contents.name, manifest_path)
    elif saved:
        lines = contents.changed(saved, saved_entry.get(dali_state.WALK_KEY))
    _say_unverified(contents, manifest_path)
    if not lines:
        return False
    what = "\n  ".join(lines)
    if inexact:
        logger.warning("pipeline %r: the contents of its data changed since %s was written "
                       "(%s); continuing on purpose (DVC_DALI_INEXACT=1): this run is no longer "
                       "exact", contents.name, manifest_path, "; ".join(lines))
        return True
    raise PipelineMismatchError(
        f"{manifest_path}: pipeline {contents.name!r} reads files whose contents changed "
        "since the checkpoint was written, so DALI would resume on "
        f"other data and produce other batches:\n  {what}\nRestore the data as it was (`dvc "
        "checkout`, `git checkout`) to resume, or start over on the new data with `dvc-dali "
        "reset` (or Checkpointer(..., resume=False)); to continue on purpose, knowing the run "
        "is no longer exact, set DVC_DALI_INEXACT=1.")


def changed_in(contents: Contents | None, entry: dict[str, Any]) -> list[str]:
    """Contents.changed of a manifest's pipeline entry (its records, its walk)."""
    if contents is None:
        return []
    return contents.changed(entry.get(KEY) or {}, entry.get(dali_state.WALK_KEY))


def _say_unverified(contents: Contents, manifest_path: str) -> None:
    """One line for the data whose digests (names and sizes, contents) could
    not be compared: no refusal, no proof."""
    if not contents.unverified:
        return
    by_why: dict[str, list[str]] = {}
    for where, why in sorted(contents.unverified.items()):
        by_why.setdefault(why, []).append(where)
    logger.warning("pipeline %r: its data's digests in %s are not verified: %s; so this "
                   "resume is not proven exact",
                   contents.name, manifest_path, "; ".join(
                       f"{', '.join(where)} ({why})" for why, where in by_why.items()))
    contents.unverified.clear()  # said once
