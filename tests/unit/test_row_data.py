"""What `dvc-dali doctor` reads and says of rows whose checkpoint data the
local DVC cache lacks (cli/row_data.py): pure parts, as tables."""

from __future__ import annotations

import pytest

from dvc_dali.cli import row_data

LOCK = b"""schema: '2.0'
stages:
  train:
    outs:
    - path: checkpoint
      hash: md5
      md5: 1f9fe8432473914fd5de1be7f57fb6ad.dir
    - path: model
      md5: ab0851b381e37235b08b037349fcd0a4.dir
"""


@pytest.mark.parametrize("text, stage, out, md5", [
    (LOCK, "train", "checkpoint", "1f9fe8432473914fd5de1be7f57fb6ad.dir"),
    (LOCK, "train", "model", "ab0851b381e37235b08b037349fcd0a4.dir"),
    (LOCK, "train", "other", None),
    (LOCK, "evaluate", "checkpoint", None),
    (None, "train", "checkpoint", None),  # the row's commit has no dvc.lock there
    (b"stages: [1, 2]", "train", "checkpoint", None),
    (b"stages:\n  train: {outs: [{path: checkpoint, md5: 5}]}", "train", "checkpoint", None),
    (b":\n - [unparsable", "train", "checkpoint", None),
    (b"\xff\xfe", "train", "checkpoint", None),
])
def test_the_md5_a_rows_dvc_lock_gives_its_output(text, stage, out, md5):
    assert row_data.lock_out_md5(text, stage, out) == md5


@pytest.mark.parametrize("lacking, total, ok, said", [
    ([], 3, True, "holds the checkpoint data of all 3"),
    (["a-step2"], 3, False, "lacks the checkpoint data of 1 of 3 (a-step2)"),
    ([f"a-step{i}" for i in range(7)], 9, False,
     "7 of 9 (a-step0, a-step1, a-step2, a-step3, a-step4 and 2 more)"),
])
def test_the_line_names_the_rows(lacking, total, ok, said):
    good, text = row_data.line(lacking, total)
    assert good is ok and said in text and "\n" not in text
