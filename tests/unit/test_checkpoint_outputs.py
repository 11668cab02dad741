"""Which outputs are checkpoints (dvc_dali/core/checkpoint_outputs.py) as a table:
a stage's dvc.yaml entry in, its `checkpoint: true` outputs out. The one rule
`dvc-dali migrate` and the recorder (dvc_door.declared_checkpoint_outs) share."""

from __future__ import annotations

import pytest

from dvc_dali.core.checkpoint_outputs import checkpoint_outputs

CK = {"checkpoint": True}

# id, the stage's dvc.yaml entry, (list name, index, path) of each checkpoint output
CASES = [
    ("none", {"cmd": "python train.py"}, []),
    ("outs", {"outs": [{"ckpt": CK}]}, [("outs", 0, "ckpt")]),
    ("metrics", {"metrics": [{"m.json": {"checkpoint": True, "cache": False}}]},
     [("metrics", 0, "m.json")]),
    ("plots", {"plots": [{"p.csv": CK}]}, [("plots", 0, "p.csv")]),
    ("all three, in order outs metrics plots",
     {"plots": [{"p": CK}], "metrics": [{"m": CK}], "outs": ["a", {"o": CK}]},
     [("outs", 1, "o"), ("metrics", 0, "m"), ("plots", 0, "p")]),
    ("plain path entries", {"outs": ["ckpt", "model.pt"]}, []),
    ("checkpoint false", {"outs": [{"ckpt": {"checkpoint": False}}]}, []),
    ("checkpoint not the boolean true", {"outs": [{"a": {"checkpoint": "true"}},
                                                  {"b": {"checkpoint": 1}}]}, []),
    ("persist only", {"outs": [{"ckpt": {"persist": True}}]}, []),
    ("no options", {"outs": [{"ckpt": None}]}, []),
    ("two keys in one entry", {"outs": [{"a": CK, "b": CK}]}, []),
    ("list not a list", {"outs": {"ckpt": CK}}, []),
    ("entry not a mapping", "python train.py", []),
    ("empty entry", None, []),
    ("non-string key", {"outs": [{7: CK}]}, [("outs", 0, "7")]),
]


@pytest.mark.parametrize("stage,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_checkpoint_outputs(stage, expected):
    assert [(o.list_name, o.index, o.path) for o in checkpoint_outputs(stage)] == expected


def test_options_and_key_come_from_the_entry():
    opts = {"checkpoint": True, "persist": False}
    (found,) = checkpoint_outputs({"outs": [{7: opts}]})
    assert found.options is opts and found.key == 7
