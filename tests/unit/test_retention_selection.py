"""Which rows retention keeps: a pure choice, tested as a table."""

from __future__ import annotations

import pytest

from dvc_dali.recording.retention import best_of, select_pruned


def rows(*steps: int, times=None) -> list[dict]:
    times = times or list(range(len(steps)))
    return [{"ref": f"r{s}", "step": s, "time": t, "name": f"x-step{s}"}
            for s, t in zip(steps, times)]


TABLE = [
    # (rows, keep_last, always kept, refs deleted)
    (rows(1, 2, 3), None, set(), []),  # unset: keep every row
    (rows(1, 2, 3), 5, set(), []),
    (rows(1, 2, 3), 3, set(), []),
    (rows(1, 2, 3), 2, set(), ["r1"]),
    (rows(1, 2, 3), 1, set(), ["r1", "r2"]),
    (rows(3, 1, 2), 1, set(), ["r1", "r2"]),  # by step, not listing order
    (rows(1, 2, 3, times=[5, 5, 5]), 1, set(), ["r1", "r2"]),  # same second
    (rows(1, 2, 3), 1, {"r1"}, ["r2"]),  # the best is kept beside the last
    (rows(1, 2, 3), 1, {"r3"}, ["r1", "r2"]),  # best == last: still one
    (rows(1, 2, 3), 1, {"r2"}, ["r1"]),  # the row just recorded, say
    (rows(), 2, set(), []),
    (rows(10, 20, 30, 40), 2, {"r10"}, ["r20"]),
]


@pytest.mark.parametrize("listed,keep_last,keep,deleted", TABLE)
def test_select_pruned(listed, keep_last, keep, deleted):
    assert [r["ref"] for r in select_pruned(listed, keep_last, keep=keep)] == deleted


@pytest.mark.parametrize("bad", [0, -1])
def test_select_pruned_refuses_a_count_below_one(bad):
    """-1 once deleted every row; the environment refuses it earlier too."""
    with pytest.raises(ValueError):
        select_pruned(rows(1, 2), bad)


BEST = [
    ([], "max", None),
    ([(0.5, "a"), (0.9, "b"), (0.7, "c")], "max", "b"),
    ([(0.5, "a"), (0.9, "b"), (0.7, "c")], "min", "a"),
    ([(0.9, "a"), (0.9, "b")], "max", "b"),
]


@pytest.mark.parametrize("scored,mode,best", BEST)
def test_best_of(scored, mode, best):
    assert best_of(scored, mode) == best
