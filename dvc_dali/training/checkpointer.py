"""The Checkpointer: build pipelines fresh or restored, save, resume.

A facade: what a checkpoint restores is restorable's (one protocol for
DALI pipelines, TF datasets, dynamic mode, the random generators and the
batch proof, behind which DALI is reached through dali_state,
dali_iterators, dali_dynamic and dali_tf; the manifest is assembled from
their captures); the on-disk
format is store's; what a rerun does
with the checkpoint it finds is resume's; recording into DVC is
signal_file's (and recording/pipeline.py's).
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import os
import platform
import shutil
import signal
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..format import arrays as arrays_mod
from ..proof import batch_digests, data_contents
from ..dali import dali_dynamic, dali_iterators, dali_state, dali_tf
from . import (async_ranks, distributed, preemption, rank_commit, rank_restore, rank_setup,
               restorable, rng_state, signal_file)
from ..format import dirlock, store
from ..core import exit_hooks, row_files
from ..core import run as runs
from .._version import __version__
from ..core.context import RunContext
from ..core.errors import (ArgumentError, ArgumentTypeError, CheckpointLockedError,
                           CheckpointWriteError, ConfigError, DvcDaliError, RecordError,
                           UnchangedCheckpointError)
from ..core.arguments import kind_of
from ..core.checked_calls import checked_methods
from ..core.log import logger
from ..core.process_state import STATE
from ..core.record_request import RecordRequest
from ..core.run import Run
from .restorable import Restorable
from .resume import NOTHING, RESUME, ResumeDecision, decide, name_steps_param, run_started


def _array_module():
    """CuPy when a GPU is usable, so GPU arrays come back on the GPU."""
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:  # noqa: BLE001 (no CuPy, no driver, no device: all mean NumPy)
        return None


@checked_methods
class Checkpointer:
    """Saves and restores the exact state of a training run.

    On construction the latest complete checkpoint in ``path`` (if any) is
    read and verified; `step`, `arrays` and `metadata` hand it back, and
    `pipeline` builds each pipeline restored to its saved position. A
    Checkpointer holds an exclusive lock on its directory (per rank) while it
    lives: a second live writer, such as the training process a killed
    `dvc exp run` leaves running, is refused instead of mixing two runs'
    checkpoints; `close` lets another process write it.

    What a rerun does with the checkpoint (resume, continue, start over) is
    decided from ``params`` and ``total_steps``: see the guide "Resume
    semantics" (`docs/guides/resume.md`).

    Args:
        path: the directory declared as the stage's checkpoint output.
        resume: ``False`` ignores what is in ``path`` (it is replaced at the
            next save).
        params: the run's hyperparameters (JSON, without the step count).
            Default: under `dvc exp run`, the stage's own ``params:`` as DVC
            resolves them (``train.lr``, ``train.steps``...), read once when
            the run starts; outside it, none. An unfinished run resumes even
            with changed params (a changed *pipeline* is refused when it is
            built); a finished run (step >= its ``total_steps``) continues only
            with the same params and more ``total_steps``, otherwise a new run
            starts from step 0.
        total_steps: the run's total number of steps; required under
            `dvc exp run` (without it a rerun after the end cannot tell a
            changed parameter from more steps).
        keep_last: keep only the run's last N checkpoint rows after each
            recording, an int (default: env ``DVC_DALI_KEEP_LAST``; unset
            keeps every row). See the guide "Recording on DVC 3".
        keep_best: with ``keep_last``, also keep the best row by a DVCLive
            metric, ``"train/acc:max"`` or ``"loss:min"`` (default: env
            ``DVC_DALI_KEEP_BEST``), the rule `best_row` follows.
        asynchronous: ``True``: `make_checkpoint` returns once the state is
            captured (DALI states read, arrays copied in memory); writing and
            recording go on in a background thread, one at a time and in
            order; the next call, `wait` and process exit (Ctrl-C included)
            wait for it, so a checkpoint in flight is finished whole; the
            run's last one (``step >= total_steps``) is waited for at once.
            A background failure is raised by the next call or `wait`; one
            that nothing waited for is said at exit, and the process ends
            with status 1. A row holds the stage's other files (metrics,
            plots, outputs) as they were at the call: one written before
            the row was recorded refuses it (`ck.live()`'s writes wait for
            it; write others after `wait`). A later Checkpointer of the
            same directory in this process waits for the save in flight
            before reading. Under torch.distributed each rank writes its
            own files in the background and rank 0 records the row once
            every rank's files of that step are durable (guide "Many
            processes"). Default: env ``DVC_DALI_ASYNC`` (off).
        rng: save and restore the global random generators (Python's
            ``random``, NumPy's legacy generator, torch's CPU and CUDA ones)
            with each checkpoint. A damaged saved state is refused at
            construction; it is set back at the loop's resume point, its
            first read of the checkpoint's contents (`step`, `arrays` or
            `live`), once; reading any other property or attribute changes
            nothing (default: env ``DVC_DALI_RNG``, on; the argument wins).
            See the guide "Random generators".

    Attributes:
        path (Path): the checkpoint directory.
        timings (dict[str, float]): ``restore_s`` (reading the checkpoint at
            construction) and the last ``save_s``, in seconds, to log.
        params (dict): the params given (``params=``).
        total_steps (int | None): the ``total_steps`` given.
        rank (int): this process's torch.distributed rank (0 alone).
        world_size (int): the number of ranks (1 alone).

    Raises:
        ConfigError: a bad argument (``path`` not a path, or a file, not a
            directory; ``params`` not a dict of plain JSON; ``resume``,
            ``asynchronous`` or ``rng`` not a bool; ``total_steps``,
            ``keep_last``, ``keep_best``) or ``DVC_DALI_*`` variable; under `dvc exp run`, no
            ``total_steps``, or a checkpoint stage without ``persist: true``
            or ``always_changed: true`` (the message holds the fix).
        CheckpointLockedError: another live process writes ``path`` (named
            by its pid and command).
        CheckpointCorruptError: a checkpoint file missing, truncated, empty,
            garbage or edited.
        CheckpointFormatError: a foreign or newer format, a DALI 1.x checkpoint.
        RankMismatchError: another world size, or another rank's state.
        UnchangedCheckpointError: under `dvc exp run`, a finished run rerun
            with nothing changed, or an applied row whose run already went on
            from it (``DVC_DALI_RETRAIN=1`` trains it again on purpose).
        RecordError: under `dvc exp run`, a misconfigured auto-push remote,
            or a checkpoint `dvc.lock` names whose data is neither in the
            workspace nor the cache.

    Under torch.distributed, a refusal of the checkpoint read is raised at
    the resume point (the first read of `step`, `arrays` or `metadata`, a
    pipeline's, `should_save` or a checkpoint), once every rank said whether
    it restored; where any rank refused, every rank raises the same line,
    naming each that refused and why (guide "Many processes").
    """

    def __init__(self, path: str | os.PathLike = "checkpoint", *, resume: bool = True,
                 params: dict[str, Any] | None = None, total_steps: int | None = None,
                 keep_last: int | None = None, keep_best: str | None = None,
                 asynchronous: bool | None = None, rng: bool | None = None) -> None:
        # The environment and the arguments are checked now, before any
        # training step, not at the first checkpoint.
        exit_hooks.install_hook()  # a bad DVC_DALI_* value: one line, not a traceback
        self.path = _checked_arguments(path, resume, params, asynchronous, rng)
        self._ctx = RunContext.from_environ()
        self._ctx.refuse_stray_signal()
        # refusals, Ctrl-C and SIGTERM: one line, no traceback (SIGTERM in one
        # process only: torchrun's agent uses it to stop the other ranks)
        exit_hooks.install(self._ctx, sigterm=distributed.world()[1] == 1)
        self._retention = self._ctx.retention(keep_last, keep_best)
        self._started: float | None = time.time()  # a resume takes its run's (_resume_from)
        self.asynchronous = self._ctx.asynchronous if asynchronous is None else asynchronous
        if self.asynchronous:
            exit_hooks.watch_unread_saves()
        self._worker: _Background | None = None  # the one background save in flight
        # a checkpoint taken vs another thread's write of a row's file (_row_file_write)
        self._row_files_lock = threading.RLock()
        self._closed = False  # close(): the directory is no longer this Checkpointer's
        self.params = dict(params or {})
        self.total_steps = _checked_total_steps(total_steps)
        # everything the checkpoint restores (restorable.py), by (manifest part, name)
        self._sources: dict[tuple[str, str], Restorable] = {}
        # dynamic-mode readers digested: stream -> (Checkpoint's name, name there)
        self._dynamic_readers: dict[str, tuple[str, str]] = {}
        self._generators: restorable.RandomGenerators | None = None
        self._past_resume_point = False  # the random generators were set back
        self.rank, self.world_size = distributed.checked_world(os.environ)
        self._run: Run | None = None  # under `dvc exp run`: the run this process trains
        if self._ctx.mode == "record":
            self._start_recorded_run(params, total_steps)
        self._lock = dirlock.acquire(self.path, self.rank)  # one writer per directory
        # across ranks, through torch.distributed's store: asynchronous checkpoints
        # (async_ranks), or synchronous ones meeting there before their collectives
        self._ranks, self._meeting = self._store_ranks()
        self._agreed_signal: int | None = None  # the preemption signal all ranks agreed on
        # should_save's agreement on it, one step late (distributed.LateMax)
        self._late_max = distributed.LateMax() if self.world_size > 1 else None
        # how every rank checkpoints, compared at the first save (rank_setup)
        self._setups_checked = False
        self.timings: dict[str, float] = {}
        self._latest: str | None = None  # LATEST as this process last wrote it
        self._pending_message = ""
        self._branched = False  # a retrained row's rows form a run of their own
        # under torch.distributed, a restore this rank refused, said at the resume point once
        # every rank said whether it restored (_agree_on_restore); _trains: a data source
        # registered (a Checkpointer built to read only, on one rank, agrees with none)
        self._refusal: DvcDaliError | None = None
        self._restore_pending, self._trains = False, False
        self._saved = self._restored(resume)
        self._last_step = self._saved.snapshot.step if self._saved else None  # never back
        self._batches = self._start_proof()
        # the global random generators (rng_state): checked now, saved with each
        # checkpoint, set back at the resume point (_resume_point)
        if self._ctx.rng if rng is None else rng:
            self._generators = restorable.RandomGenerators()
            self._register(self._generators, announce=False)

    def _store_ranks(self) -> tuple[async_ranks.AsyncRanks | None,
                                    async_ranks.AsyncRanks | None]:
        """(asynchronous ranks' protocol, synchronous ranks' meeting): a
        synchronous rank that never comes to a checkpoint is then named as
        it ends (AsyncRanks.meet), not waited for in a collective."""
        if self.world_size == 1:
            return None, None
        ranks = functools.partial(async_ranks.AsyncRanks, self.path, self.rank, self.world_size)
        if self.asynchronous:
            return ranks(self._ctx.mode != "off"), None
        try:
            return None, ranks(asynchronous=False)
        except ConfigError:  # a torch that gives no store: the collectives alone, as before
            return None, None

    def _start_proof(self) -> batch_digests.Recorder:
        """The proof at runtime: the batches after each checkpoint (batch_digests.py)."""
        places = batch_digests.companion_dirs(self.path)
        recorder = batch_digests.Recorder(places[0], self._ctx.verify_batches,
                                          self._ctx.inexact, elsewhere=places[1:])
        if self._saved is not None:  # a data change let through: not the checkpoint's batches
            self._saved.went_inexact = recorder.leave_segment
        self._register(restorable.BatchProof(
            recorder, self._sources, self._dynamic_readers, _versions,
            _row_digests(str(self.path), self._run) if self._run is not None else None),
            announce=False)
        return recorder

    def _read(self, resume: bool) -> store.Snapshot | None:
        """The checkpoint in the directory (None: ``resume`` false, or none).
        A save of it still in flight in this process (an earlier Checkpointer's,
        asynchronous) is waited for first: else this one would resume the
        checkpoint before it and train its steps again."""
        t0 = time.perf_counter()
        if resume:
            _Background.drain()
        snapshot = (store.read_snapshot(self.path, _array_module(), self.rank, self.world_size)
                    if resume else None)
        self.timings["restore_s"] = time.perf_counter() - t0
        return snapshot

    def _restored(self, resume: bool) -> restorable.SavedCheckpoint | None:
        """What to restore (_read, then _resume_from). Under torch.distributed,
        where a checkpoint was found, every rank first agrees on the restore
        at its resume point (_agree_on_restore): a refusal here waits for it."""
        snapshot = None
        try:
            snapshot = self._read(resume)
            return self._resume_from(snapshot)
        except DvcDaliError as exc:
            if self.world_size == 1 or not resume:
                raise
            self._refusal = exc
            return None
        finally:  # a fresh start agrees on nothing: it costs nothing
            self._restore_pending = self.world_size > 1 and (
                snapshot is not None or self._refusal is not None)

    def _agree_on_restore(self, failed: DvcDaliError | None = None, trains: bool = False
                          ) -> None:
        """Before this rank trains: whether every rank restored (rank_restore),
        once, at the resume point (the first read of step, arrays or metadata
        with a pipeline registered; else a pipeline a refusing rank registers,
        or the first should_save or checkpoint: ``trains``). Where one refused
        (``failed`` or the constructor's), every rank raises one line naming
        it. A Checkpointer with no pipeline, reading only (on one rank, say),
        agrees with no rank: its own refusal is raised at once."""
        mine = failed or self._refusal
        if not self._restore_pending or not (trains or self._trains):
            if mine is not None:
                raise mine
            return
        self._restore_pending = False
        refusal = None if mine is None else rank_restore.Refusal(
            type(mine).__name__, *self._restoring(), str(mine))
        outcome = rank_restore.agree(str(self.path), self.rank, self.world_size, refusal)
        if outcome.refused:
            self._refusal = rank_restore.error_class(outcome.kind)(outcome.message)
            raise self._refusal from mine

    def _restoring(self) -> tuple[int | None, str]:
        """The step and snapshot this rank restores, as LATEST names them."""
        try:
            entries = store.latest(self.path)
        except DvcDaliError:  # LATEST itself is damaged: its refusal names it
            entries = None
        if not entries or self.rank >= len(entries):
            return None, ""
        rel = entries[self.rank][0]
        return rank_restore.snapshot_step(rel), f"{self.path}/{rel}"

    def _start_recorded_run(self, params: dict[str, Any] | None, total_steps: int | None
                            ) -> None:
        """Under DVC 3's `dvc exp run`, before any training step: refuse a stage
        DVC 3 cannot resume; the run's params default to the stage's `params:`
        as DVC resolves them, taken now; and total_steps is required, else a
        finished run could not tell more steps from other params."""
        from ..recording import pipeline as recording

        # One process only may bring a --temp run the workspace's checkpoint.
        self._run = recording.start_run(self._ctx, str(self.path),
                                        before_reading=self.world_size == 1)
        if params is None:
            self.params = dict(self._run.start.params)
        too_long = recording.too_long_for_rows(self._ctx, total_steps)
        if too_long:  # refused before training, not at its first row
            raise ConfigError(too_long)
        if total_steps is None:
            raise ConfigError(
                f"Checkpointer({str(self.path)!r}): pass total_steps= (the run's total number "
                "of steps) under `dvc exp run`: without it a rerun after the end cannot tell "
                "a changed parameter (a new run from step 0) from more steps (train further), "
                "and would record rows for training it did not do.")

    def _named_steps_param(self, message: str) -> str:
        """The stage's param that is the step count, in the refusal's hint."""
        start = getattr(self._run, "start", None)
        return name_steps_param(message, start.params if start is not None else {},
                                self.total_steps)

    def _resume_from(self, snapshot: store.Snapshot | None
                     ) -> restorable.SavedCheckpoint | None:
        """What to restore from the checkpoint read (see :mod:`dvc_dali.training.resume`):
        None when fresh, or for a finished run that starts anew."""
        if snapshot is None:
            return None
        if self.world_size > 1:
            logger.info("rank %d/%d read step %d in %.1f ms", self.rank, self.world_size,
                        snapshot.step, self.timings["restore_s"] * 1000)
        decision = decide(snapshot.step, snapshot.manifest.get("run"), self.params,
                          self.total_steps, checkpoint=str(self.path),
                          manifest=str(snapshot.path / store.MANIFEST))
        if decision.action == NOTHING:
            if self._ctx.mode == "record":  # each rerun would add an experiment, training nothing
                from ..recording.maintenance import finished_stage_hint

                raise UnchangedCheckpointError(self._named_steps_param(decision.message) + "."
                                               + finished_stage_hint(self._ctx, str(self.path)))
            decision = ResumeDecision(RESUME)  # a plain script: its loop has no step left
        if decision.action != RESUME and decision.message:
            logger.info(decision.message)
        if decision.action == RESUME and not decision.changes:
            self._refuse_unchanged_rerun(snapshot.step)
        # "resuming ..." is said once the checkpoint proved usable (a pipeline
        # restored, or a save), never before a refusal that contradicts it.
        self._pending_message = decision.message if decision.action == RESUME else ""
        if decision.action != RESUME:
            return None
        if not decision.changes and not self._branched:
            # the same run goes on; a resume with changed params (or trained
            # again on purpose) is a run of its own, begun now: carrying the
            # resumed run's start, `-n a -f` counted that run's rows as its
            # own and retention deleted them (found by a sweep)
            self._started = run_started(snapshot.manifest.get("run"))
        saved = restorable.SavedCheckpoint(snapshot, decision.changes, self._ctx.inexact)
        if self._ctx.mode == "record":
            ctx = self._ctx  # not self (a cycle would keep the directory lock)
            saved.explain_data = lambda old, new: _data_changes(ctx, old, new)
        return saved

    def _refuse_unchanged_rerun(self, step: int) -> None:
        """DVC 2's "Nothing to do for unchanged checkpoint": an applied row its
        run already went on from, rerun with nothing changed, would train again
        what the later rows hold, under new names."""
        if self._ctx.mode != "record":
            return
        from ..recording import pipeline as recording

        row, later = recording.superseding_rows(self._run, step)
        # trained again on purpose: a run of its own, beside the one it left
        self._branched = bool(later)
        if later and not self._ctx.retrain:
            raise UnchangedCheckpointError(
                f"{self.path} is row {row} (step {step}), and its run went on from it: "
                f"{', '.join(later)} already hold that training. Nothing to do for an "
                f"unchanged checkpoint. Continue from the last with `dvc exp apply {later[-1]}`"
                ", change a param (`dvc exp run -S ...`) to branch off, or train it again on "
                "purpose with DVC_DALI_RETRAIN=1.")

    def _announce(self) -> None:
        if self._pending_message:
            logger.info(self._pending_message)
            self._pending_message = ""

    def close(self) -> None:
        """Wait for a checkpoint in flight and let another process write here;
        a later `save` or `make_checkpoint` through this Checkpointer is
        refused (build a new one: it resumes from the last checkpoint).

        Raises:
            CheckpointWriteError: the checkpoint in flight could not be
                written (as `wait`).
        """
        self.wait()
        self._closed = True
        self._batches.close()  # the last batch's digest appended, its file closed
        for ranks in (self._ranks, self._meeting):
            if ranks is not None:  # a rank waiting for a checkpoint it never starts is told
                ranks.close()
        self._lock.release()

    def __del__(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()

    # -- what was restored -------------------------------------------------
    @property
    def resumed(self) -> bool:
        """True when a checkpoint was found and is being resumed (restored).
        Reading it changes nothing (unlike `step` and `arrays`); under
        torch.distributed a restore this rank refused is raised at the resume
        point, once every rank said whether it restored."""
        return self._saved is not None or self._refusal is not None

    @property
    def step(self) -> int:
        """The step saved in the checkpoint, 0 for a fresh start.

        The loop's resume point: the first read of the checkpoint's
        contents (`step`, `arrays` or `live`) sets the global random
        generators back (see ``rng``), once; no other property or attribute
        does. Read it after building the model, whose seeded initialisation
        draws as in the uninterrupted run.
        """
        self._resume_point()
        return self._saved.snapshot.step if self._saved else 0

    @property
    def arrays(self) -> dict[str, Any]:
        """The arrays saved with the checkpoint (empty for a fresh start).

        They come back as they went in (see `save`): NumPy, CuPy (where a
        GPU is usable), torch tensors or JAX arrays, or dicts/lists/tuples of
        them and of plain numbers, such as a ``state_dict()``. The random
        generators' array (``~dvc_dali.rng``) is not listed; `dvc_dali.load`
        lists it. Its first read, as the first of `step`, is the resume
        point: it sets the global random generators back (see `step`).
        """
        self._resume_point()
        return ({k: v for k, v in self._saved.snapshot.arrays.items() if k != rng_state.KEY}
                if self._saved else {})

    def _resume_point(self) -> None:
        """The loop's first read of the checkpoint's contents: after the
        model's seeded initialisation, before step 1. The generators' state,
        checked at construction, is set back here, once. The ranks agree on
        the restore first (_agree_on_restore)."""
        self._agree_on_restore()
        if self._generators is not None:
            self._generators.set_back()
            self._past_resume_point = True
            for (section, _), source in self._sources.items():
                if section == restorable.DYNAMIC:
                    dali_dynamic.take_default_rng(source.checkpoint, source.name)

    @property
    def metadata(self) -> dict[str, Any]:
        """The JSON ``metadata`` saved with the checkpoint (empty for a fresh start)."""
        self._agree_on_restore()
        return dict(self._saved.snapshot.manifest["metadata"]) if self._saved else {}

    # -- what is saved -----------------------------------------------------
    def pipeline(self, name: str, source: Any, **kwargs: Any) -> Any:
        """Build pipeline ``name``, restored to its saved position when resuming.

        Several named pipelines (train and validation) go in one checkpoint.
        From each checkpoint on, the batches it hands out (``pipe.run()`` and
        the iterators of `iterator`) are digested, and a resume compares the
        re-produced ones with them (guide "Proof at runtime").

        Args:
            name: the pipeline's name in the checkpoint.
            source: a ``@pipeline_def`` function (called with ``kwargs``) or
                an unbuilt ``Pipeline``.
            **kwargs: ``batch_size``, ``num_threads``, ``device_id``,
                ``seed`` and the function's own arguments.

        Returns:
            The built DALI pipeline.

        Raises:
            ArgumentTypeError: ``name`` is not a string; ``source`` is no
                ``@pipeline_def`` function or unbuilt ``Pipeline``; a keyword
                neither the function nor ``Pipeline()`` takes (also a
                ``TypeError``).
            ArgumentError: ``name`` is empty or already registered; the
                ``Pipeline`` is already built (also a ``ValueError``).
            ConfigError: this Checkpointer is closed.
            PipelineMismatchError: resuming with another pipeline (batch
                size, seed, shuffle flag, ``file_root``, file list or data,
                shard, operator) or data whose contents changed, naming what
                differs, old -> new (``DVC_DALI_INEXACT=1`` continues on
                purpose after a content change).
            UnsupportedPipelineError: an ``external_source`` DALI cannot
                restore.
            PipelineBuildError: DALI cannot build the pipeline (no files
                found, a bad argument), naming the operator and the line.
            ConfigError: an integer argument (``batch_size``,
                ``num_threads``, ``device_id``, ``seed``) that is not one;
                later, a DALI iterator built over the pipeline other than
                by `iterator` (its epoch counters would not be saved).

        Warns:
            UnnamedOperatorWarning: a stateful operator without ``name=``.
        """
        pipe, description, contents = self._prepare(name, source, kwargs)
        self._register(restorable.DaliPipeline(name, pipe, description, contents))
        self._batches.watch(name, pipe, dali_state.keeps_outputs(pipe))
        dali_iterators.refuse_other_iterators(pipe, name)
        dali_state.warn_unnamed(name, pipe)  # called from here: the warning points at the caller
        return pipe

    def _prepare(self, name: str, source: Any, kwargs: dict[str, Any]
                 ) -> tuple[Any, dict[str, Any], data_contents.Contents]:
        """An unbuilt pipeline, its description, and its data's contents
        being digested on a thread (proof at runtime, data_contents.py)."""
        _check_name(name, "pipeline", "'train'")  # a key of the manifest: 5 came back '5'
        if self._closed:  # its saves are refused: a pipeline registered now would never be
            raise ConfigError(f"Checkpointer({str(self.path)!r}) is closed: build a new "
                              f"Checkpointer to register pipeline {name!r}")
        if (restorable.PIPELINES, name) in self._sources or name in self._dynamic_readers:
            what = "a pipeline" if name not in self._dynamic_readers else \
                "the stream of a dynamic-mode reader"
            raise ArgumentError(f"pipeline {name!r}: {what} of this name is already registered "
                                "with this Checkpointer; give each pipeline a name of its own, "
                                "or keep the one the first call returned")
        pipe = dali_state.prepare(source, kwargs, name)
        dali_state.check_arguments(pipe, name)
        dali_state.check_restorable(pipe, name)
        description = dali_state.describe(pipe, name)
        return pipe, description, data_contents.start(name, description,
                                                      self._ctx.content_digest_max)

    def _register(self, source: Restorable, announce: bool = True) -> None:
        """The one restore path: built from the checkpoint being resumed (or
        fresh), then captured at every save (``announce``: a pipeline's
        restore proves the checkpoint usable, so "resuming ..." is said).
        Under torch.distributed a refused restore waits for the ranks'
        agreement (_agree_on_restore): at once for a data source (``announce``),
        at the resume point for the constructor's."""
        if announce and self._refusal is not None:  # this rank trains: agree now
            self._agree_on_restore(trains=True)
        try:
            source.restore(self._saved)
        except DvcDaliError as exc:
            if not self._restore_pending:
                raise
            if announce:
                self._agree_on_restore(exc, trains=True)
            self._refusal = exc
            return
        self._sources[(source.section, source.name)] = source
        if announce:
            self._trains = True
            self._announce()

    def _of_kind(self, kind: type) -> list[Any]:
        return [s for s in self._sources.values() if isinstance(s, kind)]

    @property
    def tf_datasets(self) -> dict[str, bool]:
        """The `tf_dataset` datasets by name, each ``True`` once an iterator
        was made from it (the Keras callback checks that fit got them)."""
        return {s.name: s.iterated for s in self._of_kind(restorable.TfDataset)}

    def tf_dataset(self, name: str, source: Any, *, output_dtypes: Any,
                   output_shapes: Any = None, transform: Any = None, **kwargs: Any) -> Any:
        """A TensorFlow ``DALIDataset`` over pipeline ``name``, restored from
        the checkpoint when resuming and saved with it.

        Its position is saved with the checkpoint and restored when resuming,
        with the same checks as a pipeline (another seed, batch size or data
        is refused). ``DALIDataset`` ignores DALI's own
        ``Pipeline(checkpoint=...)``: the state is taken from the TensorFlow
        iterator (``tf.train.Checkpoint``) and stored as one file. Every
        iterator made from the returned dataset continues where the previous
        one stopped, the first at the saved position, in a fresh run as in a
        resumed one (Keras makes one per ``fit`` call). Its elements, as the
        training step gets them (after ``transform``), are batch-digested
        like a pipeline's batches (guide "Proof at runtime"). Needs the
        ``tf`` extra and DALI's TF plugin (guide "Keras and TensorFlow").

        Args:
            name: the pipeline's name in the checkpoint.
            source: as for `pipeline`.
            output_dtypes: as for ``DALIDataset``.
            output_shapes: as for ``DALIDataset``.
            transform: the steps after DALI, ``lambda ds: ds.map(...)``,
                applied inside, so the returned dataset is still the one whose
                position is saved: feed it to ``model.fit`` or ``iter()`` as
                it is. A dataset made from the returned one afterwards is a
                new dataset whose position dvc-dali cannot see (the Keras
                callback refuses it).
            **kwargs: as for `pipeline`; the pipeline's ``batch_size``,
                ``num_threads``, ``device_id`` and queue depths are passed to
                the dataset, whose own defaults would override them.

        Returns:
            The ``tf.data.Dataset``.

        Raises:
            ArgumentError: as for `pipeline` (a ``name`` already registered).
            ArgumentTypeError: as for `pipeline`.
            PipelineMismatchError: as for `pipeline`. A batch that differs on
                resume is raised inside TensorFlow, which hands it on as an
                error of its own: the dataset's iterators and the Keras
                callback raise the ``BatchMismatchError`` (a
                `PipelineMismatchError`) instead; see `batch_failure`.
        """
        pipe, description, contents = self._prepare(name, source, kwargs)
        source_ = restorable.TfDataset(name, pipe, description, contents)
        self._register(source_)
        batches = self._batches  # not self: TensorFlow keeps the check function
        check = None
        if not source_.check_node:
            logger.info("pipeline %r: its TensorFlow state was saved without dvc-dali's "
                        "batch check, so this run does not digest its batches", name)
        elif batches.track(name):
            def check(arrays: list[Any]) -> None:  # each element, as training takes it
                # recording: digested on the digest thread (TensorFlow's
                # tensors are not written again while an array views them)
                batches.observe(name, arrays, batch_digests.digest_arrays, deferred=True)
        return dali_tf.dataset(pipe, source_.stream.started, output_dtypes, output_shapes,
                               transform, check, lambda: batches.failure, source_.check_node)

    @property
    def batch_failure(self) -> Exception | None:
        """The ``BatchMismatchError`` a `tf_dataset` raised inside TensorFlow,
        which hands it on as an error of its own (the dataset's iterators and
        the Keras callback raise this one instead); else ``None``."""
        return self._batches.failure

    def iterator(self, iterator_class: Any, pipelines: Any, *args: Any, **kwargs: Any) -> Any:
        """A framework iterator over pipelines built with `pipeline`, saved
        through ``iterator.checkpoints()`` so its epoch counters come back too.

        When resuming, ``prepare_first_batch=False`` is passed: with DALI's
        default, a checkpoint taken after an epoch's last batch restores into
        an iterator that skips the end of that epoch. An iterator built over
        such a pipeline directly (``DALIGenericIterator(pipe, ...)``) is
        refused when it is made (a ConfigError): its counters would not be
        saved, and a resume would hand out other batches.

        Args:
            iterator_class: PyTorch's ``DALIGenericIterator`` or
                ``DALIClassificationIterator``, or JAX's ``DALIGenericIterator``.
            pipelines: a pipeline, or a list of them, each from `pipeline`.
            *args: the iterator's own arguments (output names...).
            **kwargs: the iterator's own keyword arguments (``reader_name``,
                ``auto_reset``, ``last_batch_policy``...).

        Returns:
            The iterator.

        Raises:
            ArgumentError: a pipeline not built with `pipeline` (also a
                ``ValueError``).
            ArgumentTypeError: ``iterator_class`` is not a class (also a
                ``TypeError``).
        """
        if not callable(iterator_class):
            raise ArgumentTypeError(f"iterator_class={iterator_class!r}: must be a DALI iterator "
                                    "class, such as nvidia.dali.plugin.pytorch."
                                    "DALIGenericIterator")
        pipes = list(pipelines) if isinstance(pipelines, (list, tuple)) else [pipelines]
        known = {id(s.pipe): s for s in self._of_kind(restorable.DaliPipeline)}
        strange = [i for i, p in enumerate(pipes) if id(p) not in known]
        if strange:
            raise ArgumentError(
                f"pipelines: {_which(pipes, strange[0])} was not built by this Checkpointer; "
                "build the iterator's pipelines with ck.pipeline(name, ...) first, so they "
                "are restored and saved")
        it = dali_iterators.create(iterator_class, pipes, args, kwargs, self.resumed)
        for p in pipes:
            known[id(p)].iterator = it  # saved through it from now on
        return it

    def dynamic(self, name: str = "dynamic") -> Any:
        """A DALI dynamic-mode (``nvidia.dali.experimental.dynamic``)
        ``checkpoint.Checkpoint`` saved with this checkpoint.

        Register dynamic-mode readers and RNGs on it
        (``register(reader, "reader")``, ``register(rng, "rng")``); when
        resuming, each gets its saved state at registration. Each batch a
        registered reader's ``next_epoch`` yields is digested as stream
        ``"<name>/<reader name>"`` and compared on resume (guide "Proof at
        runtime"); RNGs yield no batches.

        Args:
            name: its name in the checkpoint; the same name returns the
                same object.

        Returns:
            The dynamic-mode ``Checkpoint``.

        Raises:
            ArgumentTypeError: ``name`` is not a string (also a
                ``TypeError``).
            ArgumentError: ``name`` is empty; a registered reader's stream
                has the name of a pipeline (also a ``ValueError``).
        """
        _check_name(name, "dynamic-mode checkpoint", "'dynamic'")  # 5 came back '5'
        key = (restorable.DYNAMIC, name)
        if key not in self._sources:
            self._register(restorable.DynamicMode(name))
            dali_dynamic.on_readers(self._sources[key].checkpoint, _reader_digests(
                self._batches, self._sources, self._dynamic_readers, name), name)
            if self._past_resume_point:  # else taken there, after the script's seeding
                dali_dynamic.take_default_rng(self._sources[key].checkpoint, name)
        return self._sources[key].checkpoint

    def keras_callback(self, every: int, live: Any = None,
                       on_checkpoint: Any = None) -> Any:
        """A Keras 3 callback that checkpoints ``model.fit`` every ``every``
        steps, at the end of training and at once on preemption (`should_save`).

        It saves the model's variables (the seed generators' states too:
        dropout draws the same numbers) and the optimizer's as arrays, no
        pickle, with the positions of the `tf_dataset` datasets. On resume it
        restores them and starts at the saved epoch. The learning rate is the
        compiled optimizer's, so a changed ``lr`` param applies (a rate
        changed during training by a callback is not restored). Train with
        its `fit <dvc_dali.integrations.keras_callback.DaliCheckpoint.fit>`
        (``cb.fit(model, ds, epochs=E, steps_per_epoch=S)``), which also
        resumes in the middle of an epoch; ``model.fit(ds, callbacks=[cb])``
        works too, but refuses a checkpoint in the middle of an epoch, naming
        ``cb.fit``. The epoch-level means Keras reports for the interrupted
        epoch cover only the steps after the resume; weights and every later
        epoch are exact.

        Args:
            every: checkpoint every this many steps.
            live: a `live` ``dvclive.Live``; it gets the step's Keras logs as
                ``train/<name>`` before each checkpoint.
            on_checkpoint: ``on_checkpoint(step, logs)``, called then too (to
                write a model file the stage outputs).

        Returns:
            The callback, a `dvc_dali.integrations.keras_callback.DaliCheckpoint`.

        Raises:
            ConfigError: Keras 3 is not installed (the ``tf`` extra).
        """
        try:
            from ..integrations.keras_callback import DaliCheckpoint
        except ImportError as exc:
            raise ConfigError(f"Checkpointer.keras_callback() needs Keras 3 ({exc}): install "
                              "the tf extra, pip install \"dvc-dali[tf]\".") from None

        return DaliCheckpoint(self, every, live, on_checkpoint)

    def lightning_callback(self, every: int, live: Any = None,
                           on_checkpoint: Any = None) -> Any:
        """A PyTorch Lightning callback that checkpoints ``Trainer.fit`` every
        ``every`` optimizer steps, at the end, and at once on preemption:
        model, optimizers, LR schedulers, loop progress and callbacks' states
        as arrays and JSON (no pickle), with the DALI pipelines' positions.

        Train with ``cb.fit(trainer, model, iterator)`` (``iterator`` from
        `iterator`), which resumes mid-epoch from the checkpoint; or
        ``trainer.fit(model, cb.loader(iterator), ckpt_path=cb.ckpt_path)``.
        The guide "PyTorch Lightning" says what is saved and how it relates
        to Lightning's own checkpoints. Needs the ``lightning`` extra
        (Lightning >= 2.2); one process only.

        Args:
            every: checkpoint every this many optimizer steps.
            live: a `live` ``dvclive.Live``; it gets the metrics the module
                logs (``self.log``) at each checkpoint.
            on_checkpoint: ``on_checkpoint(step, metrics)``, called then too
                (to write a model file the stage outputs).

        Returns:
            The callback, a `dvc_dali.integrations.lightning_callback.DaliCheckpoint`.

        Raises:
            ConfigError: PyTorch Lightning is not installed.
        """
        try:
            from ..integrations.lightning_callback import DaliCheckpoint as LightningCheckpoint
        except ImportError as exc:
            raise ConfigError(f"Checkpointer.lightning_callback() needs PyTorch Lightning ({exc})"
                              ": install the lightning extra, pip install "
                              "\"dvc-dali[lightning]\".") from None

        return LightningCheckpoint(self, every, live, on_checkpoint)

    def live(self, dir: str = "dvclive", **kwargs: Any) -> Any:
        """A ``dvclive.Live`` resumed in step with this checkpoint.

        Its history is trimmed to `step` and its ``step`` is `step`, so a
        resumed run has no repeated or stray rows after a kill. With
        ``asynchronous=True`` each of its writes (``log_metric``,
        ``next_step``, ``end``, ``log_image``...) first waits for the
        checkpoint in flight (as `wait`), so a row holds the metrics logged
        before its checkpoint.
        Its ``next_step`` tells VS Code's DVC extension that a step is done
        as DVCLive's does, without the fsync DVCLive makes of that signal on
        the training thread (1-4 ms a step measured here).

        Args:
            dir: the DVCLive directory.
            **kwargs: passed to ``dvclive.Live``.

        Returns:
            The ``dvclive.Live``. A write of it that fails on the file
            system (a full disk, a read-only directory) raises `RecordError`
            in one line naming the DVCLive directory, not DVCLive's
            ``OSError``: the run stops before its next row.
        """
        from ..integrations.live import resume_live

        if not isinstance(dir, (str, os.PathLike)) or not os.fspath(dir):
            raise ConfigError(f"live(dir={dir!r}): must be the DVCLive directory, a path such "
                              "as 'dvclive'")
        if "resume" in kwargs:  # DVCLive's own habit; here the checkpoint decides it
            raise ConfigError(f"live(resume={kwargs['resume']!r}): dvc-dali sets resume from "
                              "the checkpoint (resumed or not); drop the argument")
        return resume_live(self.step, self.resumed, dir,
                           before_write=weakref.WeakMethod(self._row_file_write), **kwargs)

    # -- saving ------------------------------------------------------------
    def save(self, step: int, arrays: dict[str, Any] | None = None,
             metadata: dict[str, Any] | None = None) -> Path:
        """Write a checkpoint (no DVC): every registered pipeline, iterator,
        dataset and dynamic-mode state, the global random generators (see
        ``rng``), ``arrays`` and ``metadata``.

        Arrays are NumPy, CuPy (where a GPU is usable), torch tensors or JAX
        arrays, or dicts/lists/tuples of them and of plain numbers, such as a
        model's and an optimizer's ``state_dict()`` (int keys and bfloat16
        kept): they come back as they went in, from ``.npy`` files and a JSON
        tree, never through pickle. Preserved exactly: NumPy arrays (dtype,
        shape, order of bytes) and NumPy scalars (``np.float64(1.5)`` comes
        back a scalar), torch tensors (dtype, bfloat16/float8 by their bits;
        ``nn.Parameter`` and ``requires_grad`` kept; on the CPU; a quantized
        tensor is refused), CuPy arrays (on the GPU where one is usable), JAX
        arrays, ``dict`` (str and int keys, in order), ``OrderedDict``,
        ``list``, ``tuple``, and Python ``None``, ``bool``, ``int``,
        ``float`` (nan and inf included) and ``str``. A save is atomic: a
        crash at any instant leaves the previous checkpoint.

        Args:
            step: the step this checkpoint is of.
            arrays: the arrays to save, by name (names starting with
                ``~dvc_dali`` are reserved).
            metadata: JSON-serialisable metadata.

        Returns:
            The snapshot directory.

        Raises:
            ConfigError: ``step`` not an int from 0 to 2**63 - 1, ``arrays``
                not a dict by str names, ``metadata`` not a dict of plain
                JSON (no NaN; also a ``TypeError``).
            ArgumentTypeError: a value in ``arrays`` that cannot be saved
                exactly (a namedtuple, a ``defaultdict`` or another subclass,
                which would come back as its plain base type; a masked
                array, whose mask would be lost, or another ndarray
                subclass; an ``object()``), naming where it is. ``metadata``
                or ``params`` with a key that is not a string (JSON would
                make it one). A `ConfigError`, and a ``TypeError``.
            ArgumentError: a reserved array name (also a ``ValueError``).
            CheckpointWriteError: the disk is full or not writable; the
                previous checkpoint stands.
        """
        _check_save_arguments(step, arrays, metadata)
        self._agree_on_restore(trains=True)
        self.wait()
        return self._write(self._capture(step, arrays, metadata))

    def make_checkpoint(self, step: int, arrays: dict[str, Any] | None = None,
                        metadata: dict[str, Any] | None = None) -> Path | None:
        """`save`, then signal DVC and wait until the checkpoint is recorded
        as a row (see `dvc_dali.make_checkpoint`).

        With ``asynchronous=True`` it returns ``None`` once the state is
        captured (DALI states read, arrays copied in memory); writing and
        recording go on in a background thread, one at a time and in order;
        the run's last checkpoint (``step >= total_steps``) is waited for
        before it returns.
        Under torch.distributed each rank writes its own files in the
        background and rank 0 records the row once every rank's files of
        that step are durable; no collective call is made (guide "Many
        processes"). After a preemption signal (`should_save`) it records
        the checkpoint, then ends the process with status 128 + the
        signal's number.

        Args:
            step: the step whose batches were the last drawn (row ``<run>-step<step>``):
                ``step - 1`` in a Ctrl-C handler after step's batch resumes one ahead.
            arrays: as for `save`.
            metadata: as for `save`.

        Returns:
            The snapshot directory, or ``None`` when asynchronous.

        Raises:
            ConfigError: as for `save`, at the call (asynchronous too).
            ArgumentTypeError: as for `save` (also a ``TypeError``).
            ArgumentError: as for `save` (also a ``ValueError``).
            CheckpointWriteError: as for `save` (asynchronous: from the next
                call or `wait`, or at once at the last step; never waited
                for: said at exit, which then has status 1; across ranks
                also when a rank ended before its files of that step were
                durable, or without calling make_checkpoint for that step,
                naming the rank and the step).
            RecordError: the checkpoint could not be recorded; its files are
                intact.
            SignalError: DVC 2 or `dvc-dali run` never answered the signal
                file (``DVC_DALI_SIGNAL_TIMEOUT``).
            SystemExit: after the checkpoint of a preempted step.
        """
        _check_save_arguments(step, arrays, metadata)
        exit_hooks.refuse_deleted_run(step)  # before save writes there
        self._agree_on_restore(trains=True)
        if self._ranks is not None:
            return self._make_rank_checkpoint(step, arrays, metadata)
        if not self.asynchronous or preemption.FLAG.signum is not None:
            path = self.save(step, arrays, metadata)
            self._signal(step)
            self._exit_if_preempted(step)
            return path
        self.wait()  # at most one in flight: checkpoints are recorded in order
        captured = self._capture(step, _checked_snapshot(arrays), metadata)
        with self._row_files_lock:
            held = self._held_files()
            self._worker = _Background(
                lambda: (self._write(captured), self._signal(step, held=held)), step, self.path)
        self._wait_if_last(step)
        return None

    def _wait_if_last(self, step: int) -> None:
        """The run's last checkpoint (step >= total_steps) is waited for at
        once: nothing trains beside it any more, and its error is then raised
        here, where a script that never calls wait() still gets it."""
        if self.total_steps is not None and step >= self.total_steps:
            self.wait()

    def _make_rank_checkpoint(self, step: int, arrays: dict[str, Any] | None,
                              metadata: dict[str, Any] | None) -> None:
        """Asynchronous under torch.distributed: capture, hand the write (and on
        rank 0 the recording) to the background (async_ranks); no collective.
        A preempted step (as every rank agreed in `should_save`) is waited
        for, then the process exits."""
        self.wait()  # at most one in flight: checkpoints are recorded in order
        captured = self._capture(step, _checked_snapshot(arrays), metadata)
        with self._row_files_lock:
            record = functools.partial(self._record_ranks, held=self._held_files())
            self._worker = _Background(self._ranks.job(captured, record, self._rank0_recorded),
                                       step, self.path)
        self._wait_if_last(step)
        if self._agreed_signal is not None:
            self._exit_if_preempted(step, signal.Signals(self._agreed_signal))
        return None

    def _held_files(self) -> tuple | None:
        """At an asynchronous checkpoint, on the training thread: the other
        files its row will hold, stamped now (core/row_files.py), so the
        recording refuses a row whose files the loop wrote since; None where
        this process records no row."""
        run = runs.current() if self._ctx.mode == "record" and self.rank == 0 else None
        roots = getattr(run.start, "row_files", None) if run is not None else None
        return (tuple(roots), row_files.stamp(roots)) if roots else None

    @contextlib.contextmanager
    def _row_file_write(self, training_thread: bool) -> Iterator[None]:
        """Around a write of a file rows hold (`live`'s Live): the checkpoint
        in flight recorded first. On the training thread, as `wait` (its
        error raised there); on another (DVCLive's system monitor) it is
        waited for without taking its result, which the training thread's
        next call still raises, and no checkpoint is taken until the write
        is done (else that write would fall between its stamps)."""
        if training_thread:
            self.wait()
            yield
            return
        with self._row_files_lock:
            worker = self._worker
            if worker is not None:
                worker.settle()
            yield

    def _record_ranks(self, step: int, latest: str, held: tuple | None = None) -> None:
        """Rank 0's background thread, once every rank's files are durable."""
        self._latest = latest
        self._signal(step, barrier=False, held=held)
        for key, value in self._ranks.timings.items():
            self.timings[key] = value


    # -- preemption --------------------------------------------------------
    def should_save(self, step: int, every: int) -> bool:
        """Whether to checkpoint at ``step``.

        True when ``step % every == 0``, and at the first step after this
        process received SIGTERM or SIGUSR1 (see `preempted`). The
        `make_checkpoint` of such a step records the checkpoint, pushes it
        when auto-push is on, then ends the process with status 128 + the
        signal's number (guide "Preemption and remotes"). The signal
        handlers are installed at the first call. With torch.distributed
        every rank answers the same (any rank's signal), one step later:
        each call hands this rank's signal to an asynchronous all_reduce on
        the CPU and reads the one the previous call started, so no rank
        waits for the others at every step (with NCCL as the only backend,
        through a gloo group of every rank made at the first call; only a
        torch without gloo agrees at once, on the GPU).

        Args:
            step: the step just trained.
            every: the checkpoint interval in steps.

        Returns:
            Whether to call `make_checkpoint` now.

        Raises:
            ConfigError: ``step`` is not an int from 0, or ``every`` is not a
                whole number, 1 or more.
        """
        _check_should_save(step, every)
        exit_hooks.refuse_deleted_run(step)
        self._agree_on_restore(trains=True)
        preemption.FLAG.install(ours=(exit_hooks.on_sigterm,))
        if self._late_max is None:
            agreed = preemption.FLAG.signum
        else:
            agreed = self._late_max.exchange(preemption.FLAG.signum or 0) or None
        self._agreed_signal = agreed
        return preemption.due(step, every, agreed is not None)

    @property
    def preempted(self) -> signal.Signals | None:
        """The preemption signal received (``signal.Signals``: SIGTERM or
        SIGUSR1), else None; with torch.distributed, any rank's (every rank
        then saves at the same step)."""
        mine = preemption.FLAG.signum
        if self.world_size > 1:
            mine = self._late_max.now(mine or 0) or None
        return None if mine is None else signal.Signals(mine)

    def _exit_if_preempted(self, step: int, sig: signal.Signals | None = None) -> None:
        """After the checkpoint of a preempted step: one line, then the exit
        status the signal would have given (``sig``: the one all ranks agreed
        on already, else asked now)."""
        sig = sig or self.preempted
        if sig is None:
            return
        self.wait()
        if self._ctx.mode == "record":
            from ..recording import auto_push

            pushed = auto_push.settle(self._ctx.push_grace) if self.rank == 0 else ""
            logger.warning(exit_hooks.interruption_line(f"preempted ({sig.name})",
                                                        exit_hooks.last_kept(), pushed))
        else:
            logger.warning("preempted (%s): step %d is saved in %s; run again to resume from it",
                           sig.name, step, self.path)
        exit_hooks.stopping()  # a Ctrl-C from now on: no traceback, no exit hook cut short
        raise SystemExit(128 + sig.value)

    def wait(self) -> None:
        """Wait for the background checkpoint in flight (if any): written
        and, under `dvc exp run`, recorded (with torch.distributed: every
        rank's files durable and the row recorded). When it was still in
        flight, how long it waited is logged and kept in
        ``timings["wait_s"]``.

        Raises:
            CheckpointWriteError: the checkpoint in flight could not be
                written; with torch.distributed, a rank ended before its
                files of that step were durable (the message names the rank
                and the step); or any other error it raised (`RecordError`...).
        """
        worker, self._worker = self._worker, None
        if worker is None:
            return
        t0 = time.perf_counter()
        busy = not worker.done()
        worker.join()
        if self._ranks is not None:
            self.timings.update(self._ranks.timings)
        self.timings["wait_s"] = waited = time.perf_counter() - t0
        if busy:
            logger.info("%swaited %.1f ms for step %d's checkpoint to be %s (one in flight "
                        "at a time)",
                        f"rank {self.rank}/{self.world_size}: " if self.world_size > 1 else "",
                        waited * 1000, worker.step,
                        "recorded" if self._ctx.mode == "record" else "written")

    def _capture(self, step: int, arrays: dict[str, Any] | None,
                 metadata: dict[str, Any] | None) -> store.Capture:
        """Everything a snapshot needs: DALI states read now, arrays referenced."""
        if self._closed:
            raise ConfigError(
                f"Checkpointer({str(self.path)!r}) is closed: it no longer holds the directory "
                f"(another Checkpointer or process may write it now), so step {step} is not "
                "saved. Build a new Checkpointer to checkpoint again; it resumes from the last "
                "checkpoint.")
        if self._last_step is not None and step < self._last_step:
            raise ConfigError(
                f"step={step}: below the last checkpoint's step {self._last_step}, so its row "
                "would be named and ordered as if it came before it. Steps must not go back: "
                "count them across epochs and fits (a new Lightning Trainer restarts "
                "global_step at 0: fit the same Trainer again, or pass it ckpt_path=cb.ckpt_path).")
        if self._lock.superseded:
            raise CheckpointLockedError(
                f"Checkpointer({str(self.path)!r}): a newer Checkpointer in this process took "
                f"this directory over, so step {step} is not saved through this one (it would "
                "undo the newer one's checkpoints). Save through the newer one.")
        self._announce()
        user_arrays = dict(arrays or {})
        rng_state.check_names(user_arrays)  # before anything is captured
        parts = restorable.assemble(self._sources.values())
        self._say_dropped(parts[restorable.PIPELINES])
        self._last_step = step
        return store.Capture(
            step=step,
            pipelines=parts[restorable.PIPELINES],
            arrays={**user_arrays, **parts[restorable.ARRAYS]},
            metadata=dict(metadata or {}),
            versions=_versions(),
            run={"params": self.params, "total_steps": self.total_steps,
                 **({"started": self._started} if self._started is not None else {})},
            dynamic=parts[restorable.DYNAMIC],
            # md5 is what DVC caches by: computed while writing, it is handed to
            # DVC when this process records; elsewhere the cheaper crc32 serves
            digest="md5" if self._ctx.mode == "record" else "crc32",
        )

    _dropped_said = False  # set on the instance once said

    def _say_dropped(self, pipelines: dict[str, Any]) -> None:
        """Said once, at the first save: the resumed checkpoint's pipelines
        this run did not register are in none of its checkpoints, so a later
        resume starts them from their beginning (it was silent: a sweep)."""
        if self._saved is None or self._dropped_said:
            return
        self._dropped_said = True
        gone = sorted(set(self._saved.snapshot.manifest["pipelines"]) - set(pipelines))
        if gone:
            logger.warning("pipeline(s) %s of the checkpoint at step %d were not registered "
                           "in this run: this checkpoint and the next do not hold their "
                           "positions, so a later resume starts them from their beginning "
                           "(register every pipeline before the first checkpoint)",
                           ", ".join(map(repr, gone)), self._saved.snapshot.step)

    def _write(self, captured: store.Capture) -> Path:
        """Publish a snapshot (see :func:`_publish_one` and :func:`_publish_ranks`)."""
        t0 = time.perf_counter()
        if self.world_size == 1:
            written = _publish_one(self.path, captured)
        else:
            if self._meeting is not None:  # every rank's setup compared there too
                self._meeting.meet(captured.step)
                self._setups_checked = True
            written = _publish_ranks(self.path, captured, self.rank, self.world_size,
                                     check=not self._setups_checked)
            self._setups_checked = True
        if self.rank == 0:  # what the recording must find there (see signal_file)
            self._latest = (self.path / store.LATEST).read_text(encoding="utf-8")
        self.timings["save_s"] = time.perf_counter() - t0
        if self.world_size > 1:
            logger.info("rank %d/%d saved step %d in %.1f ms", self.rank, self.world_size,
                        captured.step, self.timings["save_s"] * 1000)
        return written

    def _signal(self, step: int, barrier: bool = True, held: tuple | None = None) -> None:
        """Rank 0 signals once every rank has written; all wait for the record
        (asynchronous across ranks: async_ranks has them wait, ``barrier`` off).
        ``held``: an asynchronous checkpoint's `_held_files`."""
        if self.rank == 0:
            branched = self._branched or bool(self._saved and self._saved.param_changes)
            signal_file.signal_checkpoint(self._ctx, RecordRequest(
                step, out=str(self.path), expect_latest=self._latest, resumed=self.resumed,
                branched=branched, held_files=held, run_started=self._started),
                self._retention)
        if barrier:
            distributed.barrier()
            self._rank0_recorded(step)

    def _rank0_recorded(self, step: int) -> None:
        """On a rank other than 0 under `dvc exp run`: rank 0 recorded step
        ``step``'s row (this rank passed the barrier after it, or read its
        answer in the store), for this rank's interruption line."""
        if self.rank == 0 or self._ctx.mode != "record":
            return
        try:
            runs.of(self._ctx).kept = (step, "")
        except RecordError:  # another run in this process: it has its own line
            pass


def _checked_snapshot(arrays: dict[str, Any] | None) -> dict[str, Any]:
    """An asynchronous checkpoint's private copy of ``arrays``, refused first
    as a save would refuse them, so the call that passed them raises."""
    arrays = dict(arrays or {})
    for name, value in arrays.items():
        arrays_mod.check(name, value)
    return arrays_mod.snapshot(arrays)


def _reader_digests(recorder: batch_digests.Recorder, sources: dict[tuple[str, str], Any],
                    readers: dict[str, tuple[str, str]], dname: str) -> Any:
    """The hook that digests each reader registered on dynamic-mode
    Checkpoint ``dname``. It holds the recorder and the dicts, never the
    Checkpointer: DALI's Checkpoint keeps it, and a Checkpointer dropped
    without close() must free its directory lock at once."""
    def watch(key: str, reader: Any) -> None:
        stream = batch_digests.dynamic_stream(dname, key)
        if (restorable.PIPELINES, stream) in sources:  # one stream, two sources' digests
            raise ArgumentError(f"dynamic-mode reader {stream!r} has the name of a pipeline "
                                "registered with this Checkpointer; register it under another")
        if readers.get(stream, (dname, key)) != (dname, key):  # "a" + "b/c", "a/b" + "c"
            other = readers[stream]
            raise ArgumentError(f"dynamic-mode reader {key!r} of {dname!r} and reader "
                                f"{other[1]!r} of {other[0]!r} would be one stream, {stream!r}, "
                                "mixing their batch digests; name one of them without '/'")
        if not recorder.track(stream, "dynamic-mode reader"):
            return  # verification off: the reader is left as it is, at no cost
        readers[stream] = (dname, key)
        dali_dynamic.observe_batches(
            reader, lambda batch: recorder.observe(stream, batch, _dynamic_digest))

    return watch


def _dynamic_digest(batch: Any) -> list[str]:
    """A dynamic-mode reader's batch, digested: its CPU outputs on the host,
    its GPU outputs on the device."""
    return batch_digests.digest_dynamic(dali_dynamic.digest_outputs(batch))


def _data_changes(ctx: RunContext, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'<dir>: added ..., changed ...' for each data location whose digest
    changed, as far as the recorded rows tell."""
    from ..recording import pipeline as recording

    lines = []
    for key, digest in (new.get("data") or {}).items():
        if (old.get("data") or {}).get(key) == digest:
            continue
        op, _, arg = key.rpartition(".")
        value = new["operators"].get(op, {}).get("args", {}).get(arg)
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, str) and os.path.isdir(path):
                found = recording.data_changes(ctx, path)
                if found:
                    lines.append(f"{key} ({path}): " + ", ".join(found))
    return lines


def _versions() -> dict[str, str]:
    return {
        "dvc_dali": __version__,
        "dali": dali_state.dali_version(),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def _row_digests(path: str, run: Run) -> Callable[[int, str], dict[str, list[list[str]]]]:
    """Under `dvc exp run`: the batch digests after checkpoint ``log_id``
    (step ``step``) from the row ``run`` recorded next (an applied row on
    another machine, whose companion file is elsewhere)."""
    def found(step: int, log_id: str) -> dict[str, list[list[str]]]:
        from ..recording import pipeline as recording

        after = recording.row_after(run, step)
        return batch_digests.from_rows(path, [after], log_id) if after else {}

    return found


def _check_name(name: Any, what: str, example: str) -> None:
    """A name a checkpoint's manifest keys by: a non-empty str."""
    if not isinstance(name, str):
        raise ArgumentTypeError(f"{what} name {name!r}: must be a non-empty string, e.g. "
                                f"{example}, not {kind_of(name)}")
    if not name:
        raise ArgumentError(f"{what} name {name!r}: must be a non-empty string, e.g. {example}")


def _which(pipes: list[Any], index: int) -> str:
    """The pipeline at ``index`` of an iterator's, for a message."""
    item = pipes[index]
    shown = repr(item) if item is None else kind_of(item)
    return shown if len(pipes) == 1 else f"item {index} ({shown})"


def _checked_total_steps(total_steps: Any) -> int | None:
    if total_steps is not None and (isinstance(total_steps, bool)
                                    or not isinstance(total_steps, int)
                                    or not 0 <= total_steps <= store.MAX_STEP):
        raise ConfigError(f"total_steps={total_steps!r}: must be a non-negative integer (at "
                          f"most {store.MAX_STEP}), the run's total number of steps")
    return total_steps


def _checked_arguments(path: Any, resume: Any, params: Any, asynchronous: Any,
                       rng: Any) -> Path:
    """Checkpointer's arguments, refused in one line before anything is
    read or locked (the environment's are RunContext's); returns the path."""
    for name, value, allowed in (("resume", resume, (bool,)),
                                 ("asynchronous", asynchronous, (bool, type(None))),
                                 ("rng", rng, (bool, type(None)))):
        if not isinstance(value, allowed):  # bool("no") is True: never guessed
            none = ", or None for the default" if type(None) in allowed else ""
            raise ConfigError(f"{name}={value!r}: must be True or False{none}")
    if params is not None and not isinstance(params, Mapping):
        raise ConfigError(f"params={params!r}: must be a dict of the run's hyperparameters "
                          "(plain JSON), or None for the stage's own params")
    store.check_json(dict(params or {}), "params")
    if isinstance(path, str) and not path.strip():  # Path('') is the current directory
        raise ConfigError(f"path={path!r}: must be the checkpoint directory, such as "
                          "'checkpoint' (the stage's checkpoint output)")
    try:
        checked = Path(path)
        os.stat(checked)  # follows links: a loop, a file on the way, a name too long
        is_file = not checked.is_dir()
    except (TypeError, ValueError):  # not a path at all; a NUL in it
        raise ConfigError(f"path={path!r}: must be the checkpoint directory, a str or "
                          "pathlib.Path such as 'checkpoint' (the stage's checkpoint output)"
                          ) from None
    except FileNotFoundError:
        is_file = False  # made at the first save
    except OSError as exc:
        raise ConfigError(f"Checkpointer({str(path)!r}): {exc.strerror or exc}; pass a "
                          "directory path that can be made and written (the stage's "
                          "checkpoint output)") from None
    if is_file:
        raise ConfigError(f"Checkpointer({str(path)!r}): {path} is a file, not a directory; "
                          "pass the checkpoint directory (the stage's checkpoint output), or "
                          "move the file away")
    return checked


def _check_save_arguments(step: Any, arrays: Any, metadata: Any) -> None:
    """save's and make_checkpoint's arguments, refused in one line at the call
    (an asynchronous checkpoint's too, not from the background)."""
    store.check_step(step)
    if arrays is not None and not isinstance(arrays, Mapping):
        raise ConfigError(f"arrays: must be a dict of arrays by name, not a "
                          f"{type(arrays).__name__}, e.g. arrays={{'model': model.state_dict()}}")
    for key in arrays or {}:
        if not isinstance(key, str):
            raise ConfigError(f"arrays: the name {key!r} is a {type(key).__name__}; name each "
                              f"array with a str, e.g. arrays={{{str(key)!r}: ...}}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ConfigError(f"metadata={metadata!r}: must be a dict of plain JSON, or None")
    store.check_json(dict(metadata or {}), "metadata")


def _check_should_save(step: Any, every: Any) -> None:
    """should_save's step, a whole number ('4' failed inside, 1.5 was never
    due), and its interval, a whole number of steps, 1 or more."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ConfigError(f"step={step!r}: must be a whole number, 0 or more, the step just "
                          "trained")
    if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
        raise ConfigError(f"every={every!r}: must be a whole number of steps, 1 or more (1: a "
                          "checkpoint every step), the checkpoint interval")


def _publish_one(path: Path, captured: store.Capture) -> Path:
    name, sha = store.write_capture(path, captured)
    store.publish(path, [(name, sha)])
    store.remove_leftovers(path, keep=name)
    return path / name


def _publish_ranks(path: Path, captured: store.Capture, rank: int, world_size: int,
                   check: bool = False) -> Path:
    """Each rank writes its own rank-NNNNN/ directory; rank 0 names them all
    in LATEST once every rank has written, so LATEST never mixes steps.
    ``check`` (the first save): the ranks first check that every one
    checkpoints into this directory, synchronously, else every rank refuses
    before writing."""
    if check:
        mine = rank_commit.Setup(os.path.realpath(path), asynchronous=False)
        setups = rank_setup.synchronous_setups(rank, world_size, mine)
        message = rank_commit.mismatch_message(setups, captured.step)
        if message:
            raise CheckpointWriteError(message)
    rank_dir = f"rank-{rank:05d}"
    name, sha = store.write_capture(path / rank_dir, captured,
                                    rank={"rank": rank, "world_size": world_size})
    entries = distributed.all_gather((f"{rank_dir}/{name}", sha, captured.step))
    # every rank gets the same list, so all refuse alike (none waits on another)
    message = rank_commit.different_steps(
        str(path), {r: e[2] for r, e in enumerate(entries)}, entries[0][2])
    if message:
        shutil.rmtree(path / rank_dir / name, ignore_errors=True)
        raise CheckpointWriteError(message)
    if rank == 0:
        store.publish(path, [(e[0], e[1]) for e in entries])
        store.remove_leftovers(path, keep="")
    distributed.barrier()
    store.remove_leftovers(path / rank_dir, keep=name)
    # Rank 0 records next, hashing every rank's directory: none may still be
    # deleting its old snapshot then (the row's .dir would list files gone).
    distributed.barrier()
    return path / rank_dir / name


class _Background:
    """One background save, run by the single worker thread of all
    Checkpointers (one at a time, in order). concurrent.futures joins its
    workers at interpreter exit, so a checkpoint in flight is finished whole
    (or, on SIGKILL, abandoned whole: the store's atomic publish sees to that).
    The worker is process_state's: a forked child gets its own."""

    def __init__(self, work, step: int, path: Path) -> None:
        self.step = step
        if STATE.background_pool is None:
            STATE.background_pool = ThreadPoolExecutor(1, thread_name_prefix="dvc-dali-checkpoint")
        self._future = STATE.background_pool.submit(work)
        self._unread = (step, str(path), self._future)
        STATE.unread_saves.append(self._unread)  # until joined; a failure is said at exit

    def join(self) -> None:
        try:
            self._future.result()  # re-raises the background error in the training thread
        finally:
            if self._unread in STATE.unread_saves:
                STATE.unread_saves.remove(self._unread)

    @staticmethod
    def drain() -> None:
        """Until every save handed to the background so far has ended."""
        if STATE.background_pool is not None:
            STATE.background_pool.submit(lambda: None).result()

    def settle(self) -> None:
        """Until it has ended, its result left for `join`."""
        wait_for_futures([self._future])

    def done(self) -> bool:
        return self._future.done()
