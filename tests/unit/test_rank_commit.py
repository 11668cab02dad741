"""The commit decision of an asynchronous checkpoint across ranks
(rank_commit.decide): which ranks' files are durable at which step, which
ranks ended -> wait, record (LATEST's lines, in rank order) or fail."""

from __future__ import annotations

import pytest

from dvc_dali.training.rank_commit import (
    FAIL,
    RECORD,
    WAIT,
    Durable,
    Setup,
    decide,
    different_steps,
    format_durable,
    format_setup,
    meet,
    mismatch_message,
    parse_durable,
    parse_setup,
)


def mark(rank, step):
    return Durable(step, f"rank-{rank:05d}/step-{step:09d}-0000000{rank}", f"{rank:032x}")


# (world size, {rank: its durable step}, dead ranks) -> (action, waiting for / failed rank)
TABLE = [
    # nothing durable but rank 0's own: wait for the others
    (2, {0: 20}, set(), WAIT, (1,)),
    (4, {0: 20, 2: 20}, set(), WAIT, (1, 3)),
    # every rank durable at rank 0's step: record, whoever is still alive
    (2, {0: 20, 1: 20}, set(), RECORD, None),
    (2, {0: 20, 1: 20}, {1}, RECORD, None),  # rank 1 died after its files were durable
    (4, {0: 20, 1: 20, 2: 20, 3: 20}, {2, 3}, RECORD, None),
    (1, {0: 20}, set(), RECORD, None),
    # a rank ended before its files were durable: fail, never a partial row
    (2, {0: 20}, {1}, FAIL, "rank 1 of 2 ended before its files of step 20"),
    (4, {0: 20, 1: 20}, {3}, FAIL, "rank 3 of 4 ended before its files of step 20"),
    (4, {0: 20, 1: 20}, {2, 3}, FAIL, "rank 2, 3 of 4 ended before its files of step 20"),
    # a dead rank is not waited for, even while another live one still writes
    (4, {0: 20}, {2}, FAIL, "rank 2 of 4"),
    # a rank durable at another step: fail, naming both
    (2, {0: 20, 1: 30}, set(), FAIL, "rank 0 step 20, rank 1 step 30"),
    (3, {0: 20, 2: 10}, set(), FAIL, "rank 0 step 20, rank 2 step 10"),
]


@pytest.mark.parametrize("world,durable,dead,action,detail", TABLE)
def test_decision_table(world, durable, dead, action, detail):
    marks = {rank: mark(rank, step) for rank, step in durable.items()}
    decision = decide(20, world, marks, dead, "ckpt")
    assert decision.action == action, decision
    if action == WAIT:
        assert decision.waiting_for == detail
        assert decision.entries == () and decision.message == ""
    elif action == RECORD:  # LATEST names every rank's snapshot of this step, in rank order
        assert decision.entries == tuple((marks[r].entry, marks[r].sha) for r in range(world))
    else:
        assert detail in decision.message and decision.entries == ()
        assert decision.message.startswith("ckpt: ")
        assert "nothing was recorded" in decision.message or "not recorded" in decision.message


LEFT = "ended (its Checkpointer closed or its process exited) without calling make_checkpoint()"


# (world size, {rank: durable step}, dead ranks, ranks that left) -> what is said
@pytest.mark.parametrize("world,durable,dead,left,detail", [
    (2, {0: 20}, set(), {1}, f"rank 1 of 2 {LEFT} for step 20"),
    # it left: its lock is free too, yet it did not die mid-write
    (2, {0: 20}, {1}, {1}, f"rank 1 of 2 {LEFT} for step 20"),
    (4, {0: 20, 1: 20}, set(), {2, 3}, f"rank 2, 3 of 4 {LEFT}"),
    # one died before its files were durable: that is said first
    (4, {0: 20}, {1}, {2}, "rank 1 of 4 ended before its files of step 20"),
])
def test_a_rank_that_left_before_the_checkpoint_fails_it_by_name(world, durable, dead, left,
                                                                   detail):
    marks = {rank: mark(rank, step) for rank, step in durable.items()}
    decision = decide(20, world, marks, dead, "ckpt", None, left)
    assert decision.action == FAIL and detail in decision.message, decision
    assert "LATEST still names the last complete checkpoint" in decision.message


def test_a_rank_that_left_after_its_files_were_durable_is_recorded():
    marks = {0: mark(0, 20), 1: mark(1, 20)}
    assert decide(20, 2, marks, {1}, "ckpt", None, {1}).action == RECORD


def test_a_failure_says_what_to_do():
    message = decide(20, 2, {0: mark(0, 20)}, {1}).message
    assert "LATEST still names the last complete checkpoint" in message
    assert "run again to resume" in message
    other = decide(20, 2, {0: mark(0, 20), 1: mark(1, 30)}).message
    assert "same step on every rank" in other


def test_marks_round_trip_through_the_store_text():
    m = mark(1, 120)
    assert parse_durable(format_durable(m)) == m
    assert parse_durable(None) is None and parse_durable("") is None


@pytest.mark.parametrize("world,durable,elsewhere,want", [
    # a rank that checkpoints into another directory: its mark never comes here
    (2, {0: 20}, {1: "/b"}, "rank 0 into /a; rank 1 into /b"),
    (4, {0: 20, 1: 20}, {2: "/b", 3: "/b"}, "rank 0 into /a; ranks 2, 3 into /b"),
    (3, {0: 20}, {1: "/b", 2: "/c"}, "rank 0 into /a; rank 1 into /b; rank 2 into /c"),
    # even where every other mark has come (from ranks sharing rank 0's)
    (3, {0: 20, 1: 20}, {2: "/b"}, "rank 0 into /a; rank 2 into /b"),
])
def test_ranks_in_other_directories_fail_naming_each(world, durable, elsewhere, want):
    marks = {rank: mark(rank, step) for rank, step in durable.items()}
    unlike = {0: Setup("/a", True), **{r: Setup(d, True) for r, d in elsewhere.items()}}
    decision = decide(20, world, marks, set(), "/a", unlike)
    assert decision.action == FAIL and decision.entries == ()
    assert f"different directories ({want}); step 20 is not recorded" in decision.message
    assert "must pass the same checkpoint directory" in decision.message


# (by rank: directory, asynchronous) -> what they are refused for ("": nothing)
SETUPS = [
    ({0: ("/a", True), 1: ("/a", True)}, ""),
    ({0: ("/a", False), 1: ("/a", False), 2: ("/a", False)}, ""),
    ({0: ("/a", True), 1: ("/a", False)},
     "different modes (rank 0 asynchronously; rank 1 synchronously)"),
    ({0: ("/a", False), 1: ("/a", True), 2: ("/a", True)},
     "different modes (rank 0 synchronously; ranks 1, 2 asynchronously)"),
    ({0: ("/a", True), 1: ("/a", True), 2: ("/a", False), 3: ("/a", True)},
     "different modes (ranks 0, 1, 3 asynchronously; rank 2 synchronously)"),
    # another directory and another mode: the directory is said (the first to fix)
    ({0: ("/a", True), 1: ("/b", False)}, "different directories (rank 0 into /a; rank 1 into /b)"),
]


@pytest.mark.parametrize("setups, want", SETUPS)
def test_ranks_unlike_each_other_are_refused_naming_what_differs(setups, want):
    message = mismatch_message({r: Setup(d, a) for r, (d, a) in setups.items()}, 30)
    assert (want in message) and bool(want) == bool(message), message
    if "modes" in want:
        assert "step 30 is not recorded" in message and "the same asynchronous=" in message
    if want:  # rank 0 waiting for a rank that announced such a setup fails at once
        unlike = {r: Setup(d, a) for r, (d, a) in setups.items()}
        decision = decide(30, len(setups), {0: mark(0, 30)}, set(), "/a", unlike)
        assert decision.action == FAIL and decision.message == message


@pytest.mark.parametrize("setup", [Setup("/a/b", True), Setup("/with space/ck", False),
                                   Setup("/", True)])
def test_setups_round_trip_through_the_store_text(setup):
    assert parse_setup(format_setup(setup)) == setup
    assert parse_setup(None) is None and parse_setup("") is None


@pytest.mark.parametrize("steps,step,want", [
    ({0: 4, 1: 4}, 4, ""),
    ({0: 4}, 4, ""),
    ({0: 4, 1: 5}, 4, "(rank 0 step 4, rank 1 step 5); nothing was recorded for step 4"),
    ({0: 4, 1: 4, 2: 3, 3: 6}, 4, "(rank 0 step 4, rank 2 step 3, rank 3 step 6)"),
])
def test_ranks_at_different_steps_are_named(steps, step, want):
    """Both modes refuse a checkpoint whose ranks are at different steps
    (the synchronous one published it)."""
    message = different_steps("ck", steps, step)
    assert (want in message and message.startswith("ck: the ranks checkpointed different "
                                                  "steps")) if want else message == ""


# synchronous ranks before their files (meet): (world, {rank: step said}, dead, left,
# unlike) -> (action, waiting for / part of the message)
MEET = [
    (2, {0: 20}, set(), set(), {}, WAIT, (1,)),
    (2, {1: 20}, set(), set(), {}, WAIT, (0,)),  # rank 1 waits for rank 0 alike
    (2, {0: 20, 1: 20}, set(), set(), {}, RECORD, None),
    (2, {0: 20, 1: 20}, {1}, {1}, {}, RECORD, None),  # said it, then ended: it is there
    # rank 1's loop ended first (uneven data, a branch on rank 0): named, with the step
    (2, {0: 20}, {1}, {1}, {}, FAIL,
     "rank 1 of 2 ended (its Checkpointer closed or its process exited) without calling "
     "make_checkpoint() for step 20"),
    (2, {1: 30}, {0}, {0}, {}, FAIL, "rank 0 of 2 ended (its Checkpointer closed"),
    (2, {0: 20}, {1}, set(), {}, FAIL, "rank 1 of 2 ended before it checkpointed step 20"),
    (4, {0: 20, 2: 20}, {3}, set(), {}, FAIL, "rank 3 of 4 ended before it checkpointed"),
    (4, {0: 20, 2: 20}, set(), set(), {}, WAIT, (1, 3)),
    (2, {0: 20, 1: 30}, set(), set(), {}, FAIL,
     "the ranks checkpointed different steps (rank 0 step 20, rank 1 step 30)"),
    (2, {0: 20}, set(), set(), {0: Setup("/c", False), 1: Setup("/c", True)}, FAIL,
     "the ranks checkpoint in different modes"),
]


@pytest.mark.parametrize("world, steps, dead, left, unlike, action, detail", MEET)
def test_synchronous_ranks_meet_or_name_the_rank_that_never_comes(world, steps, dead, left,
                                                                  unlike, action, detail):
    decision = meet(world, steps, dead, left, "ck", unlike)
    assert decision.action == action
    if action == WAIT:
        assert decision.waiting_for == detail
    elif action == FAIL:
        assert detail in decision.message and decision.message.startswith(
            ("ck: ", "the ranks")), decision.message
