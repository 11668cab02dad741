"""Which of dvc-dali's lines carry "[rank N] " (core/log.rank_prefix):
torchrun mixes every rank's output in one stream."""

from __future__ import annotations

import pytest

from dvc_dali.core.log import rank_prefix


@pytest.mark.parametrize("initialized, environ, want", [
    ((1, 2), {}, "[rank 1] "),
    ((0, 2), {"RANK": "1", "WORLD_SIZE": "2"}, ""),  # initialized: its own rank wins
    ((3, 4), {}, "[rank 3] "),
    ((0, 1), {}, ""),
    # after destroy_process_group() (lines said at exit): the launcher's variables
    (None, {"RANK": "1", "WORLD_SIZE": "2"}, "[rank 1] "),
    (None, {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, "[rank 1] "),  # Lightning's launcher
    (None, {"RANK": "0", "WORLD_SIZE": "2"}, ""),
    (None, {}, ""),  # one process
    (None, {"RANK": "one", "WORLD_SIZE": "2"}, ""),
])
def test_lines_of_ranks_other_than_0_name_their_rank(initialized, environ, want):
    assert rank_prefix(initialized, environ) == want
