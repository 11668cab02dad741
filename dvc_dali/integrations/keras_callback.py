"""Keras 3 ``model.fit`` checkpointed by a Checkpointer (the door to Keras).

The model's variables (weights, and the seed generators' states: dropout
draws the same numbers) and the optimizer's are saved as arrays, no pickle;
the data's position is the ``tf_dataset`` streams' own. The learning rate is
the compiled optimizer's, as a changed ``lr`` param should be.

Keras cannot start ``fit`` in the middle of an epoch, so a run resumed
mid-epoch trains the rest of that epoch with a first ``fit`` call, then the
later epochs (:meth:`DaliCheckpoint.fit`).
"""

from __future__ import annotations

# The door to Keras: setting model._initial_epoch is how Keras's own
# BackupAndRestore starts a resumed fit at its epoch.
# ruff: noqa: SLF001

import contextlib
import re
import weakref
from typing import Any, Callable

import keras
import numpy as np

from ..dali import dali_tf
from ..core.errors import ConfigError
from ..core.log import logger
from .fit_end import unfinished_line


# A fit given its own initial_epoch trained other epochs than the saved step
# says, and a resume started at the checkpoint's: more or fewer steps in all.
_INITIAL_EPOCH = (
    "keras_callback(): fit was given initial_epoch={}, but the callback starts fit at its "
    "checkpoint's epoch (epoch = step // steps_per_epoch), so a resumed run would train "
    "other epochs than an uninterrupted one. Leave initial_epoch out.")

# Per Checkpointer, the callback that began the batch Keras is at: a second
# callback of the same Checkpointer in one fit would take every checkpoint
# again, each a row of its own. Weakly: it must not keep the Checkpointer.
_BEGUN: weakref.WeakKeyDictionary[Any, DaliCheckpoint] = weakref.WeakKeyDictionary()


class DaliCheckpoint(keras.callbacks.Callback):
    """The Keras 3 callback `dvc_dali.Checkpointer.keras_callback` returns
    (its arguments are documented there).

    Attributes:
        step: optimizer steps done, over all fit calls (resumes included).

    Raises:
        ConfigError: ``every`` is not a positive number of steps.
    """

    def __init__(self, ck: Any, every: int, live: Any = None,
                 on_checkpoint: Callable[[int, dict[str, float]], None] | None = None) -> None:
        super().__init__()
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"keras_callback(every={every!r}): a positive number of steps")
        self._ck, self._every = ck, every
        self._live, self._on_checkpoint = live, on_checkpoint
        self.step = ck.step  # optimizer steps done, over all fit calls
        self._saved_step = ck.step
        self._last_logs: dict[str, Any] = {}
        self._at_epoch_end = False  # a due checkpoint waits for the epoch's validation
        self._restored = not ck.resumed
        self._plan: int | None = None  # steps per epoch, while fit() drives model.fit
        self._begin = 0
        self._open: int | None = None  # the batch begun and not yet ended
        self._first_epoch: int | None = None  # the epoch a fit must start at
        self._fit_end: int | None = None  # the step the current fit ends at
        # a resume from inside a fit: no dataset may be read before it trains again
        self._replay_checked = not ck.resumed

    # -- what fit() does for a run resumed mid-epoch ------------------------
    def fit(self, model: Any, x: Any, *, epochs: int, steps_per_epoch: int,
            callbacks: list[Any] | tuple[Any, ...] = (), **kwargs: Any) -> Any:
        """``model.fit(x, epochs=..., steps_per_epoch=..., callbacks=[this, ...])``
        from where the checkpoint is, also in the middle of an epoch.

        Keras can only start ``fit`` at an epoch's start, so a run resumed in
        the middle of an epoch trains the rest of that epoch in one
        ``model.fit`` call and the later epochs in a second. The run's last
        step is checkpointed at the end.

        Args:
            model: the compiled Keras model.
            x: the dataset from `dvc_dali.Checkpointer.tf_dataset`, as it was
                returned.
            epochs: the total number of epochs of the run.
            steps_per_epoch: steps in each epoch; required (a
                ``DALIDataset`` never ends).
            callbacks: more Keras callbacks.
            **kwargs: more ``model.fit`` arguments.

        Returns:
            The last ``History``.

        Raises:
            ConfigError: no dataset was built with `tf_dataset`, fit was
                given another dataset, or ``callbacks`` holds this callback
                (fit adds it itself).
            BatchMismatchError: a batch differs from the one the resumed run
                produced (a `dvc_dali.PipelineMismatchError`).
        """
        if "initial_epoch" in kwargs:
            raise ConfigError(_INITIAL_EPOCH.format(kwargs["initial_epoch"]))
        epoch, done = divmod(self.step, steps_per_epoch)
        history = None
        if epoch >= epochs and not self._restored:  # no model.fit below restores it
            self.set_model(model)  # the script saves this model: the checkpoint's, not a fresh one
            self._restore()
        kwargs.setdefault("shuffle", False)  # a dataset is not shuffled by fit; Keras warns
        self._plan, self._fit_end = steps_per_epoch, epochs * steps_per_epoch
        try:
            if done and epoch < epochs:  # the rest of the interrupted epoch
                with _not_finalized(model.optimizer, epoch + 1 < epochs):
                    history = model.fit(x, epochs=epoch + 1, initial_epoch=epoch,
                                        steps_per_epoch=steps_per_epoch - done,
                                        callbacks=[self, *callbacks], **kwargs)
                epoch += 1
            if epoch < epochs:
                history = model.fit(x, epochs=epochs, initial_epoch=epoch,
                                    steps_per_epoch=steps_per_epoch,
                                    callbacks=[self, *callbacks], **kwargs)
        finally:
            self._plan = None
        self._save_last()
        self._say_if_unfinished("cb.fit")
        return history

    # -- Keras hooks --------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Keras hook: restores the model's and optimizer's saved variables
        and sets the epoch to start from.

        Raises:
            ConfigError: no dataset was built with `tf_dataset`, no
                ``steps_per_epoch``, or a checkpoint in the middle of an
                epoch met a plain ``model.fit`` (use `fit`).
        """
        if not self._ck.tf_datasets:
            raise ConfigError(
                "keras_callback(): no dataset was built with Checkpointer.tf_dataset(), so the "
                "data's position would not be saved and a resumed fit would train on other "
                "batches. Build the training data with ck.tf_dataset(...).")
        steps = self._plan or self.params.get("steps")
        if not steps:
            raise ConfigError(
                "model.fit(..., steps_per_epoch=N) is needed with keras_callback(): a "
                "DALIDataset never ends, so Keras cannot tell where an epoch ends.")
        self._open = None
        _BEGUN.pop(self._ck, None)  # what an earlier fit that failed left
        if not self._restored:
            self._restore()
        self._typed_train_function()
        epoch, done = divmod(self.step, steps)
        self._first_epoch = epoch
        if self._plan is None:
            self._fit_end = self.params.get("epochs", 0) * steps
        if self.step < self._fit_end:  # a fit with nothing to train reads nothing
            self._refuse_replayed_reads()
        if self._plan is None:
            if done:
                raise ConfigError(
                    f"{self._ck.path}: the checkpoint is at step {self.step}, inside epoch "
                    f"{epoch} (step {done} of {steps}), and model.fit can only start an epoch "
                    "at its beginning. Call cb.fit(model, dataset, epochs=..., "
                    "steps_per_epoch=...) instead of model.fit: it trains the rest of that "
                    "epoch first.")
            self.model._initial_epoch = epoch or None  # as keras.callbacks.BackupAndRestore

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Keras hook: a batch a finite dataset ran out in is not open any more.

        Raises:
            ConfigError: fit starts at another epoch than the checkpoint's
                (``model.fit(initial_epoch=...)``).
        """
        self._open = None
        first, self._first_epoch = self._first_epoch, None
        if first is not None and epoch != first:
            raise ConfigError(_INITIAL_EPOCH.format(epoch))

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Keras hook: notes where the batch count starts.

        Raises:
            ConfigError: the callback is in fit's callbacks twice, or another
                callback of its Checkpointer is.
        """
        if self._open is not None:  # Keras calls each listed callback: steps counted twice
            raise ConfigError(
                "keras_callback(): the callback is in fit's callbacks twice, so each step "
                "would be counted twice (rows and resumes at the wrong steps). Give it once: "
                "cb.fit(model, ds, ...) adds it itself, so do not list it in callbacks=.")
        other = _BEGUN.get(self._ck)
        if other is not None and other is not self and other._open is not None:
            raise ConfigError(
                "keras_callback(): fit has two callbacks of one Checkpointer, which would "
                "record each checkpoint twice; give it one (make one ck.keras_callback()).")
        _BEGUN[self._ck] = self
        self._open = self._begin = batch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Keras hook: checkpoints every ``every`` steps and on preemption."""
        self._open = None
        before, self.step = self.step, self.step + batch - self._begin + 1
        self._last_logs = dict(logs or {})  # the run's last row holds its last step's
        if not any(self._ck.tf_datasets.values()):
            raise ConfigError(
                "model.fit was given a dataset other than the one Checkpointer.tf_dataset() "
                "returned (a .map() or .batch() on it makes a new dataset whose position "
                "dvc-dali cannot see). Pass such steps as tf_dataset(..., transform=lambda ds: "
                "ds.map(...)) and give fit the dataset it returns.")
        crossed = self.step // self._every != before // self._every  # steps_per_execution > 1
        if self._ck.should_save(self.step, self._every) or crossed:
            steps = self._plan or self.params.get("steps")
            if steps and self.step % steps == 0:  # an epoch's end: after its validation
                self._at_epoch_end = True
            else:
                self._checkpoint(logs or {})

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Keras hook: the checkpoint due at an epoch's last step, taken after
        the epoch's validation (with its val_ metrics). Taken before, it held
        the validation data's position before a validation the resumed fit,
        which starts at the next epoch, never repeats: every later validation
        read the batches of the one before."""
        if self._at_epoch_end:
            self._at_epoch_end = False
            self._checkpoint(logs or self._last_logs)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Keras hook: checkpoints the last step (under a plain ``model.fit``)."""
        if self._plan is None:
            self.model._initial_epoch = None  # it would hold for the model's next fit too
            self._save_last()
            self._say_if_unfinished("model.fit")

    def _refuse_replayed_reads(self) -> None:
        """A run resumed from a checkpoint taken inside a fit (not at its end)
        went on, uninterrupted, reading its datasets in that fit: a dataset
        the resumed script read before its fit (a model.evaluate between
        two fits, a peek at a batch) took batches the fit read, and the later
        validations or steps read others, silently (found by a sweep). A
        checkpoint at a fit's end cannot tell: the script's next lines ran
        after it uninterrupted too."""
        if self._replay_checked:
            return
        self._replay_checked = True
        saved = self._ck.metadata.get("keras")
        read = sorted(name for name, iterated in self._ck.tf_datasets.items() if iterated)
        if read and isinstance(saved, dict) and saved.get("fit_end") is False:
            raise ConfigError(
                f"{self._ck.path}: the script read tf_dataset {', '.join(map(repr, read))} "
                f"before the resumed fit, but step {self._ck.step} was saved inside a fit, "
                "where an uninterrupted run read those batches: the resumed fit would read "
                "others. Read the datasets only in fit (validation_data=), or after the run.")

    def _typed_train_function(self) -> None:
        """A batch that differs from the recorded one is refused inside the
        dataset, in a thread of TensorFlow's, which fails the train function
        with an error of its own: the refusal (BatchMismatchError, with its
        message) is raised instead. Keras made the train function before
        on_train_begin and keeps it for the model's later fits."""
        step = self.model.train_function
        if step is None or getattr(step, "_dvc_dali_typed", False):
            return
        # weakly: the model keeps the function, and must not keep the
        # Checkpointer (and its directory lock) past its last reference
        ck = weakref.ref(self._ck)

        def train_function(iterator: Any) -> Any:
            train_function._dvc_dali_iterator = weakref.ref(iterator)
            _refuse_superseded(iterator)
            with dali_tf.typed_errors(lambda: getattr(ck(), "batch_failure", None)):
                return step(iterator)

        train_function._dvc_dali_typed = True
        train_function._dvc_dali_iterator = lambda: None
        self.model.train_function = train_function

    # -- saving and restoring ----------------------------------------------
    def _save_last(self) -> None:
        """The run's end is a row too (DVC 2 recorded the last checkpoint)."""
        if self.step != self._saved_step:
            self._checkpoint(self._last_logs)

    def _say_if_unfinished(self, fit: str) -> None:
        """A fit whose epochs * steps_per_epoch ended before total_steps left
        the run unfinished, its last row looking like a finished run's: said
        (a second fit, a later phase, is legitimate: it continues)."""
        line = unfinished_line(str(self._ck.path), self.step, self._ck.total_steps, fit,
                               f"give fit epochs * steps_per_epoch = {self._ck.total_steps}")
        if line is not None:
            logger.warning("%s", line)

    def _checkpoint(self, logs: dict[str, Any]) -> None:
        # the training data's position: refused where another iterator took it over
        _refuse_superseded(getattr(self.model.train_function, "_dvc_dali_iterator",
                                   lambda: None)())
        metrics = {key: float(value) for key, value in logs.items()
                   if np.ndim(value) == 0}
        # an asynchronous checkpoint in flight is recorded first: its row holds
        # the metrics and the model files as they are when it is recorded
        self._ck.wait()
        if self._live is not None and metrics:
            self._live.step = self.step
            for key, value in metrics.items():  # Keras's val_loss as val/loss
                self._live.log_metric(f"val/{key[4:]}" if key.startswith("val_") else
                                      f"train/{key}", value)
            self._live.next_step()
        if self._on_checkpoint is not None:
            self._on_checkpoint(self.step, metrics)
        self._saved_step = self.step
        model, optimizer = self._variables()
        self._ck.make_checkpoint(
            self.step,
            arrays={"keras": {"model": [np.asarray(v) for _, v in model],
                              "optimizer": [np.asarray(v) for _, v in optimizer]}},
            metadata={"keras": {"model": [p for p, _ in model],
                                "optimizer": [p for p, _ in optimizer], **metrics,
                                "fit_end": self.step == self._fit_end}})

    def _variables(self) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        """(path, variable) of the model and of its optimizer, in a fixed order."""
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        return ([(v.path, v) for v in self.model.variables],
                [(v.path, v) for v in (optimizer.variables if optimizer is not None else [])])

    def _restore(self) -> None:
        where = f"{self._ck.path} (step {self._ck.step})"
        if not self.model.built:
            raise ConfigError("keras_callback(): build the model before fit (give it a "
                              "keras.Input), so its saved variables can be restored.")
        saved = self._ck.arrays.get("keras")
        names = self._ck.metadata.get("keras")
        if not isinstance(saved, dict) or not isinstance(names, dict):
            raise ConfigError(f"{where}: holds no Keras model (written by another trainer?). "
                              "Resume it with the trainer that wrote it, or start over with "
                              "`dvc-dali reset`.")
        model, optimizer = self._variables()
        for part, now in (("model", model), ("optimizer", optimizer)):
            values, paths = saved.get(part), names.get(part)
            differ = first_difference(paths, [p for p, _ in now])
            if differ or len(values or ()) != len(now):
                raise ConfigError(
                    f"{where}: the saved {part} variables are not this {part}'s "
                    f"({differ or 'as many variables as values'}). Resume with the model and "
                    "optimizer that wrote it, or start over with `dvc-dali reset`.")
            for (path, variable), value in zip(now, values):
                if path.rsplit("/", 1)[-1] == "learning_rate":
                    continue  # the compiled optimizer's: a changed lr applies on resume
                if tuple(variable.shape) != tuple(np.shape(value)):
                    raise ConfigError(
                        f"{where}: {part} variable {path!r} was saved with shape "
                        f"{tuple(np.shape(value))}, this one has {tuple(variable.shape)}. "
                        "Resume with the model that wrote it, or start over with "
                        "`dvc-dali reset`.")
                variable.assign(np.asarray(value).astype(variable.dtype, copy=False))
        self._restored = True


def _refuse_superseded(iterator: Any) -> None:
    """Refuses training data whose stream another iterator took over in this
    fit: the checkpoint would save that one's position, and a resumed fit
    train on other batches than an uninterrupted one (found by a sweep)."""
    if iterator is not None and dali_tf.superseded(iterator):
        raise ConfigError(
            "keras_callback(): the tf_dataset fit trains from was read by another iterator "
            "during the fit (validation_data= or model.evaluate/predict given the training "
            "dataset), so a checkpoint would save that iterator's position and a resumed fit "
            "would train on other batches. Validate on a dataset of its own: "
            "ck.tf_dataset(\"val\", ...).")


@contextlib.contextmanager
def _not_finalized(optimizer: Any, more: bool) -> Any:
    """Where a second model.fit follows (``more``), the first one's end
    leaves the model's weights as they are: Keras finalizes them at each
    fit's end, which with ``use_ema`` writes the moving average into them,
    and one uninterrupted fit does that once, at its end (a resumed run went
    on training from the average: found by a sweep)."""
    if not more or optimizer is None:
        yield
        return
    optimizer.finalize_variable_values = lambda var_list: None
    try:
        yield
    finally:
        del optimizer.finalize_variable_values


# A LossScaleOptimizer (mixed_float16) names its inner optimizer's variables
# under its own scope when a train step builds them, not when build() does
# before a restore: the same variables, in the same order (found by a sweep:
# every resume of such a run was refused).
_LOSS_SCALE = re.compile(r"^loss_scale_optimizer/")


def first_difference(saved: Any, now: list[str]) -> str:
    """'' where the saved variable paths are this model's or optimizer's
    (a LossScaleOptimizer's scope aside); else the first that differs."""
    if not isinstance(saved, list):
        return "none saved"
    for i, (old, new) in enumerate(zip(saved, now)):
        if _LOSS_SCALE.sub("", str(old)) != _LOSS_SCALE.sub("", new):
            return f"variable {i} is {str(old)[:80]!r} saved, {new[:80]!r} now"
    if len(saved) != len(now):
        return f"{len(saved)} saved, {len(now)} now"
    return ""
