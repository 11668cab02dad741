"""What every rank does with a restore across ranks (rank_restore.decide):
all restored -> train; any refused -> every rank refuses, naming each
refusing rank, its step, snapshot and reason (found by a sweep: the rank
that restored trained on into a collective that failed)."""

from __future__ import annotations

import pytest

from dvc_dali.core.errors import CheckpointCorruptError, RankMismatchError
from dvc_dali.training.rank_restore import (Refusal, decide, error_class, format_post,
                                            parse_post, snapshot_step)

CORRUPT = Refusal("CheckpointCorruptError", 6, "checkpoint/rank-00001/step-000000006-1a2b3c4d",
                  "checkpoint/rank-00001/step-000000006-1a2b3c4d/pipelines/00000.dali: contents "
                  "do not match the crc32 in ... (corrupted or edited).")
MISMATCH = Refusal("PipelineMismatchError", 6, "checkpoint/rank-00002/step-000000006-5e6f7a8b",
                   "pipeline 'train': batch_size 2 -> 4")
WORLD = Refusal("RankMismatchError", None, "",
                "checkpoint/LATEST: saved by 2 process(es), this run has 4. Resume with 2")

# (world size, {rank: refusal or None}) -> (refused, kind, what the line holds, in order)
TABLE = [
    (2, {0: None, 1: None}, False, "", []),
    (2, {0: None, 1: CORRUPT}, True, "CheckpointCorruptError", [
        "rank 1 of 2 could not restore step 6 from checkpoint/rank-00001/step-000000006-"
        "1a2b3c4d: checkpoint/rank-00001/step-000000006-1a2b3c4d/pipelines/00000.dali: ",
        "(corrupted or edited). No rank trains and nothing is recorded (rank 0 restored its "
        "own, but the ranks resume one checkpoint together)"]),
    # two refusals: both named, in rank order; the lowest rank's error is raised
    (4, {0: None, 1: CORRUPT, 2: MISMATCH, 3: None}, True, "CheckpointCorruptError", [
        "rank 1 of 4 could not restore step 6", "; rank 2 of 4 could not restore step 6 from "
        "checkpoint/rank-00002/step-000000006-5e6f7a8b: pipeline 'train': batch_size 2 -> 4",
        "(ranks 0, 3 restored theirs, but"]),
    (2, {0: MISMATCH, 1: CORRUPT}, True, "PipelineMismatchError", [
        "rank 0 of 2 could not restore", "rank 1 of 2 could not restore",
        "nothing is recorded (the ranks resume"]),
    # every rank alike (another world size): their own line, unchanged
    (4, {r: WORLD for r in range(4)}, True, "RankMismatchError", [WORLD.reason]),
    # LATEST names no snapshot of the rank: the checkpoint, not a step
    (2, {0: None, 1: Refusal("CheckpointCorruptError", None, "", "checkpoint/LATEST: bad")},
     True, "CheckpointCorruptError", ["rank 1 of 2 could not restore the checkpoint: "
                                      "checkpoint/LATEST: bad. No rank trains"]),
]


@pytest.mark.parametrize("world, posts, refused, kind, said", TABLE)
def test_every_rank_refuses_when_one_did(world, posts, refused, kind, said):
    outcome = decide(world, posts)
    assert (outcome.refused, outcome.kind) == (refused, kind)
    at = 0
    for part in said:  # each part, in order
        at = outcome.message.index(part, at) + len(part)
    if refused and len(said) > 1:
        assert outcome.message == decide(world, dict(reversed(posts.items()))).message
        assert "\n" not in outcome.message


@pytest.mark.parametrize("refusal", [None, CORRUPT, WORLD])
def test_a_ranks_word_comes_back_from_the_store_as_it_went(refusal):
    assert parse_post(format_post(refusal)) == refusal


def test_names_and_classes():
    assert snapshot_step("rank-00001/step-000000006-1a2b3c4d") == 6
    assert snapshot_step("rank-00001/garbage") is None
    assert error_class("CheckpointCorruptError") is CheckpointCorruptError
    assert error_class("ValueError") is RankMismatchError  # never a non-dvc-dali class
    assert error_class("NoSuchError") is RankMismatchError
