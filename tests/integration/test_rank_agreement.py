"""distributed.max_int, what Checkpointer.should_save asks at every step
under torch.distributed: every rank gets the largest value any rank gave,
with two real gloo ranks (torch.distributed.run), and the value itself
outside torch.distributed."""

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
dist.destroy_process_group()
"""


def test_outside_torch_distributed_it_is_the_value():
    assert distributed.max_int(15) == 15 and distributed.max_int(0) == 0


def test_two_gloo_ranks_agree_on_the_largest(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", str(script)], capture_output=True,
                          text=True, env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(re.findall(r"rank \d: \[[^\]]*\]", proc.stdout))  # lines may interleave
    assert lines == ["rank 0: [15, 7, 0]", "rank 1: [15, 7, 0]"], proc.stdout
