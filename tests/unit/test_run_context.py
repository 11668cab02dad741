"""Every environment variable is read and checked in one place, before training."""

from __future__ import annotations

import numpy as np
import pytest

from dvc_dali.core.context import VARIABLES, RunContext
from dvc_dali.core.errors import ArgumentError, ArgumentTypeError, ConfigError

RUN = {"DVC_ROOT": "/r", "DVC_EXP_BASELINE_REV": "a" * 40}

BAD = [
    ("DVC_DALI_KEEP_LAST", "-1", "positive integer"),
    ("DVC_DALI_KEEP_LAST", "0", "positive integer"),
    ("DVC_DALI_KEEP_LAST", "abc", "positive integer"),
    ("DVC_DALI_KEEP_LAST", "2.5", "positive integer"),
    ("DVC_DALI_KEEP_LAST", " ", "positive integer"),
    ("DVC_DALI_KEEP_BEST", "nonsense", "'<metric>:max'"),
    ("DVC_DALI_KEEP_BEST", "acc:best", "'<metric>:max'"),
    ("DVC_DALI_KEEP_BEST", ":max", "'<metric>:max'"),
    ("DVC_DALI_LOCK_TIMEOUT", "soon", "seconds"),
    ("DVC_DALI_LOCK_TIMEOUT", "-3", "seconds"),
    ("DVC_DALI_LOCK_TIMEOUT", "nan", "seconds"),
    ("DVC_DALI_LOCK_TIMEOUT", "inf", "seconds"),
    ("DVC_DALI_SIGNAL_TIMEOUT", "1h", "seconds"),
    ("DVC_DALI_PUSH_GRACE", "1m", "seconds"),
    ("DVC_DALI_SIGNAL_FILE", "tmp/DVC_CHECKPOINT", "absolute path"),
    ("DVC_DALI_SIGNAL_FILE", "/", "absolute path"),  # a directory
    # a switch is 1 or 0: "true", "yes" or "off" are refused, not read as on
    ("DVC_DALI_DEBUG", "yes", "1 (on) or 0 (off)"),
    ("DVC_DALI_RETRAIN", "true", "1 (on) or 0 (off)"),
    ("DVC_DALI_RETRAIN", "false", "1 (on) or 0 (off)"),
]


@pytest.mark.parametrize("name,value,says", BAD)
def test_bad_values_are_refused_naming_the_variable(name, value, says):
    with pytest.raises(ConfigError) as err:
        RunContext.from_environ({**RUN, name: value})
    assert str(err.value).startswith(f"{name}={value!r}: ")
    assert says in str(err.value)


GOOD = [
    ({}, dict(keep_last=None, keep_best=None, lock_timeout=3600.0, mode="off")),
    ({"DVC_DALI_KEEP_LAST": "3"}, dict(keep_last=3)),
    ({"DVC_DALI_KEEP_LAST": ""}, dict(keep_last=None)),
    ({"DVC_DALI_KEEP_BEST": "train/acc:max"}, dict(keep_best="train/acc:max")),
    ({"DVC_DALI_KEEP_BEST": "a:b:min"}, dict(keep_best="a:b:min")),
    ({"DVC_DALI_LOCK_TIMEOUT": "0.5"}, dict(lock_timeout=0.5)),
    ({"DVC_DALI_SIGNAL_TIMEOUT": "0"}, dict(signal_timeout=0.0)),
    ({**RUN, "DVC_STAGE": "train"}, dict(mode="record", under_exp_run=True)),
    (RUN, dict(mode="off", under_exp_run=True)),  # DVC 2 without a checkpoint output
    ({**RUN, "DVC_CHECKPOINT": "1"}, dict(mode="watched")),
    ({"DVC_CHECKPOINT": "1"}, dict(mode="watched", under_exp_run=False)),
    ({"DVC_DALI_DEBUG": "1"}, dict(debug=True)),
    ({"DVC_DALI_DEBUG": "0"}, dict(debug=False)),
    ({"DVC_DALI_RETRAIN": "1"}, dict(retrain=True)),
    ({"DVC_DALI_RETRAIN": "0"}, dict(retrain=False)),
    ({"DVC_DALI_SIGNAL_FILE": "/r/.dvc/tmp/DVC_CHECKPOINT"},
     dict(signal_file="/r/.dvc/tmp/DVC_CHECKPOINT")),
]


@pytest.mark.parametrize("environ,expect", GOOD)
def test_good_values(environ, expect):
    ctx = RunContext.from_environ(environ)
    for attr, value in expect.items():
        assert getattr(ctx, attr) == value, attr


ARGS = [
    # (env keep_last, env keep_best, argument keep_last, argument keep_best, result or error)
    (None, None, None, None, (None, None)),
    ("5", None, None, None, (5, None)),
    ("5", None, 2, None, (2, None)),
    (None, "loss:min", 1, None, (1, "loss:min")),
    (None, None, 0, None, "keep_last=0"),
    (None, None, -1, None, "keep_last=-1"),
    (None, None, True, None, "keep_last=True"),
    (None, None, "x", None, "keep_last='x'"),
    (None, None, 2, "acc", "keep_best='acc'"),
    (None, None, 2, 7, "keep_best=7"),
]


@pytest.mark.parametrize("env_last,env_best,last,best,result", ARGS)
def test_retention_arguments_win_and_are_checked(env_last, env_best, last, best, result):
    environ = {k: v for k, v in (("DVC_DALI_KEEP_LAST", env_last),
                                 ("DVC_DALI_KEEP_BEST", env_best)) if v is not None}
    ctx = RunContext.from_environ(environ)
    if isinstance(result, str):
        with pytest.raises(ConfigError, match=result.replace("(", r"\(")):
            ctx.retention(last, best)
    else:
        assert ctx.retention(last, best) == result


@pytest.mark.parametrize("last,best,error,said", [
    ("3", None, ArgumentTypeError, "keep_last='3': must be a positive int, the number of a "
     "run's latest checkpoint rows to keep, not a str"),
    ("", None, ArgumentTypeError, "keep_last='': must be a positive int"),
    (True, None, ArgumentTypeError, "keep_last=True: must be a positive int"),
    (3.0, None, ArgumentTypeError, "keep_last=3.0: must be a positive int"),
    (-1, None, ArgumentError, "keep_last=-1: must be a positive int"),
    (2, "", ArgumentError, "keep_best='': must be '<metric>:max' or '<metric>:min'"),
    (2, "acc:maxx", ArgumentError, "keep_best='acc:maxx': must be '<metric>:max'"),
    (2, ["acc:max"], ArgumentTypeError, "keep_best=['acc:max']: must be a str such as "
     "'train/acc:max', or None, not a list"),
])
def test_retention_arguments_of_another_type_are_refused(last, best, error, said):
    """keep_last='3' (or True, or '') was taken as a count (or as unset), and
    keep_best='' as no metric: a typo trained a run that pruned, or kept,
    other rows than asked (found by a sweep). The environment's strings stay
    strings (DVC_DALI_KEEP_LAST='3')."""
    ctx = RunContext.from_environ({"DVC_DALI_KEEP_LAST": "3", "DVC_DALI_KEEP_BEST": "a:max"})
    with pytest.raises(error) as caught:
        ctx.retention(last, best)
    assert str(caught.value).startswith(said), caught.value


def test_retention_takes_a_numpy_count():
    assert RunContext.from_environ({}).retention(np.int64(3), None) == (3, None)


def test_every_variable_read_is_documented():
    """The environment variables page's table (docs/reference/environment.md)
    lists every variable the package reads."""
    import pathlib
    import re

    pkg = pathlib.Path(__file__).resolve().parents[2] / "dvc_dali"
    readme = (pkg.parent / "docs" / "reference" / "environment.md").read_text()
    read = set()
    for path in pkg.rglob("*.py"):
        read |= set(re.findall(r"\"((?:DVC|DVCLIVE)_[A-Z_]+)\"", path.read_text()))
    read -= {"DVC_DALI_CHECKPOINT"}  # not an environment variable: none such
    assert read <= set(VARIABLES) | {"DVC_NO_ANALYTICS"}, read - set(VARIABLES)
    for name in VARIABLES:
        assert f"`{name}`" in readme, f"docs/reference/environment.md's table lacks {name}"


def test_every_variable_the_tests_and_benchmarks_read_is_documented():
    """The tests' and benchmarks' own variables (worker counts, the fuzz's
    seed...) were partly in README, partly nowhere (found by a sweep)."""
    import pathlib
    import re

    top = pathlib.Path(__file__).resolve().parents[2]
    page = (top / "docs" / "reference" / "environment.md").read_text()
    reads = re.compile(r"environ(?:\.get)?[(\[]\"(DVC_DALI_[A-Z0-9_]+)\"|"
                       r"\$\{(DVC_DALI_[A-Z0-9_]+)|location\([^)]*\"(DVC_DALI_[A-Z0-9_]+)\"")
    read = set()
    for path in [*top.glob("tests/**/*.py"), *top.glob("tests/*.sh"), *top.glob("bench/*.py")]:
        read |= {n for found in reads.findall(path.read_text()) for n in found if n}
    assert "DVC_DALI_FUZZ_SEED" in read and "DVC_DALI_TEST_WORKERS" in read, read
    missing = sorted(n for n in read - set(VARIABLES) if f"`{n}`" not in page)
    assert not missing, f"docs/reference/environment.md names none of {missing}"


def test_async_switch():
    """DVC_DALI_ASYNC: Checkpointer(asynchronous=)'s default, off unless 1."""
    assert RunContext.from_environ({}).asynchronous is False
    assert RunContext.from_environ({"DVC_DALI_ASYNC": "1"}).asynchronous is True
    with pytest.raises(ConfigError, match="DVC_DALI_ASYNC='yes': must be 1 .on. or 0"):
        RunContext.from_environ({"DVC_DALI_ASYNC": "yes"})


@pytest.mark.parametrize("env,refused", [
    ({"DVC_CHECKPOINT": "1", "DVC_STAGE": "train"}, True),  # DVC 3, left set by hand
    ({"DVC_CHECKPOINT": "1"}, False),  # DVC 2 sets no DVC_STAGE
    ({"DVC_CHECKPOINT": "1", "DVC_STAGE": "train", "DVC_DALI_SIGNAL_FILE": "/tmp/x/S"}, False),
    ({"DVC_CHECKPOINT": "1", "DVC_STAGE": "train", "DVC_DALI_RECORDS_ITSELF": "1"}, False),
    ({"DVC_STAGE": "train"}, False),
])
def test_a_checkpoint_signal_nobody_answers_is_refused(env, refused):
    ctx = RunContext.from_environ({"DVC_ROOT": "/r", "DVC_EXP_BASELINE_REV": "a" * 40, **env})
    if refused:
        with pytest.raises(ConfigError, match="DVC_CHECKPOINT=1 is set, but this is DVC 3's"):
            ctx.refuse_stray_signal()
    else:
        ctx.refuse_stray_signal()
