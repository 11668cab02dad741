"""A Checkpointer built in a rank before torch.distributed is initialized
(torchrun's RANK and WORLD_SIZE set, init_process_group not called yet) is
refused by name in every rank: it would checkpoint as a single process, all
ranks into one directory (distributed.checked_world)."""

from __future__ import annotations

import sys

import pytest

from dvc_dali.training import distributed

from tests.helpers.ranks import run_ranks

EARLY = """
import sys
import dvc_dali
ck = dvc_dali.Checkpointer(sys.argv[1])  # before init_process_group: refused
import torch.distributed as dist
dist.init_process_group("gloo")
print("built", flush=True)
"""


@pytest.mark.parametrize("environ, initialized, found", [
    ({"RANK": "1", "WORLD_SIZE": "2"}, False, (1, 2)),
    ({"RANK": "0", "WORLD_SIZE": "8"}, False, (0, 8)),
    ({"RANK": "1", "WORLD_SIZE": "2"}, True, None),  # initialized: its own world
    ({"RANK": "0", "WORLD_SIZE": "1"}, False, None),  # one process
    ({}, False, None),  # not started by a launcher
    ({"WORLD_SIZE": "two"}, False, None),  # not torchrun's
])
def test_which_processes_are_ranks_not_initialized(environ, initialized, found):
    assert distributed.launched_rank(environ, initialized) == found


def test_a_checkpointer_built_before_init_process_group_is_refused_in_every_rank(tmp_path):
    """Each rank started as torchrun starts it (its environment), but with no
    launcher to stop one rank when the other fails: every rank must say it."""
    pytest.importorskip("torch")
    script = tmp_path / "early.py"
    script.write_text(EARLY)
    ranks = run_ranks([sys.executable, str(script), str(tmp_path / "ck")], tmp_path)
    for rank, proc in enumerate(ranks):
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "built" not in proc.stdout, said[-3000:]
        assert (f"dvc-dali: ConfigError: Checkpointer built in rank {rank} of 2 (torchrun's "
                "RANK and WORLD_SIZE) before torch.distributed.init_process_group()") in said
        assert "Call init_process_group() first, then build the Checkpointer" in said
        assert "/dvc_dali/" not in said, said[-3000:]  # one line, no traceback of ours
    assert not (tmp_path / "ck" / "LATEST").exists()
