"""distributed.max_int and distributed.LateMax, how Checkpointer.should_save
agrees on preemption at every step under torch.distributed: every rank gets
the largest value any rank gave (LateMax: at the next call, the same call
on every rank), with two real gloo ranks (torch.distributed.run), and the
value itself outside torch.distributed."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys

import pytest

from dvc_dali.training import distributed

from tests.helpers import child_env

RANK = """
import os
import torch.distributed as dist
from dvc_dali.training import distributed
dist.init_process_group("gloo")
rank = dist.get_rank()
got = [distributed.max_int(v) for v in ((0, 15)[rank], (7, 0)[rank], 0)]
print(f"rank {rank}: {got}", flush=True)
late = distributed.LateMax()
given = ((0, 15, 0, 0, 3), (7, 0, 0, 0, 0))[rank]
print(f"late rank {rank}: {late.late} {[late.exchange(v) for v in given]}", flush=True)
# the route an NCCL-only default group takes: a gloo group of its own, which
# the exchange in flight and a synchronous agreement share
side = distributed.LateMax(distributed.GLOO_GROUP)
assert side._group is None  # made at the first call, a collective (building one is not)
got = [side.exchange(v) for v in given[:2]] + [side.now((4, 9)[rank])]
assert side._group is not None
got += [side.exchange(v) for v in given[2:]]
print(f"side rank {rank}: {side.late} {got}", flush=True)
# a gloo group that cannot be made (an interface gloo does not find): every
# rank stays on the default group's route, at once, said
os.environ["GLOO_SOCKET_IFNAME"] = "nosuchif0"
stay = distributed.LateMax(distributed.GLOO_GROUP)
got = [stay.exchange(v) for v in given[:2]]
print(f"stay rank {rank}: {stay.route} {got}", flush=True)
dist.destroy_process_group()
"""


def test_outside_torch_distributed_it_is_the_value():
    assert distributed.max_int(15) == 15 and distributed.max_int(0) == 0
    late = distributed.LateMax()
    assert not late.late and late.exchange(15) == 15 and late.exchange(0) == 0


def test_two_gloo_ranks_agree_on_the_largest(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", str(script)], capture_output=True,
                          text=True, env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(re.findall(r"(?<!late )rank \d: \[[^\]]*\]", proc.stdout))  # may interleave
    assert lines == ["rank 0: [15, 7, 0]", "rank 1: [15, 7, 0]"], proc.stdout
    # one call late: the first call gets 0, each later one the previous call's largest
    late = sorted(re.findall(r"late rank \d: \w+ \[[^\]]*\]", proc.stdout))
    assert late == ["late rank 0: True [0, 7, 15, 0, 0]",
                    "late rank 1: True [0, 7, 15, 0, 0]"], proc.stdout
    # through a gloo group of its own: the same answers, and a synchronous
    # agreement between two exchanges gets this call's largest (9)
    side = sorted(re.findall(r"side rank \d: \w+ \[[^\]]*\]", proc.stdout))
    assert side == ["side rank 0: True [0, 7, 9, 15, 0, 0]",
                    "side rank 1: True [0, 7, 9, 15, 0, 0]"], proc.stdout
    stay = sorted(re.findall(r"stay rank \d: \w+ \[[^\]]*\]", proc.stdout))
    assert stay == ["stay rank 0: device [7, 15]", "stay rank 1: device [7, 15]"], proc.stdout
    assert proc.stderr.count("a gloo group of the ranks could not be made") == 2, proc.stderr


@pytest.mark.parametrize("backend, gloo, where", [
    ("gloo", True, distributed.DEFAULT),
    ("gloo", False, distributed.DEFAULT),
    ("nccl", True, distributed.GLOO_GROUP),  # never a device read a step
    ("nccl", False, distributed.DEVICE),  # a torch without gloo: at once, on the GPU
    ("cpu:gloo,cuda:nccl", True, distributed.DEFAULT),  # the default group takes CPU tensors
    ("cuda:nccl", True, distributed.GLOO_GROUP),
    ("mpi", True, distributed.DEFAULT),
])
def test_where_the_ranks_agree(backend, gloo, where):
    assert distributed.route(backend, gloo) == where


def test_a_torch_without_the_default_store_getter_is_refused_by_name(monkeypatch):
    """Asynchronous checkpoints across ranks reach the process group's store
    through torch's private getter: a torch without it is refused with a
    message naming it and what to do, before any rank waits on a store."""
    pytest.importorskip("torch")
    from torch.distributed import distributed_c10d

    from dvc_dali.core.errors import ConfigError

    monkeypatch.delattr(distributed_c10d, "_get_default_store")
    with pytest.raises(ConfigError, match=r"_get_default_store.*DVC_DALI_ASYNC=0"):
        distributed.KeyValue("dvc_dali/x/")


def test_a_store_that_went_away_ends_in_one_line_naming_the_launcher(tmp_path):
    """The launcher (torchrun under --standalone) holds the ranks' store; a
    killed launcher made each rank's background checkpoint fail with
    torch's DistNetworkError, a traceback through dvc-dali and dozens of
    C++ frames (found by a sweep). Now a CheckpointWriteError in one line."""
    pytest.importorskip("torch")
    from torch.distributed import PrefixStore, TCPStore

    from dvc_dali.core.errors import CheckpointWriteError

    server = subprocess.Popen(
        [sys.executable, "-c", "import sys, torch.distributed as d\n"
         "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
         "print(s.port, flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        port = int(server.stdout.readline())
        kv = object.__new__(distributed.KeyValue)
        kv._base = TCPStore("127.0.0.1", port, is_master=False,
                            timeout=datetime.timedelta(seconds=5))
        kv._store = PrefixStore("dvc_dali/x/", kv._base)
        kv.set("1.1/durable/0", "a")
        assert kv.get_now("1.1/durable/0") == "a"
    finally:
        server.kill()
        server.wait()
    # (a set is sent without an answer: the first after the kill may not fail)
    for call in (lambda: kv.get_now("1.1/durable/0"), lambda: kv.wait("1.2/done", 1.0),
                 lambda: kv.set("1.2/durable/0", "b")):
        with pytest.raises(CheckpointWriteError, match=r"the ranks' store .* cannot be reached "
                           r"while they agreed on a checkpoint .*LATEST still names"):
            call()
