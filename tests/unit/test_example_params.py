"""The examples' params.yaml `train` values: each bad one ends the trainer
in one line naming the file and the key (a value that was not a number
ended in a traceback, 1.5 steps was taken as 1, a bad lr or seed got to
NumPy or DALI)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _read_params():
    spec = importlib.util.spec_from_file_location("examples_common", EXAMPLES / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_params


@pytest.mark.parametrize("line, said", [
    ("steps: abc", "train.steps is 'abc'; it must be a positive integer"),
    ("steps: 1.5", "train.steps is 1.5; it must be a positive integer"),
    ("steps: true", "train.steps is True; it must be a positive integer"),
    ("checkpoint_every: 0", "train.checkpoint_every is 0; it must be a positive integer"),
    ("batch_size: -4", "train.batch_size is -4; it must be a positive integer"),
    ("hidden: null", "train.hidden is None; it must be a positive integer"),
    ("seed: -1", "train.seed is -1; it must be an integer, 0 or more"),
    ("seed: '7'", "train.seed is '7'; it must be an integer, 0 or more"),
    ("lr: fast", "train.lr is 'fast'; it must be a number, 0 or more"),
    ("lr: -0.1", "train.lr is -0.1; it must be a number, 0 or more"),
    ("adam_lr: .nan", "train.adam_lr is nan; it must be a number, 0 or more"),
    ("adam_lr: .inf", "train.adam_lr is inf; it must be a number, 0 or more"),
])
def test_a_bad_train_value_is_said_in_one_line(tmp_path, line, said):
    params = tmp_path / "params.yaml"
    params.write_text(f"train:\n  {line}\n")
    with pytest.raises(SystemExit) as raised:
        _read_params()(params)
    assert str(raised.value) == f"{params}: {said}"


def test_good_values_are_read(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  steps: 20\n  seed: 0\n  lr: 0\n  adam_lr: 0.001\n")
    got = _read_params()(params)
    assert (got["steps"], got["seed"], got["lr"], got["adam_lr"]) == (20, 0, 0, 0.001)
