"""Train the digit classifier with PyTorch from a DALI pipeline, checkpointing with dvc-dali.

    python examples/train.py             # with params.yaml train.framework: torch
    dvc exp run -S train.framework=torch

The PyTorch twin of examples/train.py: the same DALI pipeline
(common.digits_pipeline), params, outputs (checkpoint/, model/model.npz,
dvclive/) and DVC_DALI_EXAMPLE_KILL_AT_STEP behaviour, but a torch.nn MLP
trained with torch.optim.AdamW, fed by DALIGenericIterator over epochs (the
last batch of an epoch is partial: 1797 images at batch 32 make 57 steps).
The checkpoint holds the DALI iterator, the model's and the optimizer's
state_dict(); dvc-dali adds torch's (and Python's, NumPy's) global random
generators itself, restored when restore() reads ck.arrays. A rerun after an
interruption resumes and writes byte for byte the model an uninterrupted run
writes (on the CPU).
AdamW's learning rate is `train.adam_lr` (default 0.01; `train.lr` is the
NumPy example's SGD step, 0.1, at which AdamW barely learns); a changed
`adam_lr` on resume is applied to the restored optimizer. Needs the torch
extra (see README).
"""

import os

# Before torch and NumPy load: single-threaded CPU math, and deterministic
# cuBLAS when torch.use_deterministic_algorithms(True) runs on a GPU.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import sys  # noqa: E402
import time  # noqa: E402
from collections import OrderedDict  # noqa: E402
from pathlib import Path  # noqa: E402


try:
    import torch  # noqa: E402
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy  # noqa: E402
except ImportError as exc:
    sys.exit(f"train.framework is torch, but PyTorch is not installed ({exc}). Install the "
             "torch extra (python3 -m pip install -e \".[example,torch]\"), or set "
             "train.framework to numpy or keras.")
from common import (CLASSES, CROP, IntervalMeter, checkpoint_interval,  # noqa: E402
                    digits_pipeline, kill_at_step, kill_if_at, parse_args, read_params,
                    save_arrays_zip)

import dvc_dali  # noqa: E402


def pick_device(requested: str) -> str:
    """'gpu' when torch sees CUDA and DALI can use it (and it is wanted), else 'cpu'."""
    if requested == "cpu":
        return "cpu"
    why = None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # ranks on this machine (torchrun)
    if not torch.cuda.is_available():
        why = f"torch {torch.__version__} sees no CUDA device"
    elif local > torch.cuda.device_count():  # NCCL needs one GPU per rank
        why = f"{local} ranks on this machine but {torch.cuda.device_count()} GPU(s)"
    else:
        try:
            from nvidia.dali import backend

            if backend.GetCUDADeviceCount() < 1:
                why = "DALI sees no CUDA device"
        except Exception as exc:  # a CPU-only DALI, driver errors
            why = f"DALI cannot use CUDA ({type(exc).__name__}: {exc})"
    if why is None:
        return "gpu"
    if requested == "gpu":
        sys.exit(f"train.device is gpu, but no GPU is usable ({why}). Install a CUDA build "
                 "of torch and DALI on a machine with a CUDA GPU, or set train.device to cpu "
                 "or auto.")
    print(f"train: no usable GPU ({why}); device auto falls back to the CPU")
    return "cpu"


def make_model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(OrderedDict(
        fc1=torch.nn.Linear(CROP * CROP, hidden),
        relu=torch.nn.ReLU(),
        fc2=torch.nn.Linear(hidden, CLASSES),
    ))


def restore(ck, model, opt, lr: float) -> None:
    saved = ck.arrays
    if "model" not in saved or "optim" not in saved:
        sys.exit(f"{ck.path}: the checkpoint at step {ck.step} holds no PyTorch model and "
                 f"optimizer (it holds {sorted(saved)}; written with train.framework numpy?). "
                 f"Set train.framework back to resume it, or delete {ck.path} to start over.")
    try:
        model.load_state_dict(saved["model"])
    except RuntimeError as exc:
        sys.exit(f"{ck.path}: the saved model does not fit this one (train.hidden changed?): "
                 f"{str(exc).splitlines()[0]} ... Set train.hidden back to resume, or delete "
                 f"{ck.path} to start over.")
    opt.load_state_dict(saved["optim"])
    for group in opt.param_groups:  # lr may change on resume: params.yaml wins
        group["lr"] = lr


def save_model(path: Path, model: torch.nn.Module) -> None:
    """The state_dict, byte-stable (common.save_arrays_zip)."""
    save_arrays_zip(path, ((name, tensor.detach().cpu().contiguous().numpy())
                           for name, tensor in model.state_dict().items()))


def init_ranks(gpu: bool, torch_device: torch.device) -> tuple[int, int, torch.device]:
    """(rank, world size, device). Under torchrun (python -m
    torch.distributed.run --nproc_per_node N ...): data parallel, one DALI
    shard per rank, gradients averaged across ranks."""
    rank, world = 0, int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.distributed.init_process_group("nccl" if gpu else "gloo")
        rank = torch.distributed.get_rank()
        if gpu:
            torch_device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return rank, world, torch_device


def next_batch(loader):
    try:
        return next(loader)
    except StopIteration:  # end of an epoch; auto_reset started the next one
        return next(loader)


def train_step(model, opt, batch: dict, torch_device: torch.device,
               world: int) -> tuple[float, float]:
    """One AdamW step, gradients averaged across ranks: (loss, accuracy) of the batch."""
    x = batch["images"].to(torch_device).reshape(batch["images"].shape[0], -1)
    y = batch["labels"].to(torch_device).reshape(-1).long()
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if world > 1:
        for param in model.parameters():
            torch.distributed.all_reduce(param.grad)
            param.grad /= world
    opt.step()
    return float(loss.detach()), float((logits.argmax(dim=1) == y).float().mean())


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)

    p = read_params(Path(args.params))
    steps, every = int(p["steps"]), int(p["checkpoint_every"])
    lr = float(p["adam_lr"])  # train.lr is the NumPy example's SGD step
    kill_at = kill_at_step()
    if not Path(p["data"]).is_dir():
        sys.exit(f"train.data: {p['data']} is not a directory; run examples/prepare.py first")

    device = pick_device(p["device"])
    gpu = device == "gpu"
    torch_device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(int(p["seed"]))

    rank, world, torch_device = init_ranks(gpu, torch_device)
    ck = dvc_dali.Checkpointer(args.checkpoint, total_steps=steps,
                               params={k: v for k, v in p.items() if k != "steps"})
    # Raises dvc_dali.PipelineMismatchError when batch_size, seed or the data
    # differ from the checkpoint being resumed: let it propagate.
    pipe = ck.pipeline("train", digits_pipeline, batch_size=int(p["batch_size"]),
                       num_threads=min(4, os.cpu_count() or 1),
                       device_id=torch_device.index if gpu else None, seed=int(p["seed"]),
                       data=str(p["data"]), gpu=gpu, shard_id=rank, num_shards=world)
    # Epochs end at the reader's last image (a partial batch); the iterator's
    # counters are saved with the checkpoint and restored exactly.
    loader = ck.iterator(DALIGenericIterator, [pipe], ["images", "labels"],
                         reader_name="reader", last_batch_policy=LastBatchPolicy.PARTIAL,
                         auto_reset=True)

    model = make_model(int(p["hidden"])).to(torch_device)  # seeded init
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    if ck.resumed:
        restore(ck, model, opt, lr)
        print(f"train: resuming from step {ck.step} ({ck.path}) on {device} (torch)")
    else:
        print(f"train: starting on {device} (torch): {steps} steps, batch {p['batch_size']}, "
              f"seed {p['seed']}, lr {lr}, checkpoint every {every}")
    start = ck.step

    live = ck.live(args.live) if rank == 0 else _NoLive()  # rank 0 logs and writes the model

    t0 = time.perf_counter()
    meter = IntervalMeter()
    model.train()
    for step in range(start + 1, steps + 1):
        meter.add(*train_step(model, opt, next_batch(loader)[0], torch_device, world))
        if ck.should_save(step, every) or step == steps:
            checkpoint_interval(ck, live, step, steps, *meter.take(), t0, kill_at,
                                lambda: rank == 0 and save_model(Path(args.model), model),
                                arrays={"model": model.state_dict(), "optim": opt.state_dict()},
                                metadata={"lr": lr, "framework": "torch"})
        else:
            kill_if_at(step, kill_at)

    ck.wait()  # an asynchronous last checkpoint recorded before its row's model is rewritten
    if rank == 0:
        save_model(Path(args.model), model)
        print(f"train: wrote {args.model} at step {max(start, steps)}")
    live.end()
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


class _NoLive:
    """DVCLive stand-in for ranks other than 0: one writer of the metrics."""

    step = 0

    def log_metric(self, *args, **kwargs) -> None:
        pass

    next_step = end = log_metric


if __name__ == "__main__":
    sys.exit(main())
