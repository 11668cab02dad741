"""Train the digit classifier with PyTorch Lightning from DALI, checkpointing with dvc-dali.

    python examples/train.py             # with params.yaml train.framework: lightning
    dvc exp run -S train.framework=lightning

The Lightning twin of examples/train.py: the same DALI pipeline
(common.digits_pipeline), params, outputs (checkpoint/, model/model.npz,
dvclive/) and DVC_DALI_EXAMPLE_KILL_AT_STEP behaviour, but a LightningModule
(an MLP with dropout, AdamW at `train.adam_lr`) trained by `Trainer.fit`
from a DALIGenericIterator (an epoch is 57 steps, the last batch partial).
`Checkpointer.lightning_callback` saves Lightning's whole training state
(model, optimizer, loop progress) as arrays with the DALI iterator and the
global random generators (dropout); a rerun after an interruption, also in
the middle of an epoch, resumes and writes byte for byte the model an
uninterrupted run writes (on the CPU). Needs the `lightning` extra.
"""

import os

# Before torch and NumPy load: single-threaded CPU math, bitwise reproducible.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import sys  # noqa: E402
from collections import OrderedDict  # noqa: E402
from pathlib import Path  # noqa: E402


try:
    import lightning.pytorch as pl  # noqa: E402
    import torch  # noqa: E402
except ImportError as exc:
    sys.exit(f"train.framework is lightning, but PyTorch Lightning is not installed ({exc}). "
             "Install the lightning extra, pip install -e \".[example,lightning]\", or set "
             "train.framework to numpy.")
from common import (CLASSES, CROP, KILL_ENV, digits_pipeline, kill_at_step,  # noqa: E402
                    cpu_adam_params, parse_args, read_params,
                    save_arrays_zip)
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy  # noqa: E402

import dvc_dali  # noqa: E402


class Digits(pl.LightningModule):
    def __init__(self, hidden: int, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(OrderedDict(
            flatten=torch.nn.Flatten(),
            fc1=torch.nn.Linear(CROP * CROP, hidden),
            relu=torch.nn.ReLU(),
            drop=torch.nn.Dropout(0.1),  # torch's generator: dvc-dali saves and restores it
            fc2=torch.nn.Linear(hidden, CLASSES),
        ))

    def training_step(self, batch, batch_idx):
        x, y = batch[0]["images"], batch[0]["labels"].reshape(-1).long()
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.log("train/loss", loss, on_step=True)
        self.log("train/acc", (logits.argmax(dim=1) == y).float().mean(), on_step=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)

    def on_train_start(self) -> None:
        for group in self.optimizers().optimizer.param_groups:  # lr may change on resume
            group["lr"] = self.lr


def save_model(path: Path, model: torch.nn.Module) -> None:
    """The state_dict, byte-stable (common.save_arrays_zip)."""
    save_arrays_zip(path, ((name, tensor.detach().cpu().contiguous().numpy())
                           for name, tensor in model.state_dict().items()))


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    p = read_params(Path(args.params))
    steps, every, lr = cpu_adam_params(p, "lightning", "in this example")
    kill_at = kill_at_step()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(int(p["seed"]))

    ck = dvc_dali.Checkpointer(args.checkpoint, total_steps=steps,
                               params={k: v for k, v in p.items() if k != "steps"})
    # Raises dvc_dali.PipelineMismatchError when batch_size, seed or the data
    # differ from the checkpoint being resumed: let it propagate.
    pipe = ck.pipeline("train", digits_pipeline, batch_size=int(p["batch_size"]),
                       num_threads=min(4, os.cpu_count() or 1), device_id=None,
                       seed=int(p["seed"]), data=str(p["data"]))
    loader = ck.iterator(DALIGenericIterator, [pipe], ["images", "labels"],
                         reader_name="reader", last_batch_policy=LastBatchPolicy.PARTIAL,
                         auto_reset=True)
    model = Digits(int(p["hidden"]), lr)  # seeded init
    live = ck.live(args.live)

    def on_checkpoint(step: int, metrics: dict) -> None:
        save_model(Path(args.model), model)  # every row's model is that step's
        print(f"step {step:>6}/{steps}  loss {metrics.get('train/loss', float('nan')):.4f}  "
              f"acc {metrics.get('train/acc', float('nan')):.3f}", flush=True)

    cb = ck.lightning_callback(every, live=live, on_checkpoint=on_checkpoint)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                         callbacks=[cb, *([_KillAt(kill_at, cb)] if kill_at else [])],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    print(f"train: {'resuming from step %d' % ck.step if ck.resumed else 'starting'} "
          f"(lightning): {steps} steps, batch {p['batch_size']}, seed {p['seed']}, lr {lr}, "
          f"checkpoint every {every}")
    cb.fit(trainer, model, loader)
    save_model(Path(args.model), model)
    live.end()
    print(f"train: wrote {args.model} at step {max(ck.step, steps)}")
    return 0


class _KillAt(pl.Callback):
    """DVC_DALI_EXAMPLE_KILL_AT_STEP: SIGKILL right after that step's checkpoint
    (taken once every batch-end hook of the step has run: here, as the next
    batch starts)."""

    def __init__(self, step: int, cb) -> None:
        self.kill_step, self.cb = step, cb

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.cb.step == self.kill_step:
            import signal

            print(f"train: {KILL_ENV}={self.kill_step}: killing myself (SIGKILL)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
