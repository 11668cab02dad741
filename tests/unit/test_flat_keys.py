"""Nested mappings as joined keys (dvc_dali/core/flat_keys.py), as a table: the
one helper for params (run_start, row_queries) and pipeline descriptions
(dali_state.differences)."""

from __future__ import annotations

import pytest

from dvc_dali.core.flat_keys import flat_keys

# id, node, keyword arguments, flat
CASES = [
    ("flat already", {"lr": 0.1, "steps": 10}, {}, {"lr": 0.1, "steps": 10}),
    ("nested", {"train": {"lr": 0.1, "opt": {"name": "sgd"}}, "seed": 1}, {},
     {"train.lr": 0.1, "train.opt.name": "sgd", "seed": 1}),
    ("prefix", {"a": {"b": 1}}, {"prefix": "other.yaml:"}, {"other.yaml:a.b": 1}),
    ("separator", {"train": {"acc": 0.9}}, {"sep": "/"}, {"train/acc": 0.9}),
    ("lists are leaves", {"a": [1, {"b": 2}]}, {}, {"a": [1, {"b": 2}]}),
    ("None is a leaf", {"a": None}, {}, {"a": None}),
    ("empty mapping is a leaf", {"a": {}, "b": 1}, {}, {"a": {}, "b": 1}),
    ("empty mapping is nothing", {"a": {}, "b": {"c": {}}, "d": 1},
     {"empty_as_leaf": False}, {"d": 1}),
    ("keys as text", {1: {2: "x"}}, {}, {"1.2": "x"}),
    ("not a mapping", [1, 2], {}, {}),
    ("a scalar", "text", {}, {}),
    ("None", None, {}, {}),
    ("empty", {}, {}, {}),
]


@pytest.mark.parametrize("node,kwargs,flat", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_flat_keys(node, kwargs, flat):
    assert flat_keys(node, **kwargs) == flat


@pytest.mark.parametrize("blob, metrics, why", [
    (None, {}, ""),  # no file in the row: nothing to say
    (b'{"train": {"acc": 0.5}, "step": 3}', {"train/acc": 0.5}, ""),
    (b"{}", {}, ""),
    (b"[0.5]", {}, "is JSON, but a list"),
    (b"0.5", {}, "is JSON, but a number"),
    (b'"acc"', {}, "is JSON, but a string"),
    (b"null", {}, "is JSON, but null"),
    (b"true", {}, "is JSON, but true"),
    (b'{"acc": 0.', {}, "is not JSON"),
    (b"\xff\xfe", {}, "is not JSON"),
])
def test_a_rows_metrics_and_why_its_file_holds_none(blob, metrics, why):
    from dvc_dali.reading.row_queries import _metrics

    assert _metrics(blob) == (metrics, why)
