"""Which recorded row a run continues, among rows with the same outputs
(rows.pick_resumed): a table, as the guide "Resume semantics"
(docs/guides/resume.md) says under "Which row a run continues"."""

from __future__ import annotations

import pytest

from dvc_dali.recording.rows import pick_resumed

A5 = (100, "a5", 5, "a")   # (commit time, sha, step, run)
B5 = (200, "b5", 5, "b")   # the same outputs, recorded later by another run
A5_AGAIN = (300, "a5x", 5, "a")

ROWS = [
    ("none", [], None, None, None),
    ("one row", [A5], None, None, A5),
    ("identical runs, nothing applied: the newest", [A5, B5], None, None, B5),
    ("the applied row wins over a newer identical one", [A5, B5], "a5", 250.0, A5),
    ("the applied row, applied when it was the newest", [A5], "a5", 150.0, A5),
    ("a row recorded after the apply: that run went on", [A5, B5], "a5", 150.0, B5),
    ("apply time unknown (packed ref): only if newest", [A5, B5], "a5", None, B5),
    ("the applied sha is no candidate (other outputs)", [A5, B5], "zz", 250.0, B5),
    ("equal times: the later step, then the sha", [(100, "x", 4, "a"), (100, "y", 5, "b")],
     None, None, (100, "y", 5, "b")),
    ("three runs, the middle one applied", [A5, B5, A5_AGAIN], "b5", 350.0, B5),
]


@pytest.mark.parametrize("candidates,applied,applied_at,expected",
                         [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_pick_resumed(candidates, applied, applied_at, expected):
    assert pick_resumed(candidates, applied, applied_at) == expected
