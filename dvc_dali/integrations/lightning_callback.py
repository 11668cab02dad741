"""PyTorch Lightning ``Trainer.fit`` checkpointed by a Checkpointer (the door to Lightning).

Built on Lightning's public API only:

- :class:`DaliLoader` wraps a DALI framework iterator made with
  ``Checkpointer.iterator()``: sized (so Lightning fetches no batch ahead of
  the step it trains) and stateful (``state_dict``/``load_state_dict``, so
  Lightning >= 2.2 resumes in the middle of an epoch without its warning).
  The DALI position itself is the Checkpointer's, saved with the rest.
- :class:`DaliCheckpoint`, a ``Callback``, calls ``trainer.save_checkpoint``
  every N steps, at the end and on preemption; a ``CheckpointIO`` it installs
  turns the dict Lightning assembles (model, optimizers, LR schedulers, loop
  progress, callbacks' and the loader's states) into a dvc-dali checkpoint:
  tensors as arrays, the rest as JSON, no pickle. ``fit(ckpt_path=...)``
  with :attr:`DaliCheckpoint.ckpt_path` reads it back through the same IO.
  Other paths (a user's ``ModelCheckpoint`` files) go to the IO it replaced.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Callable

import lightning.pytorch as pl
from lightning.pytorch.plugins import CheckpointIO

from ..core.errors import ConfigError
from ..core.log import logger
from .fit_end import unfinished_line

#: What ckpt_path names a dvc-dali checkpoint by (followed by its directory).
SCHEME = "dvc-dali:"
KEY = "lightning"
_MAX_DEPTH = 64
_OURS = "_dvc_dali_checkpoint_after"  # marks the module hook this callback wrapped


class DaliLoader:
    """A DALI iterator as Lightning's training data: one epoch is
    ``len(iterator)`` batches, each what the iterator yields."""

    def __init__(self, iterator: Any, owner: DaliCheckpoint) -> None:
        try:
            self._len = len(iterator)
        except TypeError:
            raise ConfigError("the DALI iterator has no length: give it reader_name= (or "
                              "size=), so Lightning knows where an epoch ends") from None
        if getattr(iterator, "_auto_reset", "yes") == "no":  # DALI's own spelling of False
            # refused now, not at the second epoch's first batch, after an epoch of training
            raise ConfigError("the DALI iterator was made without auto_reset=True, so it would "
                              "end after its first epoch and not start the next one: make it "
                              "with ck.iterator(..., auto_reset=True)")
        self._it, self._owner = iterator, owner
        self.batches = 0  # handed to Lightning over the run, resumes included

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> DaliLoader:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:  # the previous epoch's end; auto_reset started the next one
            try:
                batch = next(self._it)
            except StopIteration:
                raise ConfigError("the DALI iterator ended and did not start the next epoch: "
                                  "make it with auto_reset=True") from None
        self.batches += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        """Lightning's stateful-loader hook: the batches handed out so far."""
        return {"dvc_dali_batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Lightning's stateful-loader hook, when it resumes.

        Raises:
            ConfigError: the checkpoint Lightning restores is not the one
                dvc-dali resumed (a plain Lightning checkpoint written with
                ``cb.loader``).
        """
        if not self._owner.loaded:
            raise ConfigError(
                "fit(ckpt_path=...) restored a Lightning checkpoint that dvc-dali did not "
                "read, so the DALI pipelines are not where it left them. Resume with "
                "ckpt_path=cb.ckpt_path (or cb.fit(trainer, model, iterator)).")
        self.batches = int(state.get("dvc_dali_batches", 0))


def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """Lightning's checkpoint with its hyperparameters' AttributeDicts as
    plain dicts (Lightning takes them back so); arrays.flatten then refuses,
    naming where, what it cannot save: any other dict subclass, such as a
    callback's defaultdict, which would come back without its default."""
    if depth > _MAX_DEPTH:
        raise ConfigError(f"the Lightning checkpoint at {where!r} is nested deeper than "
                          f"{_MAX_DEPTH} levels")
    if type(value) in (dict, OrderedDict) or type(value).__name__ == "AttributeDict":
        items = ((k, _plain(v, f"{where}/{k}", depth + 1)) for k, v in value.items())
        return OrderedDict(items) if type(value) is OrderedDict else dict(items)
    if type(value) in (list, tuple):
        return type(value)(_plain(v, f"{where}/{i}", depth + 1) for i, v in enumerate(value))
    return value


def _validation_follows(trainer: Any) -> bool:
    """Whether Lightning validates right after this training batch (its own
    decision, asked the same way). Where it cannot be asked, False: the
    checkpoint is taken at once, as before. Should the answer be wrong (a
    time-based val_check_interval), the checkpoint comes at the next batch."""
    loop = trainer.fit_loop.epoch_loop
    try:
        return (not loop._skip_next_val  # noqa: SLF001 - Lightning's own decision
                and bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher)))  # noqa: SLF001
    except (AttributeError, TypeError):
        return False


class _DaliCheckpointIO(CheckpointIO):
    """Saves and reads the paths that start with :data:`SCHEME`; hands any
    other path to the IO it replaced."""

    def __init__(self, owner: DaliCheckpoint, previous: CheckpointIO | None) -> None:
        super().__init__()
        self._owner, self._previous = owner, previous

    def _other(self, path: Any, what: str) -> CheckpointIO:
        if self._previous is None:
            raise ConfigError(f"{what} {path!r}: no CheckpointIO for paths dvc-dali does not own")
        return self._previous

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        if str(path).startswith(SCHEME):
            self._owner.write(checkpoint)
        else:
            self._other(path, "save").save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if str(path).startswith(SCHEME):
            self._owner.check_own(str(path))
            return self._owner.read()
        previous = self._other(path, "load")
        return previous.load_checkpoint(path, map_location=map_location,
                                        weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        if not str(path).startswith(SCHEME):
            self._other(path, "remove").remove_checkpoint(path)

    def teardown(self) -> None:
        if self._previous is not None:
            self._previous.teardown()


class DaliCheckpoint(pl.Callback):
    """The PyTorch Lightning callback
    `dvc_dali.Checkpointer.lightning_callback` returns (its arguments are
    documented there).

    Attributes:
        step: the optimizer step (Lightning's ``global_step``).
        loaded: whether the resumed checkpoint was read through the
            callback's ``CheckpointIO``.

    Raises:
        ConfigError: ``every`` is not a positive number of steps, or several
            processes (Lightning writes checkpoints on rank 0 only).
    """

    def __init__(self, ck: Any, every: int, live: Any = None,
                 on_checkpoint: Callable[[int, dict[str, float]], None] | None = None) -> None:
        super().__init__()
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"lightning_callback(every={every!r}): a positive number of steps")
        if ck.world_size > 1:
            raise ConfigError("lightning_callback() does not support several processes yet "
                              "(Lightning writes checkpoints on rank 0 only); train with one")
        self._ck, self._every = ck, every
        self._live, self._on_checkpoint = live, on_checkpoint
        # A resumed run's step is set when Lightning reads the checkpoint (read()),
        # which is the Checkpointer's documented resume point (its first read of
        # ck.step or ck.arrays sets the random generators back): reading ck.step
        # now would put it before Lightning builds the model (configure_model).
        # Only ck.resumed, ck.path and the like are read before then: they
        # change nothing.
        self._saved_step = self.step = 0
        self._after_validation = False  # a due checkpoint waits for the validation after it
        self._due = False  # a due checkpoint waits for the module's on_train_batch_end
        self._metrics: dict[str, float] = {}
        self.loaded = False  # the resumed checkpoint was read through our CheckpointIO

    @property
    def ckpt_path(self) -> str | None:
        """``trainer.fit(..., ckpt_path=cb.ckpt_path)``: the checkpoint being
        resumed (``dvc-dali:<path>``), or None for a fresh run.

        A ``CheckpointIO`` the callback installs reads and writes it, and
        hands every other path to the ``CheckpointIO`` it replaced, so a plain
        Lightning checkpoint stays Lightning's."""
        return f"{SCHEME}{self._ck.path}" if self._ck.resumed else None

    def loader(self, iterator: Any) -> DaliLoader:
        """The training data for ``trainer.fit``.

        Sized (an epoch is ``len(iterator)`` batches; Lightning fetches none
        ahead of the step it trains) and stateful, so Lightning resumes in
        the middle of an epoch.

        Args:
            iterator: made with `dvc_dali.Checkpointer.iterator`, with
                ``auto_reset=True`` and a length (``reader_name=``).

        Returns:
            The loader (``iterator`` itself when it is one already).

        Raises:
            ConfigError: the iterator has no length, or no auto_reset=True.
        """
        return iterator if isinstance(iterator, DaliLoader) else DaliLoader(iterator, self)

    def fit(self, trainer: Any, model: Any, iterator: Any, **kwargs: Any) -> None:
        """``trainer.fit(model, train_dataloaders=cb.loader(iterator),
        ckpt_path=cb.ckpt_path, **kwargs)``: fresh, or from the checkpoint.

        Args:
            trainer: the ``lightning.pytorch.Trainer``, with this callback.
            model: the ``LightningModule``.
            iterator: as for `loader`.
            **kwargs: more ``trainer.fit`` arguments.

        Raises:
            ConfigError: a value of Lightning's checkpoint that cannot be
                saved without pickle (an object in the hyperparameters, a
                scheduler's lambda), named where it is in the dict; or
                training data other than `loader`'s.
        """
        if self not in trainer.callbacks:  # it trained, and nothing was checkpointed
            raise ConfigError("lightning_callback(): cb.fit was given a Trainer without cb, so "
                              "nothing would be checkpointed; build it with "
                              "Trainer(callbacks=[cb], ...)")
        trainer.fit(model, train_dataloaders=self.loader(iterator), ckpt_path=self.ckpt_path,
                    **kwargs)

    # -- Lightning hooks ---------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Lightning hook: installs the callback's ``CheckpointIO``.

        Raises:
            ConfigError: the Trainer has another dvc-dali callback.
        """
        io = trainer.strategy.checkpoint_io
        if not isinstance(io, _DaliCheckpointIO):
            trainer.strategy.checkpoint_io = _DaliCheckpointIO(self, io)
        elif io._owner is not self:  # noqa: SLF001 - ours
            # the other's module hook takes the checkpoints: this one wrote
            # the last step again, and refused every resume as not restored
            raise ConfigError("lightning_callback(): the Trainer has two dvc-dali callbacks, "
                              "which would record steps twice; give it one (make one "
                              "ck.lightning_callback() and pass it to Trainer(callbacks=[cb])).")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Lightning hook: checks the training data and the resumed checkpoint.

        Raises:
            ConfigError: training data other than `loader`'s, or a resumed
                run fitted without ``ckpt_path=cb.ckpt_path``.
        """
        if not isinstance(trainer.train_dataloader, DaliLoader):
            raise ConfigError(
                "lightning_callback(): the training data is not cb.loader(iterator) over a "
                "Checkpointer.iterator(), so its position would not be saved and a resumed "
                "fit would train on other batches. Pass train_dataloaders=cb.loader(it).")
        if trainer.global_step < self._saved_step:  # its rows would go back in steps
            raise ConfigError(
                f"lightning_callback(): this Trainer starts at step {trainer.global_step}, but "
                f"the callback checkpointed step {self._saved_step} already (a new Trainer "
                "restarts global_step at 0). To train further, fit the same Trainer again "
                "with a larger max_steps or max_epochs.")
        if self._ck.resumed and not self.loaded:
            raise ConfigError(
                f"{self._ck.path} holds step {self._ck.step}, and the DALI pipelines resume "
                "there, but trainer.fit did not restore it: pass ckpt_path=cb.ckpt_path (or "
                "use cb.fit(trainer, model, iterator)).")
        self._after_module_hook(trainer, pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Lightning hook: checkpoints every ``every`` optimizer steps and on
        preemption."""
        before, self.step = self.step, trainer.global_step
        if self.step == before:
            return  # accumulating gradients: no optimizer step yet
        crossed = self.step // self._every != before // self._every
        due = self._ck.should_save(self.step, self._every) or crossed or self._after_validation
        self._after_validation = due and _validation_follows(trainer)
        self._due = due and not self._after_validation  # taken after the module's hook

    def _after_module_hook(self, trainer: Any, pl_module: Any) -> None:
        """The module's ``on_train_batch_end``, which Lightning calls after every
        callback's, takes a due checkpoint when it returns: taken in this
        callback's hook, the row held neither the later callbacks' nor the
        module's updates of that batch (an EMA, a counter), which a resumed
        fit never makes again. Set on the instance, for this fit only."""
        hook = pl_module.on_train_batch_end
        if getattr(hook, _OURS, False):
            return

        def on_train_batch_end(*args: Any, **kwargs: Any) -> Any:
            result = hook(*args, **kwargs)
            if self._due:
                self._due = False
                self._checkpoint(trainer)
            return result

        setattr(on_train_batch_end, _OURS, True)
        pl_module.on_train_batch_end = on_train_batch_end

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Lightning hook: the module's own ``on_train_batch_end`` back."""
        if getattr(pl_module.__dict__.get("on_train_batch_end"), _OURS, False):
            del pl_module.__dict__["on_train_batch_end"]

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """Lightning hook: the checkpoint of a step whose validation runs right
        after it. Taken before, it held the validation pipelines' positions
        before that validation, which a resumed fit skips as done (as
        Lightning does for a checkpoint of that batch): every later
        validation read the batches of the one before."""
        if self._after_validation and not trainer.sanity_checking:
            self._after_validation = False
            self._checkpoint(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Lightning hook: checkpoints the run's last step."""
        self._after_validation = self._due = False
        if trainer.global_step != self._saved_step:  # the run's end is a row too
            self.step = trainer.global_step
            self._checkpoint(trainer)
        line = unfinished_line(str(self._ck.path), trainer.global_step, self._ck.total_steps,
                               "trainer.fit", f"give the Trainer max_steps={self._ck.total_steps}")
        if line is not None:  # its last row would look like a finished run's
            logger.warning("%s", line)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Lightning's own SIGTERM handling ends fit at an epoch's end (exit status
        0) when the signal came after that epoch's last step was checked: the
        step is checkpointed now, and the exit is 128 + the signal."""
        signum = self._ck.preempted
        if not isinstance(exception, SystemExit) or signum is None:
            return
        if trainer.global_step != self._saved_step:
            self.step = trainer.global_step
            self._checkpoint(trainer)  # make_checkpoint exits after recording it
        if exception.code in (None, 0):  # Lightning's SIGTERMException, not our exit
            raise SystemExit(128 + signum.value)

    # -- saving and restoring ----------------------------------------------
    def _checkpoint(self, trainer: Any) -> None:
        metrics = {}
        for name, value in trainer.callback_metrics.items():
            try:
                metrics[name] = float(value)
            except (TypeError, ValueError, RuntimeError):
                continue  # not a scalar
        # an asynchronous checkpoint in flight is recorded first: its row holds
        # the metrics and the model files as they are when it is recorded
        self._ck.wait()
        if self._live is not None and metrics:
            self._live.step = self.step
            for name, value in metrics.items():
                self._live.log_metric(name, value)
            self._live.next_step()
        if self._on_checkpoint is not None:
            self._on_checkpoint(self.step, metrics)
        self._saved_step, self._metrics = self.step, metrics
        # -> write(), through our CheckpointIO
        trainer.save_checkpoint(f"{SCHEME}{self._ck.path}", weights_only=False)

    def write(self, checkpoint: dict[str, Any]) -> None:
        """Lightning's checkpoint dict as a dvc-dali checkpoint (and a row)."""
        try:
            self._ck.make_checkpoint(self.step, arrays={KEY: _plain(checkpoint, KEY)},
                                     metadata={KEY: self._metrics})
        except TypeError as exc:
            raise ConfigError(
                f"the Lightning checkpoint cannot be saved without pickle: {exc}. dvc-dali "
                "saves tensors, arrays, numbers, strings, and dicts/lists/tuples of them (an "
                "object in save_hyperparameters(): pass ignore=[...]; a scheduler's lambda "
                "state; a callback's state_dict).") from None

    def check_own(self, path: str) -> None:
        """``ckpt_path`` names this callback's checkpoint (cb.ckpt_path): any
        other ``dvc-dali:`` path was ignored, its own read instead.

        Raises:
            ConfigError: another path.
        """
        mine = os.path.realpath(self._ck.path)
        if os.path.realpath(path[len(SCHEME):]) != mine:
            raise ConfigError(
                f"ckpt_path={path!r}: this callback resumes only its own checkpoint "
                f"({SCHEME}{self._ck.path}, cb.ckpt_path). To start from another run's "
                "checkpoint, read it with dvc_dali.load() and load its weights into the model.")

    def read(self) -> dict[str, Any]:
        """The resumed dvc-dali checkpoint as Lightning's checkpoint dict.

        Raises:
            ConfigError: the checkpoint holds no Lightning checkpoint.
        """
        saved = self._ck.arrays.get(KEY)
        if not isinstance(saved, dict) or "state_dict" not in saved:
            raise ConfigError(
                f"{self._ck.path} (step {self._ck.step}) holds no Lightning checkpoint (it holds "
                f"{sorted(self._ck.arrays)}; written by another trainer?). Resume it with the "
                "trainer that wrote it, or start over with `dvc-dali reset`.")
        self.loaded = True
        self._saved_step = self.step = self._ck.step
        return saved
