"""Bad arguments to the Python API, refused in one line naming the argument
(and the array or name): an ArgumentError (a ConfigError and a ValueError)
or an ArgumentTypeError (a ConfigError and a TypeError), so code that caught
the ValueError or TypeError these were before still does. The checks made
before any file, repository or pipeline is touched."""

from __future__ import annotations

import inspect
from collections import namedtuple

import pytest
from nvidia.dali import fn, pipeline_def

import dvc_dali
from dvc_dali import ArgumentError, ArgumentTypeError
from dvc_dali.core.checked_calls import checked_call
from dvc_dali.dali import dali_state
from dvc_dali.format import arrays
from dvc_dali.training import rng_state


@pipeline_def
def uniform(low=0.0):
    return fn.random.uniform(range=(low, 1.0), name="u")


# id -> (the call, the class it raises, the start of its message)
CASES = {
    # were TypeError / ValueError, a traceback through the save
    "array object": (lambda: arrays.check("w", object()), ArgumentTypeError,
                     "array 'w': an object cannot be saved without pickle; save arrays"),
    "array nested object": (lambda: arrays.check("w", {"a": [1, object()]}), ArgumentTypeError,
                            "array 'w/a/1': an object cannot be saved"),
    "array namedtuple": (lambda: arrays.check("w", namedtuple("T", "a")(1)), ArgumentTypeError,
                         "array 'w': a T (a tuple subclass) would come back as a plain tuple"),
    "array float key": (lambda: arrays.check("w", {1.5: 1}), ArgumentTypeError,
                        "array 'w': key 1.5 is a float; only str and int keys"),
    "array reserved name": (lambda: rng_state.check_names({"~dvc_dali.rng": 1}), ArgumentError,
                            "arrays: names starting with '~dvc_dali' are dvc-dali's own"),
    "pipeline source int": (lambda: dali_state.prepare(5, {}, "t"), ArgumentTypeError,
                            "pipeline 't': source=5 is an int; pass a @pipeline_def function"),
    "pipeline returns int": (lambda: dali_state.prepare(lambda **k: 5, {}, "t"),
                             ArgumentTypeError, "pipeline 't': '<lambda>' returned an int, "
                             "not a Pipeline: decorate it with @pipeline_def"),
    # DALI's own check was an assert ("This shouldn't happen"), gone under python -O
    "pipeline keyword typo": (lambda: dali_state.prepare(uniform, {"batchsize": 2, "lo": 1},
                                                         "t"), ArgumentTypeError,
                              "pipeline 't': batchsize, lo: neither uniform() nor DALI's "
                              "Pipeline takes these arguments; check the spelling"),
    # were ConfigErrors printed with a traceback (no hook outside a Checkpointer)
    "best_row spec": (lambda: dvc_dali.best_row([], "acc:maxx"), ArgumentError,
                      "best_row(spec='acc:maxx'): must be '<metric>:max' or '<metric>:min'"),
    "best_row spec int": (lambda: dvc_dali.best_row([], 5), ArgumentTypeError,
                          "best_row(spec=5): must be '<metric>:max'"),
    # were AttributeError / TypeError from inside
    "best_row swapped": (lambda: dvc_dali.best_row("acc:max", []), ArgumentTypeError,
                         "best_row(found='acc:max'): must be a list of rows (from "
                         "dvc_dali.rows()), not a str: best_row(dvc_dali.rows(), 'acc:max')"),
    "best_row none": (lambda: dvc_dali.best_row(None, "acc:max"), ArgumentTypeError,
                      "best_row(found=None): must be a list of rows"),
    "best_row one row": (lambda: dvc_dali.best_row({"step": 1}, "acc:max"), ArgumentTypeError,
                         "best_row(found={'step': 1}): must be a list of rows"),
    "best_row not rows": (lambda: dvc_dali.best_row([1], "acc:max"), ArgumentTypeError,
                          "best_row(found): item 0 is an int, not a row"),
    # exp=5 found no row without a word; the others were tracebacks
    "rows exp": (lambda: dvc_dali.rows(exp=5), ArgumentTypeError,
                 "rows(exp=5): must be a str such as 'a' (an experiment name), or None"),
    "rows repo": (lambda: dvc_dali.rows(repo=5), ArgumentTypeError,
                  "rows(repo=5): must be a path (a str or pathlib.Path)"),
    "rows metrics_file": (lambda: dvc_dali.rows(metrics_file=5), ArgumentTypeError,
                          "rows(metrics_file=5): must be a path"),
    "rows params": (lambda: dvc_dali.rows(params="no"), ArgumentTypeError,
                    "rows(params='no'): must be True or False"),
    "rows run": (lambda: dvc_dali.rows(run=5), ArgumentTypeError,
                 "rows(run=5): must be a row (a dict from dvc_dali.rows() or current_row())"),
    "current_row path": (lambda: dvc_dali.current_row(5), ArgumentTypeError,
                         "current_row(path=5): must be a path"),
    "current_row repo": (lambda: dvc_dali.current_row(repo=5), ArgumentTypeError,
                         "current_row(repo=5): must be a path"),
    "load path": (lambda: dvc_dali.load(5), ArgumentTypeError, "load(path=5): must be a path"),
    "load path empty": (lambda: dvc_dali.load(""), ArgumentError,
                        "load(path=''): an empty path names nothing"),
    # was read as 'no DVC project here', or passed to git
    "load rev": (lambda: dvc_dali.load(rev=5), ArgumentTypeError,
                 "load(rev=5): must be a row (a dict from dvc_dali.rows()), its ref"),
    "load repo": (lambda: dvc_dali.load(rev="HEAD", repo=5), ArgumentTypeError,
                  "load(repo=5): must be a path"),
    "load names": (lambda: dvc_dali.load(names="w"), ArgumentTypeError,
                   "load(names='w'): names is a list of array names"),
    # were Python's own TypeError, a traceback (checked_call)
    "Checkpointer keyword typo": (lambda: dvc_dali.Checkpointer(reume=False), ArgumentTypeError,
                                  "Checkpointer(): got an unexpected keyword argument 'reume' "
                                  "(did you mean 'resume'?); it takes Checkpointer(path="
                                  "'checkpoint', *, resume=True, params=None"),
    "Checkpointer unknown keyword": (lambda: dvc_dali.Checkpointer(foo=1), ArgumentTypeError,
                                     "Checkpointer(): got an unexpected keyword argument "
                                     "'foo'; it takes"),
    "make_checkpoint positional": (lambda: dvc_dali.make_checkpoint(1, 2, 3), ArgumentTypeError,
                                   "make_checkpoint(): too many positional arguments; it takes "
                                   "make_checkpoint(step=None, *, out=None, keep_last=None, "
                                   "keep_best=None)"),
    "load positional": (lambda: dvc_dali.load("ck", "HEAD"), ArgumentTypeError,
                        "load(): too many positional arguments; it takes load(path="),
    "rows unknown keyword": (lambda: dvc_dali.rows(foo=1), ArgumentTypeError,
                             "rows(): got an unexpected keyword argument 'foo'; it takes rows("
                             "exp=None, repo=None, metrics_file=None, params=True, *, run=None)"),
    "best_row missing": (lambda: dvc_dali.best_row(), ArgumentTypeError,
                         "best_row(): missing a required argument: 'found'; it takes "
                         "best_row(found, spec)"),
    "current_row typo": (lambda: dvc_dali.current_row(pth="ck"), ArgumentTypeError,
                         "current_row(): got an unexpected keyword argument 'pth' (did you mean "
                         "'path'?)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_argument_is_refused_in_one_line_naming_it(case):
    call, kind, says = CASES[case]
    with pytest.raises(kind) as err:
        call()
    message = str(err.value)
    assert message.startswith(says) and "\n" not in message, message
    # the excepthook prints a DvcDaliError as one line; the old except clauses still catch it
    assert isinstance(err.value, dvc_dali.ConfigError)
    assert isinstance(err.value, ValueError if kind is ArgumentError else TypeError)


def test_the_classes_are_public_and_both_kinds():
    assert {"ArgumentError", "ArgumentTypeError"} <= set(dvc_dali.__all__)
    assert issubclass(ArgumentError, (dvc_dali.ConfigError, ValueError))
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentTypeError, TypeError)
    assert issubclass(ArgumentTypeError, dvc_dali.ConfigError)


def test_good_values_are_still_taken():
    arrays.check("w", {"a": [1, 2.5, "s", None], 3: (1,)})
    rng_state.check_names({"w": 1})
    assert dvc_dali.best_row(iter([{"step": 1, "metrics": {"acc": 0.5}}]), "acc:max")["step"] == 1
    assert dvc_dali.best_row([], "acc:min") is None
    assert dali_state.prepare(uniform, {"low": 0.5, "batch_size": 1, "num_threads": 1,
                                        "device_id": None}, "t") is not None


def test_a_method_called_with_arguments_it_does_not_take_is_refused_naming_it(tmp_path):
    ck = dvc_dali.Checkpointer(tmp_path / "ck", rng=False)
    try:
        calls = {"Checkpointer.save(): missing a required argument: 'step'; it takes "
                 "Checkpointer.save(step, arrays=None, metadata=None)": lambda: ck.save(),
                 "Checkpointer.tf_dataset(): missing a required argument: 'source'":
                     lambda: ck.tf_dataset("t"),
                 "Checkpointer.keras_callback(): got an unexpected keyword argument 'x'":
                     lambda: ck.keras_callback(10, x=1),
                 "Checkpointer.should_save(): got an unexpected keyword argument 'evry' "
                 "(did you mean 'every'?)": lambda: ck.should_save(1, evry=2)}
        for says, call in calls.items():
            with pytest.raises(ArgumentTypeError) as err:
                call()
            assert str(err.value).startswith(says), str(err.value)
        assert not (tmp_path / "ck" / "LATEST").exists()
    finally:
        ck.close()


def test_a_type_error_from_inside_the_call_is_not_taken_for_a_bad_argument():
    @checked_call
    def inner(step):
        return step + "x"  # Python's TypeError from inside: the arguments bound

    with pytest.raises(TypeError) as err:
        inner(1)
    assert not isinstance(err.value, ArgumentTypeError)
    with pytest.raises(dvc_dali.ConfigError) as err:  # a bad value: its own refusal
        dvc_dali.make_checkpoint("1")
    assert "step='1'" in str(err.value)


def test_the_checked_entry_points_keep_their_signatures_and_docstrings():
    for func in (dvc_dali.Checkpointer.__init__, dvc_dali.Checkpointer.save,
                 dvc_dali.make_checkpoint, dvc_dali.load, dvc_dali.rows, dvc_dali.best_row,
                 dvc_dali.current_row):
        assert hasattr(func, "__wrapped__") and func.__doc__ == func.__wrapped__.__doc__
    assert list(inspect.signature(dvc_dali.Checkpointer).parameters)[:2] == ["path", "resume"]
    assert list(inspect.signature(dvc_dali.make_checkpoint).parameters) == [
        "step", "out", "keep_last", "keep_best"]
    assert not hasattr(dvc_dali.Checkpointer.step.fget, "__wrapped__")  # read each step
