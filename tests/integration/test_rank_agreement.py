"""distributed.max_int and distributed.LateMax, how Checkpointer.should_save
agrees on preemption at every step under torch.distributed: every rank gets
the largest value any rank gave (LateMax: at the next call, the same call
on every rank), with two real gloo ranks (torch.distributed.run), and the
value itself outside torch.distributed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dvc_dali.training import distributed

from tests.helpers import child_env

RANK = """
import torch.distributed as dist
from dvc_dali.training import distributed
dist.init_process_group("gloo")
rank = dist.get_rank()
got = [distributed.max_int(v) for v in ((0, 15)[rank], (7, 0)[rank], 0)]
print(f"rank {rank}: {got}", flush=True)
late = distributed.LateMax()
given = ((0, 15, 0, 0, 3), (7, 0, 0, 0, 0))[rank]
print(f"late rank {rank}: {late.late} {[late.exchange(v) for v in given]}", flush=True)
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
