"""Which file holds a row's metrics (dvc_dali/reading/metrics_source.py) as a
table: a row's stage and the dvc.yaml files of its commit in, the metrics
file `dvc-dali show` and `dvc_dali.rows` read out. They read only
`dvclive/metrics.json` at the root, so a stage with a `wdir`, in another
folder's dvc.yaml, or logging elsewhere listed rows without metrics."""

from __future__ import annotations

import pytest

from dvc_dali.reading.metrics_source import DEFAULT_METRICS, metrics_file, wdir_dvcyaml

LIVE = {"cache": False, "persist": True}


def stage(**entry):
    return {"stages": {"train": {"cmd": "python train.py", **entry}}}


# id, the row's stage field, {dvc.yaml path: parsed}, the metrics file
CASES = [
    ("no stage field", None, {}, DEFAULT_METRICS),
    ("stage field without a name", "dvc.yaml", {}, DEFAULT_METRICS),
    ("no dvc.yaml in the commit", "dvc.yaml:train", {"dvc.yaml": None}, DEFAULT_METRICS),
    ("dvc.yaml not read", "dvc.yaml:train", {}, DEFAULT_METRICS),
    ("nothing declared", "dvc.yaml:train", {"dvc.yaml": stage()}, DEFAULT_METRICS),
    ("the template", "dvc.yaml:train",
     {"dvc.yaml": stage(metrics=[{"dvclive/metrics.json": LIVE}])}, DEFAULT_METRICS),
    ("DVCLive in logs/", "dvc.yaml:train",
     {"dvc.yaml": stage(metrics=[{"logs/metrics.json": LIVE}])}, "logs/metrics.json"),
    ("a plain path entry", "dvc.yaml:train",
     {"dvc.yaml": stage(metrics=["eval/m.json"])}, "eval/m.json"),
    ("under the stage's wdir", "dvc.yaml:train",
     {"dvc.yaml": stage(wdir="work", metrics=[{"dvclive/metrics.json": LIVE}])},
     "work/dvclive/metrics.json"),
    ("wdir going up and back", "dvc.yaml:train",
     {"dvc.yaml": stage(wdir="a/../work/.", metrics=["m.json"])}, "work/m.json"),
    ("a stage in sub/dvc.yaml", "sub/dvc.yaml:train",
     {"sub/dvc.yaml": stage(metrics=["dvclive/metrics.json"])}, "sub/dvclive/metrics.json"),
    ("sub/dvc.yaml with wdir ..", "sub/dvc.yaml:train",
     {"sub/dvc.yaml": stage(wdir="..", metrics=["out/m.json"])}, "out/m.json"),
    ("the first JSON one", "dvc.yaml:train",
     {"dvc.yaml": stage(metrics=["m.yaml", "a.json", "b.json"])}, "a.json"),
    ("only YAML metrics", "dvc.yaml:train",
     {"dvc.yaml": stage(metrics=["m.yaml"])}, DEFAULT_METRICS),
    ("another stage's metrics are not this one's", "dvc.yaml:train",
     {"dvc.yaml": {"stages": {"train": {"cmd": "t"}, "eval": {"metrics": ["e.json"]}}}},
     DEFAULT_METRICS),
    ("the other stage of several", "dvc.yaml:eval",
     {"dvc.yaml": {"stages": {"train": {"metrics": ["t.json"]}, "eval": {"metrics": ["e.json"]}}}},
     "e.json"),
    ("DVCLive's top-level section", "dvc.yaml:train",
     {"dvc.yaml": {**stage(), "metrics": ["results/metrics.json"]}}, "results/metrics.json"),
    ("the stage's own before the top-level", "dvc.yaml:train",
     {"dvc.yaml": {**stage(metrics=["own.json"]), "metrics": ["top.json"]}}, "own.json"),
    ("top-level of sub/dvc.yaml, from its folder", "sub/dvc.yaml:train",
     {"sub/dvc.yaml": {**stage(), "metrics": ["dvclive/metrics.json"]}},
     "sub/dvclive/metrics.json"),
    ("top-level: the one under the stage's wdir first", "dvc.yaml:train",
     {"dvc.yaml": {**stage(wdir="w"), "metrics": ["x/metrics.json", "w/live/metrics.json"]}},
     "w/live/metrics.json"),
    ("the wdir's dvc.yaml (DVCLive run there)", "dvc.yaml:train",
     {"dvc.yaml": stage(wdir="w"), "w/dvc.yaml": {"metrics": ["dvclive/metrics.json"]}},
     "w/dvclive/metrics.json"),
    ("the wdir's dvc.yaml after the stage's own", "dvc.yaml:train",
     {"dvc.yaml": stage(wdir="w", metrics=["m.json"]),
      "w/dvc.yaml": {"metrics": ["dvclive/metrics.json"]}}, "w/m.json"),
    ("a foreach stage", "dvc.yaml:train@a",
     {"dvc.yaml": {"stages": {"train": {"foreach": ["a"], "do": {"metrics": ["m.json"]}}}}},
     "m.json"),
    ("a foreach item in the path", "dvc.yaml:train@a",
     {"dvc.yaml": {"stages": {"train": {"foreach": ["a", "b"],
                                        "do": {"metrics": ["m-${item}.json"]}}}}},
     "m-a.json"),
    ("a foreach item in the wdir and a DVCLive entry", "dvc.yaml:train@2",
     {"dvc.yaml": {"stages": {"train": {"foreach": [1, 2], "do": {
         "wdir": "run-${item}", "metrics": [{"dvclive/metrics.json": LIVE}]}}}}},
     "run-2/dvclive/metrics.json"),
    ("a foreach mapping: its key and plain item", "dvc.yaml:train@fast",
     {"dvc.yaml": {"stages": {"train": {"foreach": {"fast": 0.1, "slow": 0.01},
                                        "do": {"metrics": ["${key}/${item}.json"]}}}}},
     "fast/0.1.json"),
    ("a foreach boolean, as DVC writes it", "dvc.yaml:train@true",
     {"dvc.yaml": {"stages": {"train": {"foreach": [True],
                                        "do": {"metrics": ["m-${item}.json"]}}}}},
     "m-true.json"),
    ("a foreach of mappings: ${item} is no plain value", "dvc.yaml:train@0",
     {"dvc.yaml": {"stages": {"train": {"foreach": [{"x": 1}],
                                        "do": {"metrics": ["m-${item}.json"]}}}}},
     DEFAULT_METRICS),
    ("a foreach DVC interpolates: DVC's to say", "dvc.yaml:train@a",
     {"dvc.yaml": {"stages": {"train": {"foreach": "${runs}",
                                        "do": {"metrics": ["m-${item}.json"]}}}}},
     DEFAULT_METRICS),
    ("a foreach without that key", "dvc.yaml:train@c",
     {"dvc.yaml": {"stages": {"train": {"foreach": ["a"],
                                        "do": {"metrics": ["m-${item}.json"]}}}}},
     DEFAULT_METRICS),
    ("${key} of a foreach list: DVC sets none", "dvc.yaml:train@a",
     {"dvc.yaml": {"stages": {"train": {"foreach": ["a"], "do": {"metrics": ["${key}.json"]}}}}},
     DEFAULT_METRICS),
    ("a matrix stage", "dvc.yaml:train@a-1",
     {"dvc.yaml": {"stages": {"train": {"matrix": {"x": ["a"]}, "metrics": ["m.json"]}}}},
     "m.json"),
    ("an interpolated path: DVC's to say", "dvc.yaml:train",
     {"dvc.yaml": stage(metrics=["${out}/m.json"])}, DEFAULT_METRICS),
    ("an interpolated wdir", "dvc.yaml:train",
     {"dvc.yaml": stage(wdir="${w}", metrics=["m.json"])}, DEFAULT_METRICS),
    ("a path out of the project", "dvc.yaml:train",
     {"dvc.yaml": stage(metrics=["../m.json"])}, DEFAULT_METRICS),
    ("an absolute path", "dvc.yaml:train",
     {"dvc.yaml": stage(metrics=["/tmp/m.json"])}, DEFAULT_METRICS),
    ("malformed entries skipped", "dvc.yaml:train",
     {"dvc.yaml": stage(metrics=[7, {"a.json": {}, "b.json": {}}, None, {"c.json": None}])},
     "c.json"),
    ("metrics not a list", "dvc.yaml:train",
     {"dvc.yaml": stage(metrics={"m.json": LIVE})}, DEFAULT_METRICS),
    ("stages not a mapping", "dvc.yaml:train", {"dvc.yaml": {"stages": ["train"]}},
     DEFAULT_METRICS),
    ("dvc.yaml not a mapping", "dvc.yaml:train", {"dvc.yaml": "text"}, DEFAULT_METRICS),
]


@pytest.mark.parametrize("row_stage,yamls,expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_metrics_file(row_stage, yamls, expected):
    assert metrics_file(row_stage, yamls) == expected


# id, the row's stage field, the dvc.yaml files read so far, the wdir's dvc.yaml to read
WDIR_CASES = [
    ("no wdir", "dvc.yaml:train", {"dvc.yaml": stage()}, None),
    ("wdir .", "dvc.yaml:train", {"dvc.yaml": stage(wdir=".")}, None),
    ("wdir w", "dvc.yaml:train", {"dvc.yaml": stage(wdir="w")}, "w/dvc.yaml"),
    ("sub/dvc.yaml, wdir ..", "sub/dvc.yaml:train", {"sub/dvc.yaml": stage(wdir="..")},
     "dvc.yaml"),
    ("the stage's dvc.yaml not read yet", "dvc.yaml:train", {}, None),
    ("no stage", None, {}, None),
    ("an interpolated wdir", "dvc.yaml:train", {"dvc.yaml": stage(wdir="${w}")}, None),
]


@pytest.mark.parametrize("row_stage,yamls,expected", [c[1:] for c in WDIR_CASES],
                         ids=[c[0] for c in WDIR_CASES])
def test_wdir_dvcyaml(row_stage, yamls, expected):
    assert wdir_dvcyaml(row_stage, yamls) == expected
