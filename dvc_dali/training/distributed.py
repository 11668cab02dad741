"""torch.distributed coupling: which rank this is, the collectives a
consistent multi-rank checkpoint needs, and the process group's own store
(through which asynchronous checkpoints agree: async_ranks). torch is
imported only if it is already loaded (a process that never imported it is
not distributed)."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Mapping

from ..core.errors import CheckpointWriteError, ConfigError, RankMismatchError
from ..core.launcher import initialized_group, launcher_world
from ..core.log import logger


_dist = initialized_group  # torch.distributed where its group is initialized, else None


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside torch.distributed."""
    dist = _dist()
    return (dist.get_rank(), dist.get_world_size()) if dist else (0, 1)


def launched_rank(environ: Mapping[str, str], initialized: bool) -> tuple[int, int] | None:
    """(rank, world size) from torchrun's variables where this process is one
    of several ranks (WORLD_SIZE > 1) and torch.distributed is not
    initialized; None otherwise (one process, or initialized, or not
    started by torchrun or a launcher like it)."""
    found = launcher_world(environ)
    return found if found is not None and found[1] > 1 and not initialized else None


def checked_world(environ: Mapping[str, str]) -> tuple[int, int]:
    """:func:`world`, refused in a rank whose torch.distributed is not
    initialized yet: every rank would then write a one-process checkpoint
    into the same directory."""
    found = launched_rank(environ, _dist() is not None)
    if found is not None:
        raise ConfigError(
            f"Checkpointer built in rank {found[0]} of {found[1]} (WORLD_SIZE set by a "
            "launcher: torchrun, Lightning's DDP) before torch.distributed.init_process_group(): "
            "every rank would checkpoint as a single process into the same directory. Call "
            "init_process_group() first, then build the Checkpointer (each rank then writes "
            "its own rank-NNNNN/ and rank 0 records them together); with Lightning, "
            "lightning_callback() supports one process only: train with devices=1")
    return world()


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (JSON-like objects only)."""
    dist = _dist()
    if dist is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def max_int(value: int, group: Any = None) -> int:
    """The largest of every rank's ``value``: one all_reduce of one integer
    (what `Checkpointer.should_save` asks at every step; all_gather_object
    pickles and makes two collectives: 1.0-1.4 ms a call against 0.2 ms with
    2 gloo ranks on 2 cores), in ``group`` (a gloo group; None: the default
    group). On the CPU, but on the current GPU where NCCL, which has no CPU
    tensors, is the default group's only backend."""
    dist = _dist()
    if dist is None:
        return value
    import torch

    on_cpu = group is not None or _on_cpu(dist)
    device = "cpu" if on_cpu else torch.device("cuda", torch.cuda.current_device())
    found = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(found, op=dist.ReduceOp.MAX, group=group)
    return int(found.item())


def _on_cpu(dist: Any) -> bool:
    return route(str(dist.get_backend()), True) == DEFAULT


# where the ranks agree on an integer (route): the default group, which takes
# CPU tensors; a gloo group of every rank beside an NCCL-only default group;
# the current GPU through NCCL, where this torch has no gloo
DEFAULT, GLOO_GROUP, DEVICE = "default group", "gloo group", "device"


def route(backend: str, gloo_available: bool) -> str:
    """Where the ranks agree on should_save's signal, from the default
    group's backend (``str(dist.get_backend())``: "gloo", "nccl",
    "cpu:gloo,cuda:nccl", ...). A group that only NCCL serves has no CPU
    tensors, and reading a device result waits for everything the training
    queued on its stream: a gloo group beside it (as PyTorch's own
    asynchronous checkpoints do) keeps the agreement off the GPU."""
    nccl_only = "nccl" in backend and "cpu" not in backend
    if not nccl_only:
        return DEFAULT
    return GLOO_GROUP if gloo_available else DEVICE


class LateMax:
    """The largest of every rank's value, agreed one call late: each
    :meth:`exchange` starts an asynchronous all_reduce of this rank's value
    and returns the result of the previous call's (0 at the first), which
    every rank gets at the same call. The training thread then never waits
    for the other ranks to reach the call: one all_reduce a step cost
    1.1-1.5 ms of each rank's step (2 gloo ranks on 2 cores, the example),
    most of it waiting. On the CPU: where NCCL is the default group's only
    backend, through a gloo group of every rank, made at the first call
    (a collective, as every call is: building a LateMax is not, so a
    Checkpointer built on one rank only, to read, waits for no other);
    only a torch without gloo agrees at once on the GPU (``late`` False:
    :func:`max_int` of this call). ``where``: a :func:`route` to take
    instead of the one the default group gives."""

    def __init__(self, where: str | None = None) -> None:
        dist = _dist()
        self.route = None if dist is None else where or route(str(dist.get_backend()),
                                                               dist.is_gloo_available())
        self.late = self.route in (DEFAULT, GLOO_GROUP)
        self._group: Any = None  # None: the default group (GLOO_GROUP: made at the first call)
        self._work: Any = None  # the all_reduce in flight, of self._tensors[self._calls % 2]
        self._tensors: list[Any] = []  # two, used in turn (a new one a call: ~40 us)
        self._calls = 0
        if self.late:
            import torch

            self._tensors = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]

    def _gloo_group(self, dist: Any) -> Any:
        """A gloo group of every rank (a collective: every rank makes it at
        its first call); where gloo cannot connect the ranks (an interface
        NCCL reaches and gloo does not), the agreement stays on the GPU,
        said once, on every rank alike (they agree on that through NCCL)."""
        try:
            group, failed = dist.new_group(backend="gloo"), ""
        except RuntimeError as exc:
            group, failed = None, str(exc)
        if max_int(1 if failed else 0) == 0:
            return group
        logger.warning("should_save agrees on preemption on the GPU, at once, at every step: "
                       "a gloo group of the ranks could not be made (%s); set "
                       "GLOO_SOCKET_IFNAME to the interface the ranks reach each other on to "
                       "agree on the CPU, one step late", failed or "on another rank")
        self.route, self.late = DEVICE, False
        return None

    def _first_call(self) -> None:
        if self.route == GLOO_GROUP and self._group is None:  # a failure changes the route
            self._group = self._gloo_group(_dist())

    def exchange(self, value: int) -> int:
        self._first_call()
        if not self.late:
            return max_int(value)
        dist = _dist()
        agreed = 0
        if self._work is not None:
            self._work.wait()
            agreed = int(self._tensors[self._calls % 2].item())
        self._calls += 1
        tensor = self._tensors[self._calls % 2]
        tensor.fill_(value)
        self._work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group,
                                     async_op=True)
        return agreed

    def now(self, value: int) -> int:
        """The largest of every rank's ``value`` at this call (synchronous),
        by the same route; the exchange in flight is not disturbed (it has
        a tensor of its own, and collectives on one group run in order)."""
        self._first_call()
        return max_int(value, self._group)


def barrier() -> None:
    dist = _dist()
    if dist is not None:
        dist.barrier()


class KeyValue:
    """torch.distributed's own store (the process group's TCPStore), as the
    ranks' asynchronous checkpoints agree through it: a connection of its
    own (a clone), so a background thread uses it beside the training
    thread, under ``prefix``. Values are text."""

    def __init__(self, prefix: str) -> None:
        import torch
        from torch.distributed import PrefixStore, distributed_c10d

        # torch has no public getter for the default group's store (torch 2.x)
        getter = getattr(distributed_c10d, "_get_default_store", None)
        if getter is None:
            raise ConfigError(
                f"asynchronous checkpoints across ranks: torch {torch.__version__} has no "
                "torch.distributed.distributed_c10d._get_default_store, which dvc-dali uses to "
                "reach the process group's store. Checkpoint synchronously "
                "(Checkpointer(asynchronous=False), or DVC_DALI_ASYNC=0), or use a torch "
                "dvc-dali supports (2.x).")
        base = getter()
        try:
            base = base.clone()  # a connection of its own for the background thread
        except (AttributeError, RuntimeError):
            pass
        self._base = base
        self._store = PrefixStore(prefix, base)

    def sibling(self, prefix: str) -> KeyValue:
        """The same store under another ``prefix``, over this connection."""
        from torch.distributed import PrefixStore

        other = object.__new__(KeyValue)
        other._base = self._base
        other._store = PrefixStore(prefix, self._base)
        return other

    def set(self, key: str, value: str) -> None:
        with _store_gone(key):
            self._store.set(key, value)

    def get(self, key: str) -> str:
        """The value, waiting until the key is set (for at most the process
        group's timeout, as a collective would)."""
        with _store_gone(key):
            return self._store.get(key).decode()

    def get_now(self, key: str) -> str | None:
        """The value, or None when the key is not set yet (never blocks)."""
        with _store_gone(key):
            if not self._store.check([key]):
                return None
            return self._store.get(key).decode()

    def get_all(self, keys: list[str], missing: Callable[[list[str]], str]) -> list[str]:
        """Every key's value, once all are set: the store's own wait (an
        event, not a poll), for at most the process group's timeout; keys
        still not set then: RankMismatchError(``missing(those keys)``). For
        the ranks' agreement on a restore (rank_restore)."""
        try:
            self._store.wait(keys)
        except RuntimeError as exc:  # DistStoreError: timed out; or the store is gone
            with _store_gone(keys[0], _RESTORE):
                absent = [k for k in keys if not self._store.check([k])]
            if absent:
                raise RankMismatchError(missing(absent)) from exc
        with _store_gone(keys[0], _RESTORE):
            return [self._store.get(k).decode() for k in keys]

    def wait(self, key: str, seconds: float) -> bool:
        """Until ``key`` is set (True) or about ``seconds`` passed (False).
        Asked every 1 to 50 ms (a TCP round trip each), as signal_file waits
        for its file: the store's own blocking wait logs a C++ warning each
        time it times out."""
        deadline = time.monotonic() + seconds
        delay = 0.001
        with _store_gone(key):
            while not self._store.check([key]):
                if time.monotonic() > deadline:
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        return True


_CHECKPOINT = ("a checkpoint", "The checkpoint in flight is not recorded; LATEST still names "
               "the last one every rank wrote. Run again to resume from the last recorded row.")
_RESTORE = ("the restore", "No rank trained and nothing was recorded. Run again.")


@contextlib.contextmanager
def _store_gone(key: str, during: tuple[str, str] = _CHECKPOINT) -> Iterator[None]:
    """A store call that failed (torch's DistNetworkError, DistStoreError:
    RuntimeErrors) as one line: the launcher that holds the store (torchrun
    under --standalone) ended, or its host went away, while the ranks agreed
    on a checkpoint (found by a sweep: a traceback through dvc-dali's
    internals and dozens of C++ frames, naming nothing to do)."""
    try:
        yield
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointWriteError(
            f"the ranks' store (torch.distributed's, held by the launcher: torchrun) cannot "
            f"be reached while they agreed on {during[0]} ({key!r}: {first}): the launcher "
            f"ended or its host went away. {during[1]}") from exc
