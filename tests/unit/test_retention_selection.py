"""Which rows retention keeps: a pure choice, tested as a table."""

from __future__ import annotations

import pytest

from dvc_dali.reading.best import best_row
from dvc_dali.core.errors import ConfigError
from dvc_dali.reading.row_queries import best_row as history_best_row
from dvc_dali.recording.retention import select_pruned


def rows(*steps: int, times=None) -> list[dict]:
    times = times or list(range(len(steps)))
    return [{"ref": f"r{s}", "step": s, "time": t, "name": f"x-step{s}", "exp": "x",
             "sha": f"{s:07d}" + "f" * 33}
            for s, t in zip(steps, times)]


def renamed(listed: list[dict], step: int, name: str) -> list[dict]:
    """``listed`` with the row of ``step`` renamed, as `dvc exp rename` does."""
    return [{**r, "name": name} if r["step"] == step else r for r in listed]


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
    # a row `dvc exp rename` named is the user's: neither counted nor deleted
    (renamed(rows(1, 2, 3, 4), 2, "best"), 1, set(), ["r1", "r3"]),
    (renamed(rows(1, 2, 3), 3, "x-step30"), 1, set(), ["r1"]),
    (renamed(rows(1, 2, 3), 1, "y-step1"), 2, set(), []),
    # the recorder's own name where <run>-step<N> was taken: its sha's 7 digits
    (renamed(rows(1, 2, 3), 1, "x-step1-0000001"), 1, set(), ["r1", "r2"]),
    (renamed(rows(1, 2, 3), 1, "x-step1-0000002"), 1, set(), ["r2"]),
]


@pytest.mark.parametrize("listed,keep_last,keep,deleted", TABLE)
def test_select_pruned(listed, keep_last, keep, deleted):
    assert [r["ref"] for r in select_pruned(listed, keep_last, keep=keep)] == deleted


@pytest.mark.parametrize("bad", [0, -1])
def test_select_pruned_refuses_a_count_below_one(bad):
    """-1 once deleted every row; the environment refuses it earlier too."""
    with pytest.raises(ValueError):
        select_pruned(rows(1, 2), bad)


def scored(*rows: tuple) -> list[dict]:
    """Rows as dvc_dali.rows() gives them: (step, metrics[, time])."""
    return [{"ref": f"r{r[0]}", "name": f"x-step{r[0]}", "step": r[0],
             "time": r[2] if len(r) > 2 else 0, "metrics": r[1]} for r in rows]


NAN = float("nan")
BEST = [
    # (rows, spec, the step of the best row or None)
    (scored(), "loss:min", None),
    (scored((1, {"loss": 0.5}), (2, {"loss": 0.9}), (3, {"loss": 0.7})), "loss:max", 2),
    (scored((1, {"loss": 0.5}), (2, {"loss": 0.9}), (3, {"loss": 0.7})), "loss:min", 1),
    # ties: the later step, whatever the listing order or the ref's spelling
    (scored((90, {"acc": 0.9}), (100, {"acc": 0.9})), "acc:max", 100),
    (scored((100, {"acc": 0.9}), (90, {"acc": 0.9})), "acc:max", 100),
    (scored((5, {"loss": 0.1}), (10, {"loss": 0.1}), (7, {"loss": 0.2})), "loss:min", 10),
    (scored((5, {"a": 1}), (5, {"a": 1}, 9), (5, {"a": 1}, 3)), "a:max", 5),
    # a row without the metric, or with a non-number, is no candidate
    (scored((1, {"loss": 0.5}), (2, {}), (3, {"acc": 0.1})), "loss:min", 1),
    (scored((1, {}), (2, {"acc": 0.1})), "loss:min", None),
    (scored((1, {"loss": NAN}), (2, {"loss": 3.0})), "loss:min", 2),
    (scored((1, {"loss": True}), (2, {"loss": "0.1"}), (3, {"loss": 5})), "loss:min", 3),
    (scored((1, None), (2, {"loss": 1})), "loss:max", 2),
    # nested paths: '/' between levels, in the file's tree or flattened
    (scored((1, {"train": {"acc": 0.8}}), (2, {"train": {"acc": 0.6}})), "train/acc:max", 1),
    (scored((1, {"train/acc": 0.8}), (2, {"train/acc": 0.9})), "train/acc:max", 2),
    (scored((1, {"train": {"acc": {"top1": 0.3}}}), (2, {"train": {"acc": {"top1": 0.2}}})),
     "train/acc/top1:min", 2),
    (scored((1, {"train": {"acc": 0.8}}), (2, {"train": 0.9})), "train/acc:max", 1),
    (scored((1, {"train": {"acc": {"x": 1}}}),), "train/acc:max", None),  # not a number
    # the last ':' splits, so a metric name may hold one
    (scored((1, {"a:b": 2}), (2, {"a:b": 1})), "a:b:min", 2),
]


@pytest.mark.parametrize("listed,spec,step", BEST)
def test_best_row(listed, spec, step):
    best = best_row(listed, spec)
    assert (best["step"] if best else None) == step
    assert history_best_row(listed, spec) is best  # dvc_dali.best_row: the same rule


def test_best_row_reads_the_metrics_where_it_is_told():
    """Retention reads each row's metrics file: the same rule over it."""
    files = {"r1": {"loss": 0.2}, "r2": {"loss": 0.2}}
    listed = [{"ref": r, "step": s, "time": 0} for r, s in (("r2", 20), ("r1", 10))]
    assert best_row(listed, "loss:min", lambda r: files[r["ref"]])["ref"] == "r2"


@pytest.mark.parametrize("spec", ["loss", "loss:best", ":max", " :min", "", None, 3])
def test_a_bad_spec_is_refused(spec):
    with pytest.raises(ConfigError, match="must be '<metric>:max' or '<metric>:min'"):
        best_row(scored((1, {"loss": 1})), spec)
