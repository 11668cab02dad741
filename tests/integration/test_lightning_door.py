"""What the Lightning door refuses, in-process with a real DALI pipeline and
a real Trainer: values a checkpoint cannot hold without pickle, a resumed
run fitted without its checkpoint, training data whose position is unseen."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")
import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from nvidia.dali.plugin.pytorch import DALIGenericIterator  # noqa: E402

import dvc_dali  # noqa: E402

from tests.helpers import pipelines  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self, extra=None) -> None:
        super().__init__()
        if extra is not None:
            self.save_hyperparameters({"extra": extra})
        self.net = torch.nn.Linear(16 * 16 * 3, 3)

    def training_step(self, batch, batch_idx):
        x = batch[0]["images"].float().flatten(1) / 255.0
        return torch.nn.functional.cross_entropy(self.net(x), batch[0]["labels"].reshape(-1).long())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _setup(path, data):
    ck = dvc_dali.Checkpointer(path)
    fn, kw = pipelines.make("rotate", str(data))["train"]
    pipe = ck.pipeline("train", fn, **kw)
    it = ck.iterator(DALIGenericIterator, [pipe], ["images", "labels", "angle"],
                     reader_name="reader", auto_reset=True)
    return ck, it


def _trainer(cb, steps):
    return pl.Trainer(max_steps=steps, callbacks=[cb], logger=False, accelerator="cpu",
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)


def test_an_unrepresentable_value_is_refused_naming_it(data_dir, tmp_path):
    ck, it = _setup(tmp_path / "a", data_dir)
    cb = ck.lightning_callback(2)
    with pytest.raises(dvc_dali.ConfigError, match="without pickle.*hyper_parameters/extra"):
        cb.fit(_trainer(cb, 2), Tiny(extra={1, 2}), it)


class _Counts(pl.Callback):
    """A callback whose state is a defaultdict, as counters often are."""

    def __init__(self) -> None:
        from collections import defaultdict

        self.counts = defaultdict(int)

    def state_dict(self):
        return {"counts": self.counts}


def test_a_callbacks_dict_subclass_is_refused_naming_it_not_saved_as_a_dict(data_dir,
                                                                            tmp_path):
    # found by a sweep: saved as a plain dict, so the resumed fit's counts[...] += 1
    # failed with a KeyError (or, with .get(), counted otherwise) where the run did not
    ck, it = _setup(tmp_path / "a", data_dir)
    cb = ck.lightning_callback(2)
    trainer = pl.Trainer(max_steps=2, callbacks=[cb, _Counts()], logger=False,
                         accelerator="cpu", enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(dvc_dali.ConfigError, match="_Counts/counts': a defaultdict"):
        cb.fit(trainer, Tiny(), it)


class _Counted(Tiny):
    """A module whose own on_train_batch_end updates its state (as an EMA does)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ends", torch.zeros((), dtype=torch.int64))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.ends += 1


class _Ends(pl.Callback):
    def __init__(self) -> None:
        self.ends = 0

    def on_train_batch_end(self, *args):
        self.ends += 1

    def state_dict(self):
        return {"ends": self.ends}


def test_a_row_holds_the_batch_end_updates_of_later_callbacks_and_the_module(data_dir,
                                                                              tmp_path):
    """Found by a sweep: the checkpoint was taken in this callback's
    on_train_batch_end, before the later callbacks' and the module's own (an
    EMA, a counter), so the row of step 4 held their state of step 3 and a
    resumed fit never made step 4's updates."""
    ck, it = _setup(tmp_path / "a", data_dir)
    cb = ck.lightning_callback(2)
    model = _Counted()
    trainer = pl.Trainer(max_steps=4, callbacks=[cb, _Ends()], logger=False, accelerator="cpu",
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    cb.fit(trainer, model, it)
    ck.close()
    saved = dvc_dali.load(tmp_path / "a")
    assert saved.step == 4
    state = saved.arrays["lightning"]
    assert int(state["state_dict"]["ends"]) == 4
    assert state["callbacks"]["_Ends"]["ends"] == 4
    assert "on_train_batch_end" not in model.__dict__  # the module's own hook is back


def _fitted_then_resumed(path, data):
    """A run fitted 2 steps, then its Checkpointer built again (resumed)."""
    ck, it = _setup(path, data)
    cb = ck.lightning_callback(2)
    cb.fit(_trainer(cb, 2), Tiny(), it)
    ck.close()
    ck, it = _setup(path, data)
    return ck, it, ck.lightning_callback(2)


def test_a_resumed_run_must_fit_from_its_checkpoint(data_dir, tmp_path):
    ck, it, cb = _fitted_then_resumed(tmp_path / "b", data_dir)
    assert cb.ckpt_path == f"dvc-dali:{tmp_path / 'b'}"
    with pytest.raises(dvc_dali.ConfigError, match="ckpt_path=cb.ckpt_path"):
        _trainer(cb, 4).fit(Tiny(), train_dataloaders=cb.loader(it))


def test_other_training_data_is_refused(data_dir, tmp_path):
    ck, _ = _setup(tmp_path / "c", data_dir)
    cb = ck.lightning_callback(2)
    data = torch.utils.data.DataLoader(range(4))
    with pytest.raises(dvc_dali.ConfigError, match="not cb.loader"):
        _trainer(cb, 2).fit(Tiny(), train_dataloaders=data)


def test_a_second_fit_with_a_new_trainer_is_refused_not_recorded_steps_back(data_dir,
                                                                            tmp_path):
    """A new Trainer restarts global_step at 0: its rows were step1, step2...
    after step4, the second "step 4" holding 8 steps of training (found by
    a sweep). Refused at the start of the fit, and by the Checkpointer for
    any caller whose steps go back."""
    ck, it = _setup(tmp_path / "d", data_dir)
    cb = ck.lightning_callback(2)
    model = Tiny()
    cb.fit(_trainer(cb, 4), model, it)
    with pytest.raises(dvc_dali.ConfigError, match="this Trainer starts at step 0, but the "
                       "callback checkpointed step 4 already"):
        cb.fit(_trainer(cb, 4), model, it)
    with pytest.raises(dvc_dali.ConfigError, match="step=1: below the last checkpoint's step 4"):
        ck.make_checkpoint(1)
    ck.make_checkpoint(4)  # the same step again is taken
    ck.close()
    assert dvc_dali.load(tmp_path / "d").step == 4


def test_a_trainer_without_the_callback_is_refused_before_it_trains(data_dir, tmp_path):
    ck, it = _setup(tmp_path / "e", data_dir)
    cb = ck.lightning_callback(2)
    bare = pl.Trainer(max_steps=2, logger=False, accelerator="cpu", enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(dvc_dali.ConfigError, match="a Trainer without cb, so nothing would be "
                       r"checkpointed; build it with Trainer\(callbacks=\[cb\]"):
        cb.fit(bare, Tiny(), it)
    assert bare.global_step == 0


def test_a_ckpt_path_of_another_directory_is_refused_not_read_as_its_own(data_dir, tmp_path):
    ck, it, cb = _fitted_then_resumed(tmp_path / "f", data_dir)
    with pytest.raises(dvc_dali.ConfigError, match="ckpt_path='dvc-dali:/elsewhere': this "
                       "callback resumes only its own checkpoint"):
        _trainer(cb, 4).fit(Tiny(), train_dataloaders=cb.loader(it),
                            ckpt_path="dvc-dali:/elsewhere")


class Validated(Tiny):
    """Records each validation batch by the step it validates."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, list[float]] = {}

    def validation_step(self, batch, batch_idx):
        self.seen.setdefault(self.global_step, []).append(float(batch[0]["images"].sum()))


def _validated_fit(path, data, steps):
    ck = dvc_dali.Checkpointer(path)
    fn, kw = pipelines.make("rotate", str(data))["train"]
    train = ck.iterator(DALIGenericIterator, [ck.pipeline("train", fn, **kw)],
                        ["images", "labels", "angle"], reader_name="reader", auto_reset=True)
    val = ck.iterator(DALIGenericIterator, [ck.pipeline("val", fn, **{**kw, "seed": 9})],
                      ["images", "labels", "angle"], reader_name="reader", auto_reset=True)
    cb = ck.lightning_callback(2)
    trainer = pl.Trainer(max_steps=steps, callbacks=[cb], logger=False, accelerator="cpu",
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, val_check_interval=2,
                         check_val_every_n_epoch=None, num_sanity_val_steps=0,
                         limit_val_batches=2)
    model = Validated()
    cb.fit(trainer, model, train, val_dataloaders=cb.loader(val))
    ck.close()
    return model.seen


def test_validations_after_a_resume_read_the_batches_of_an_uninterrupted_run(data_dir,
                                                                            tmp_path):
    """The checkpoint of a step validated right after it was taken before the
    validation, which a resumed fit skips as done: every later validation
    read the batches of the one before, so the logged validation metrics
    were wrong without a word (found by a sweep)."""
    whole = _validated_fit(tmp_path / "whole", data_dir, 6)
    first = _validated_fit(tmp_path / "ck", data_dir, 2)
    resumed = _validated_fit(tmp_path / "ck", data_dir, 6)
    assert sorted(whole) == [2, 4, 6] and first == {2: whole[2]}
    assert resumed == {4: whole[4], 6: whole[6]}


def test_a_second_dvc_dali_callback_in_the_trainer_is_refused(data_dir, tmp_path):
    """Two ck.lightning_callback()s in one Trainer: the first took every
    checkpoint, the second recorded the last step again as a row of its own,
    and a resume was refused as not fitted from cb.ckpt_path (found by a
    sweep). The same callback listed twice is one callback."""
    def trainer(*callbacks):
        return pl.Trainer(max_steps=2, callbacks=list(callbacks), logger=False,
                          accelerator="cpu", enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False)

    ck, it = _setup(tmp_path / "f", data_dir)
    cb = ck.lightning_callback(2)
    cb.fit(trainer(cb, cb), Tiny(), it)
    ck.close()
    assert dvc_dali.load(tmp_path / "f").step == 2
    ck, it = _setup(tmp_path / "g", data_dir)
    cb = ck.lightning_callback(2)
    two = trainer(cb, ck.lightning_callback(2))
    with pytest.raises(dvc_dali.ConfigError, match="the Trainer has two dvc-dali callbacks"):
        cb.fit(two, Tiny(), it)
    assert two.global_step == 0
    ck.close()


def test_an_iterator_without_auto_reset_is_refused_before_it_trains(data_dir, tmp_path):
    """Without auto_reset=True the refusal came at the second epoch's first
    batch, after a whole epoch of training (found by a sweep): now at
    cb.loader / cb.fit, before any step."""
    ck = dvc_dali.Checkpointer(tmp_path / "n")
    fn, kw = pipelines.make("rotate", str(data_dir))["train"]
    it = ck.iterator(DALIGenericIterator, [ck.pipeline("train", fn, **kw)],
                     ["images", "labels", "angle"], reader_name="reader")
    cb = ck.lightning_callback(2)
    trainer = _trainer(cb, 20)
    with pytest.raises(dvc_dali.ConfigError, match="made without auto_reset=True"):
        cb.fit(trainer, Tiny(), it)
    assert trainer.global_step == 0
    ck.close()


def test_a_fit_that_ends_before_total_steps_says_the_run_is_unfinished(data_dir, tmp_path,
                                                                       capsys):
    """Trainer(max_steps=2) under a Checkpointer of total_steps=3 ended the
    run unfinished without a word (found by a sweep); one line says it."""
    ck = dvc_dali.Checkpointer(tmp_path / "u", total_steps=3)
    fn, kw = pipelines.make("rotate", str(data_dir))["train"]
    it = ck.iterator(DALIGenericIterator, [ck.pipeline("train", fn, **kw)],
                     ["images", "labels", "angle"], reader_name="reader", auto_reset=True)
    cb = ck.lightning_callback(2)
    trainer = _trainer(cb, 2)
    cb.fit(trainer, Tiny(), it)
    said = [line for line in capsys.readouterr().err.splitlines() if "unfinished" in line]
    assert said == [f"dvc-dali: trainer.fit ended at step 2 of total_steps=3 ({tmp_path / 'u'}):"
                    " the run is unfinished. A later fit continues it from step 2; to finish "
                    "it, give the Trainer max_steps=3."]
    trainer.fit_loop.epoch_loop.max_steps = 3  # a later fit of this Trainer finishes it: silent
    cb.fit(trainer, Tiny(), it)
    assert "unfinished" not in capsys.readouterr().err
    ck.close()
    assert dvc_dali.load(tmp_path / "u").step == 3
