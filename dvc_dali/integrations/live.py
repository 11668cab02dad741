"""DVCLive resumed in step with the checkpoint (the only DVCLive coupling).

A run killed after its last recorded checkpoint may have logged later rows,
which the resumed run logs again; DVCLive writes metrics.json in place, so a
kill can leave it empty, and DVCLive 3.49 repeats a row when resuming from a
step-0 summary. Trimming the history to the checkpoint's step and setting
``live.step`` avoids all three. An asynchronous checkpoint's row is
recorded from the files as they are then, so the Live waits for the
checkpoint in flight before it writes any.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Optional

from ..core import atomic_file, exit_hooks
from ..core.errors import RecordError


def _value(text: str) -> float | str:
    """A logged value as DVCLive wrote it: a number, or text (which
    `log_metric` takes too: a string metric)."""
    try:
        return float(text)
    except ValueError:
        return text


def _trim_history(plots: Path, step: int) -> dict[str, float | str]:
    """Drop rows after ``step`` (and rows cut short); return the last values."""
    last: dict[str, float | str] = {}
    for tsv in sorted(plots.rglob("*.tsv")):
        lines = tsv.read_text(encoding="utf-8").splitlines(keepends=True)
        if not lines:
            continue
        header = lines[0].rstrip("\n").split("\t")
        keep = lines[:1]
        for row in lines[1:]:
            fields = row.rstrip("\n").split("\t")
            if not row.endswith("\n") or len(fields) != len(header) or "step" not in header:
                continue
            try:
                if int(fields[header.index("step")]) <= step:
                    keep.append(row)
            except ValueError:
                continue
        if keep != lines:
            tsv.write_text("".join(keep), encoding="utf-8")
        name = tsv.relative_to(plots).with_suffix("").as_posix()
        leaf = name.rsplit("/", 1)[-1]
        if len(keep) > 1 and leaf in header:
            last[name] = _value(keep[-1].rstrip("\n").split("\t")[header.index(leaf)])
    return last


def resume_live(step: int, resumed: bool, dir: str = "dvclive",
                before_write: Optional[Callable[[], Any]] = None, **kwargs: Any):
    """A ``dvclive.Live`` whose history ends at ``step`` and whose next row is ``step``'s.

    DVC records the experiments (``save_dvc_exp=False``), and the stage
    declares the metrics and plots (``dvcyaml=False``), unless overridden.
    ``before_write``: see `_wait_before_writes`.
    """
    from dvclive import Live

    live_dir = Path(dir)
    if resumed and live_dir.is_dir():
        last = _trim_history(live_dir / "plots" / "metrics", step)
        summary = live_dir / "metrics.json"
        try:
            json.loads(summary.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            nested: dict[str, Any] = {"step": step}
            for name, value in last.items():
                node = nested
                *parents, leaf = name.split("/")
                for part in parents:
                    node = node.setdefault(part, {})
                node[leaf] = value
            atomic_file.replace_whole(summary, json.dumps(nested, indent=4))
    kwargs.setdefault("save_dvc_exp", False)
    kwargs.setdefault("dvcyaml", False)
    live = Live(dir=dir, resume=resumed, **kwargs)
    live.step = step
    _skip_unsent_studio_data(live)
    _signal_steps_unsynced(live)
    atexit.register(exit_hooks.this_process_only(_close_its_repo, weakref.ref(live)))
    if before_write is not None:
        _wait_before_writes(live, before_write)
    return live


#: the Live methods that write files a row holds (DVCLive 3.49; log_metric
#: appends to its plot's .tsv at once)
_WRITERS = ("log_metric", "next_step", "sync", "make_summary", "make_report", "make_dvcyaml",
            "log_image", "log_plot", "log_sklearn_plot", "log_params", "log_artifact", "cache",
            "end")


def _wait_before_writes(live: Any, guard_ref: Callable[[], Any]) -> None:
    """Each writing method first waits for the checkpoint in flight: with
    ``asynchronous=True`` a loop that logs the next step's metrics without
    ``ck.wait()`` would otherwise have the row of the checkpoint still being
    recorded hold them; DVCLive's system monitor writes from a thread of its
    own. ``guard_ref``: a weak reference to the Checkpointer's
    ``_row_file_write`` (a Live kept must not keep its directory locked)."""
    owner = threading.get_ident()

    def waiting(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            guard = guard_ref()
            try:
                if guard is None:
                    return method(*args, **kwargs)
                with guard(threading.get_ident() == owner):
                    return method(*args, **kwargs)
            except OSError as exc:
                if exc.errno is None:
                    raise
                raise _write_failed(live, method.__name__, exc) from exc
        return call

    for name in _WRITERS:
        method = getattr(live, name, None)
        if callable(method):
            setattr(live, name, waiting(method))


def _write_failed(live: Any, method: str, exc: OSError) -> RecordError:
    """A DVCLive file that cannot be written (a full disk, a size limit, a
    directory made read-only), in one line: the row of this step cannot hold
    its metrics, and the rows recorded before it are intact. Where the run's
    directory was deleted under it (`dvc queue kill --force`), that is said
    instead, with the row kept and how to resume it: a loop that logs before
    it asks should_save was told to free disk space (found by a sweep)."""
    exit_hooks.refuse_deleted_run(None)
    where = exc.filename or getattr(live, "dir", "dvclive")
    return RecordError(
        f"{where}: DVCLive's {method}() could not write there ({exc.strerror}), so the run "
        "stops before its next row; the rows recorded before are intact. Free disk space or "
        "fix that directory's permissions, then `dvc exp run` again: it resumes from the last "
        "recorded row.")


def _close_its_repo(live_ref: Callable[[], Any]) -> None:
    """At exit: the DVC repository DVCLive opened is closed while the
    interpreter still runs. A run that ends on an error keeps the Live alive
    to the interpreter's last moment (its frames hold it), where dulwich's
    finalizers print "Exception ignored ... sys.meta_path is None" tracebacks
    after the error's one line."""
    live = live_ref()
    repo = getattr(live, "_dvc_repo", None) if live is not None else None
    if repo is not None:
        try:
            repo.close()
        except Exception:  # at exit: nothing more to do with it
            pass


def _signal_steps_unsynced(live: Any) -> None:
    """DVCLive's ``next_step`` ends by telling VS Code's DVC extension that a
    step is done: a small file under ``.dvc/tmp/exps/run``, written and then
    fsynced, on the training thread at every step: 1-4 ms here, more than
    the rest of ``next_step``. The extension watches it on this machine,
    which sees a written file without the fsync (that only matters after a
    crash of the machine, when the step signalled is stale anyway). So this
    Live's ``next_step`` writes the same file with the same contents, at the
    same moment, without it. Where DVCLive's functions are not those this
    was written against (another DVCLive), its own ``next_step`` is kept."""
    try:
        from dvclive import live as live_module
        from dvclive import vscode
        find_root = vscode._find_non_queue_root  # noqa: SLF001 - DVCLive 3.49's own
        signal_path = vscode._dvclive_step_completed_signal_file  # noqa: SLF001
        run_dir = vscode._dvc_exps_run_dir  # noqa: SLF001
    except (ImportError, AttributeError):
        return
    if getattr(live_module, "mark_dvclive_step_completed", None) \
            is not vscode.mark_dvclive_step_completed:
        return
    sync = live.sync

    def next_step() -> None:
        live.step = live.step  # DVCLive's: a Live that never stepped starts at 0
        sync()
        root = find_root()
        if root:
            os.makedirs(run_dir(root), exist_ok=True)
            with open(signal_path(root), "w", encoding="utf-8") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "step": live.step}, sort_keys=True,
                                    ensure_ascii=False))
        live.step += 1

    next_step.__doc__ = type(live).next_step.__doc__
    live.next_step = next_step


def _skip_unsent_studio_data(live: Any) -> None:
    """Where Studio is not configured, DVCLive (3.49) still gathers at each
    ``next_step`` what it would post to it: params.yaml and every metrics
    file parsed whole, ~0.8 ms a step at 40 rows and growing with the
    history; then it drops it. That gathering is skipped (as is the thread
    that would post it). Configured, nothing changes."""
    skipped = getattr(live, "_studio_events_to_skip", None)
    if isinstance(skipped, set) and "data" in skipped \
            and getattr(live, "_studio_queue", False) is None:
        live.post_data_to_studio = lambda: None
