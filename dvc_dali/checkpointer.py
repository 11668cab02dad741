"""The Checkpointer: build pipelines fresh or restored, save, resume."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from . import arrays as arrays_mod
from . import dali_state, dirlock, distributed, signal, store
from ._version import __version__
from .errors import CheckpointCorruptError, PipelineMismatchError


def _array_module():
    """CuPy when a GPU is usable, so GPU arrays come back on the GPU."""
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:
        return None


class Checkpointer:
    """Saves and restores the exact state of a training run.

    ``path`` is the directory declared as the stage's checkpoint output.
    On construction the latest complete checkpoint in it (if any) is read and
    verified; :attr:`step`, :attr:`arrays` and :attr:`metadata` hand it back,
    and :meth:`pipeline` builds each pipeline restored to its saved position.
    ``resume=False`` ignores what is there (it is replaced at the next save).

    ``params`` (JSON: the run's hyperparameters, without the step count) and
    ``total_steps`` decide what a rerun does: an unfinished run resumes, even
    with changed params (a changed *pipeline* is refused when it is built); a
    finished run (step >= its total_steps) resumes only with the same params
    and at least as many steps (training further, or nothing left to do),
    otherwise a new run starts from step 0.

    ``asynchronous=True``: :meth:`make_checkpoint` returns once the state is
    captured (DALI states read, arrays copied in memory); writing and
    recording go on in a background thread, one at a time, in order; the
    next call, :meth:`wait` and process exit wait for it.

    ``keep_last``/``keep_best`` prune the experiment's checkpoint rows after
    each recording (see :func:`dvc_dali.make_checkpoint`); default: keep all.
    """

    def __init__(self, path: str | os.PathLike = "checkpoint", *, resume: bool = True,
                 params: dict[str, Any] | None = None, total_steps: int | None = None,
                 keep_last: int | None = None, keep_best: str | None = None,
                 asynchronous: bool = False) -> None:
        self.path = Path(path)
        self.asynchronous = asynchronous
        self._worker: Any = None  # the one background save in flight, if any
        self.keep_last, self.keep_best = keep_last, keep_best
        self.params = dict(params or {})
        self.total_steps = total_steps
        self._pipes: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._iterators: list[Any] = []
        self._dynamic: dict[str, Any] = {}
        if signal.mode() == "self":
            # Before any training step: a stage DVC 3 cannot resume is refused now.
            from . import dvc_recorder

            dvc_recorder.check_stage(str(self.path))
        self.rank, self.world_size = distributed.world()
        if asynchronous and self.world_size > 1:
            raise ValueError("asynchronous=True is not supported with torch.distributed: the "
                             "ranks' saves must meet at a barrier in the training thread")
        self._lock = dirlock.acquire(self.path, self.rank)  # one writer per directory
        self.timings: dict[str, float] = {}
        t0 = time.perf_counter()
        self._snapshot = (store.read_snapshot(self.path, _array_module(), self.rank,
                                              self.world_size) if resume else None)
        self.timings["restore_s"] = time.perf_counter() - t0
        if self.world_size > 1 and self._snapshot is not None:
            print(f"dvc-dali: rank {self.rank}/{self.world_size} read step {self.step} in "
                  f"{self.timings['restore_s'] * 1000:.1f} ms", file=sys.stderr)
        if self._snapshot is not None:
            self._decide_resume()

    def _param_changes(self) -> list[str]:
        old = self._snapshot.manifest.get("run", {}).get("params", {})
        return [f"{k}: {json.dumps(old.get(k, '<absent>'))} -> "
                f"{json.dumps(self.params.get(k, '<absent>'))}"
                for k in sorted(set(old) | set(self.params)) if old.get(k) != self.params.get(k)]

    def _decide_resume(self) -> None:
        """Resume an unfinished run (params may change; the pipeline may not);
        a finished run is continued only for more steps with the same params,
        else a new run starts: nothing is lost, the finished run is recorded."""
        run = self._snapshot.manifest.get("run", {})
        step, total = self._snapshot.step, run.get("total_steps")
        changes = self._param_changes() if "params" in run else []
        finished = isinstance(total, int) and step >= total
        if finished and (changes or self.total_steps is None or self.total_steps < step):
            why = (f"params changed ({'; '.join(changes)})" if changes else
                   f"total_steps is {self.total_steps}, fewer than {step}")
            print(f"dvc-dali: {self.path} holds a finished run (step {step} of {total}); {why}: "
                  "starting a new run from step 0 (the finished one stays recorded)",
                  file=sys.stderr)
            self._snapshot = None
        elif changes:
            print(f"dvc-dali: resuming {self.path} at step {step} with changed params: "
                  + "; ".join(changes), file=sys.stderr)

    def close(self) -> None:
        """Wait for a checkpoint in flight and let another process write here."""
        self.wait()
        self._lock.release()

    def __del__(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()

    # -- what was restored -------------------------------------------------
    @property
    def resumed(self) -> bool:
        """True when a checkpoint was found and is being resumed."""
        return self._snapshot is not None

    @property
    def step(self) -> int:
        """The step saved in the checkpoint, 0 for a fresh start."""
        return self._snapshot.step if self._snapshot else 0

    @property
    def arrays(self) -> dict[str, Any]:
        """The arrays saved with the checkpoint (empty for a fresh start)."""
        return dict(self._snapshot.arrays) if self._snapshot else {}

    @property
    def metadata(self) -> dict[str, Any]:
        """The JSON metadata saved with the checkpoint (empty for a fresh start)."""
        return dict(self._snapshot.manifest["metadata"]) if self._snapshot else {}

    # -- pipelines ---------------------------------------------------------
    def pipeline(self, name: str, source: Any, **kwargs: Any):
        """Build pipeline ``name``, restored from the checkpoint when resuming.

        ``source`` is a ``@pipeline_def`` function, called with ``kwargs``
        (batch_size, num_threads, device_id, seed and its own arguments), or
        an unbuilt ``Pipeline``. Returns the built pipeline.
        """
        if name in self._pipes:
            raise ValueError(f"pipeline {name!r} is already registered with this Checkpointer")
        pipe = dali_state.prepare(source, kwargs, None)
        dali_state.check_restorable(pipe, name)
        description = dali_state.describe(pipe)
        state = self._saved_state(name, description)
        if state is not None:
            dali_state.restore_at_build(pipe, state)
        try:
            pipe.build()
        except RuntimeError as exc:
            if state is None:
                raise
            raise CheckpointCorruptError(
                f"{self._state_file(name)}: DALI could not restore pipeline {name!r} from it "
                f"({str(exc).splitlines()[0]}). Restore an earlier checkpoint with "
                "`dvc exp apply <row>`, or start over with `dvc-dali reset`.") from exc
        dali_state.warn_unnamed(name, dali_state.read_state(dali_state.capture(pipe), name))
        self._pipes[name] = (pipe, description)
        return pipe

    def _state_file(self, name: str) -> Path:
        return self._snapshot.path / self._snapshot.manifest["pipelines"][name]["file"]

    def _saved_state(self, name: str, description: dict[str, Any]) -> bytes | None:
        if self._snapshot is None:
            return None
        saved = self._snapshot.manifest["pipelines"]
        manifest = self._snapshot.path / store.MANIFEST
        if name not in saved:
            raise PipelineMismatchError(
                f"{manifest}: has no pipeline {name!r} (it holds {sorted(saved) or 'none'}), so "
                f"{name!r} cannot resume where the others do. Register the pipelines under "
                "the names they were saved with, or start over with `dvc-dali reset`.")
        old = saved[name].get("description")
        if not isinstance(old, dict):
            raise CheckpointCorruptError(f"{manifest}: pipeline {name!r} has no description; "
                                         "start over with `dvc-dali reset`.")
        diff = dali_state.differences(old, description)
        if diff:
            raise PipelineMismatchError(
                f"{manifest}: pipeline {name!r} differs from the one that wrote the checkpoint, "
                "and DALI would restore into it silently, producing other batches:\n  "
                + "\n  ".join(diff)
                + "".join(f"\n  param {c}" for c in self._param_changes())
                + "\nRun with the saved settings to resume, or start over with "
                "`dvc-dali reset` (or Checkpointer(..., resume=False)).")
        state = self._snapshot.pipeline_states[name]
        dali_state.read_state(state, str(self._state_file(name)))
        return state

    def iterator(self, iterator_class: Any, pipelines: Any, *args: Any, **kwargs: Any):
        """A framework iterator (``DALIGenericIterator``,
        ``DALIClassificationIterator``, JAX's) over pipelines built with
        :meth:`pipeline`, saved through ``iterator.checkpoints()`` so its
        epoch counters come back too.

        When resuming, ``prepare_first_batch=False`` is used: with DALI's
        default, a checkpoint taken after an epoch's last batch restores into
        an iterator that skips the end of that epoch.
        """
        pipes = list(pipelines) if isinstance(pipelines, (list, tuple)) else [pipelines]
        known = {id(p) for p, _ in self._pipes.values()}
        if any(id(p) not in known for p in pipes):
            raise ValueError("build the iterator's pipelines with Checkpointer.pipeline() "
                             "first, so they are restored and saved")
        if self.resumed:
            kwargs["prepare_first_batch"] = False
        it = iterator_class(pipes, *args, **kwargs)
        self._iterators.append(it)
        return it

    def dynamic(self, name: str = "dynamic"):
        """A DALI dynamic-mode ``Checkpoint`` saved with this checkpoint.

        Register dynamic-mode readers and RNGs on it
        (``register(op, "name")``); when resuming, each gets its saved state
        at registration.
        """
        from nvidia.dali.experimental.dynamic import checkpoint as dyn

        if name in self._dynamic:
            return self._dynamic[name]
        ckpt = dyn.Checkpoint()
        saved = self._snapshot.dynamic_states if self._snapshot else {}
        if self._snapshot is not None:
            if name not in saved:
                raise PipelineMismatchError(
                    f"{self._snapshot.path / store.MANIFEST}: has no dynamic-mode state "
                    f"{name!r} (it holds {sorted(saved) or 'none'}); use the saved name, or "
                    "start over with `dvc-dali reset`.")
            try:
                ckpt.deserialize(saved[name])
            except (ValueError, KeyError, TypeError) as exc:
                raise CheckpointCorruptError(
                    f"{self._snapshot.path}: dynamic-mode state {name!r} is not a DALI "
                    f"dynamic checkpoint ({exc}); start over with `dvc-dali reset`.") from None
        self._dynamic[name] = ckpt
        return ckpt

    def live(self, dir: str = "dvclive", **kwargs: Any):
        """A ``dvclive.Live`` resumed in step with this checkpoint: history
        after :attr:`step` dropped, ``live.step == self.step``."""
        from .live import resume_live

        return resume_live(self.step, self.resumed, dir, **kwargs)

    # -- saving ------------------------------------------------------------
    def save(self, step: int, arrays: dict[str, Any] | None = None,
             metadata: dict[str, Any] | None = None) -> Path:
        """Write a checkpoint of every registered pipeline, iterator and
        dynamic-mode state, plus ``arrays`` (NumPy, CuPy or torch arrays, or
        dicts/lists of them such as a ``state_dict()``) and JSON ``metadata``;
        returns the snapshot directory."""
        self.wait()
        return self._write(self._capture(step, arrays, metadata))

    def _capture(self, step: int, arrays: dict[str, Any] | None,
                 metadata: dict[str, Any] | None) -> dict[str, Any]:
        """Everything a snapshot needs, read now (DALI states) or referenced."""
        # A pipeline under a framework iterator is saved through the iterator:
        # pipe.checkpoint() would lose the iterator's counters.
        through_iterator = {}
        for it in self._iterators:
            for pipe, state in zip(it._pipes, it.checkpoints()):
                through_iterator[id(pipe)] = state
        pipelines = {}
        for name, (pipe, description) in self._pipes.items():
            state = through_iterator.get(id(pipe)) or dali_state.capture(pipe)
            info = dali_state.read_state(state, name)
            pipelines[name] = {
                "state": state,
                "fingerprint": dali_state.fingerprint(description),
                "description": description,
                "iter": info["iter"],
                "epoch_idx": info["epoch_idx"],
            }
        versions = {
            "dvc_dali": __version__,
            "dali": dali_state.dali_version(),
            "numpy": np.__version__,
            "python": platform.python_version(),
        }
        run = {"params": self.params, "total_steps": self.total_steps}
        dynamic = {}
        for name, ckpt in self._dynamic.items():
            ckpt.collect()
            dynamic[name] = ckpt.serialize()
        return dict(step=step, pipelines=pipelines, arrays=dict(arrays or {}),
                    metadata=dict(metadata or {}), versions=versions, run=run, dynamic=dynamic)

    def _write(self, captured: dict[str, Any]) -> Path:
        """Publish a snapshot; with several ranks, each writes its own
        rank-NNNNN/ directory and rank 0 names them all in LATEST once every
        rank has written (so LATEST never mixes steps)."""
        t0 = time.perf_counter()
        if self.world_size == 1:
            name, sha = store.write_snapshot(self.path, **captured)
            store.publish(self.path, [(name, sha)])
            store.remove_leftovers(self.path, keep=name)
            self.timings["save_s"] = time.perf_counter() - t0
            return self.path / name
        rank_dir = f"rank-{self.rank:05d}"
        name, sha = store.write_snapshot(self.path / rank_dir, **captured,
                                         rank={"rank": self.rank, "world_size": self.world_size})
        entries = distributed.all_gather((f"{rank_dir}/{name}", sha))
        if self.rank == 0:
            store.publish(self.path, [tuple(e) for e in entries])
            store.remove_leftovers(self.path, keep="")
        distributed.barrier()
        store.remove_leftovers(self.path / rank_dir, keep=name)
        self.timings["save_s"] = time.perf_counter() - t0
        print(f"dvc-dali: rank {self.rank}/{self.world_size} saved step {captured['step']} in "
              f"{self.timings['save_s'] * 1000:.1f} ms", file=sys.stderr)
        return self.path / rank_dir / name


    def make_checkpoint(self, step: int, arrays: dict[str, Any] | None = None,
                        metadata: dict[str, Any] | None = None) -> Path | None:
        """:meth:`save`, then signal DVC and wait until it is recorded (see
        :func:`dvc_dali.make_checkpoint`). Asynchronous: returns None once the
        state is captured; publishing and recording go on in the background."""
        if not self.asynchronous:
            path = self.save(step, arrays, metadata)
            self._signal(step)
            return path
        self.wait()  # at most one in flight: checkpoints are recorded in order
        captured = self._capture(step, arrays_mod.snapshot(dict(arrays or {})), metadata)
        self._worker = _Background(lambda: (self._write(captured), self._signal(step)))
        return None

    def _signal(self, step: int) -> None:
        """Rank 0 signals once every rank has written; all wait for the record."""
        if self.rank == 0:
            signal.make_checkpoint(step, out=str(self.path), keep_last=self.keep_last,
                                   keep_best=self.keep_best)
        distributed.barrier()

    def wait(self) -> None:
        """Wait for the background checkpoint in flight (if any); raise its error."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.join()



class _Background:
    """One background save, run by the single worker thread of all
    Checkpointers (one at a time, in order). concurrent.futures joins its
    workers at interpreter exit, so a checkpoint in flight is finished whole
    (or, on SIGKILL, abandoned whole: the store's atomic publish sees to that)."""

    _pool: ThreadPoolExecutor | None = None

    def __init__(self, work) -> None:
        if _Background._pool is None:
            _Background._pool = ThreadPoolExecutor(1, thread_name_prefix="dvc-dali-checkpoint")
        self._future = _Background._pool.submit(work)

    def join(self) -> None:
        self._future.result()  # re-raises the background error in the training thread
