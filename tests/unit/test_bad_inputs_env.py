"""Bad environment values: refused at the start in one line (ConfigError
naming the variable), by one rule for all: surrounding whitespace stripped,
only whitespace refused, digits 0-9 only, seconds at most ten years."""

from __future__ import annotations

import os
import threading

import pytest

from dvc_dali.core import context
from dvc_dali.core.context import RunContext
from dvc_dali.core.errors import ConfigError

SECONDS = ("DVC_DALI_LOCK_TIMEOUT", "DVC_DALI_SIGNAL_TIMEOUT", "DVC_DALI_PUSH_GRACE")
INTEGERS = ("DVC_DALI_KEEP_LAST", "DVC_DALI_CONTENT_DIGEST_MAX", "DVC_DALI_VERIFY_BATCHES")
SWITCHES = ("DVC_DALI_DEBUG", "DVC_DALI_RETRAIN", "DVC_DALI_RNG", "DVC_DALI_INEXACT",
            "DVC_DALI_ASYNC")

# every DVC_DALI_* value a user sets: a good value, and the field it sets
GOOD = {
    "DVC_DALI_KEEP_LAST": ("3", "keep_last", 3),
    "DVC_DALI_KEEP_BEST": ("loss:min", "keep_best", "loss:min"),
    "DVC_DALI_LOCK_TIMEOUT": ("600", "lock_timeout", 600.0),
    "DVC_DALI_SIGNAL_TIMEOUT": ("1.5", "signal_timeout", 1.5),
    "DVC_DALI_PUSH_GRACE": ("30", "push_grace", 30.0),
    "DVC_DALI_SIGNAL_FILE": ("/r/.dvc/tmp/sig", "signal_file", "/r/.dvc/tmp/sig"),
    "DVC_DALI_DEBUG": ("1", "debug", True),
    "DVC_DALI_RETRAIN": ("1", "retrain", True),
    "DVC_DALI_RNG": ("0", "rng", False),
    "DVC_DALI_INEXACT": ("1", "inexact", True),
    "DVC_DALI_ASYNC": ("1", "asynchronous", True),
    "DVC_DALI_CONTENT_DIGEST_MAX": ("500", "content_digest_max", 500),
    "DVC_DALI_VERIFY_BATCHES": ("2", "verify_batches", 2),
}


def refused(name: str, value: str) -> str:
    with pytest.raises(ConfigError) as err:
        RunContext.from_environ({name: value})
    message = str(err.value)
    quoted = repr(value) if len(repr(value)) <= 62 else repr(value)[:60] + "...'"
    assert message.startswith(f"{name}={quoted}") and "\n" not in message, message
    return message


@pytest.mark.parametrize("name", SECONDS)
@pytest.mark.parametrize("value", ["1e20", "1e10", "315360001", "9223372037"])
def test_seconds_too_long_to_wait_on_are_refused_at_the_start(name, value):
    """1e20 passed the check, then a preempted run's wait raised OverflowError
    (threading's timeout, time_t) and pushed nothing."""
    assert "315360000 (ten years)" in refused(name, value)


@pytest.mark.parametrize("name", SECONDS)
def test_ten_years_is_accepted_and_can_be_waited_on(name):
    ctx = RunContext.from_environ({name: "315360000"})
    seconds = getattr(ctx, GOOD[name][1])
    assert seconds == context.MAX_WAIT_S <= threading.TIMEOUT_MAX
    cond = threading.Condition()

    def wake() -> None:
        with cond:
            cond.notify_all()

    with cond:  # the wait auto_push.Pusher.wait makes: woken, no OverflowError
        threading.Timer(0.05, wake).start()
        assert cond.wait(seconds)


@pytest.mark.parametrize("name", [*SECONDS, *INTEGERS])
@pytest.mark.parametrize("value", ["²", "٣", "1²", "1_0", "0x10",
                                   pytest.param("9" * 5000, id="5000-digits")])
def test_numbers_are_digits_0_to_9_only(name, value):
    """'²'.isdigit() is True and int('²') fails (a traceback); int('٣') is 3."""
    refused(name, value)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_surrounding_whitespace_is_stripped_for_every_variable(name):
    value, field, expect = GOOD[name]
    for padded in (f" {value} ", f"\t{value}\n", f"{value} "):
        assert getattr(RunContext.from_environ({name: padded}), field) == expect, padded


@pytest.mark.parametrize("name", sorted(GOOD))
@pytest.mark.parametrize("value", [" ", "\t", " \n "])
def test_only_whitespace_is_refused_for_every_variable(name, value):
    """DVC_DALI_VERIFY_BATCHES=' ' was taken as 'all' while the others refused it."""
    refused(name, value)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_empty_is_unset_for_every_variable(name):
    field = GOOD[name][1]
    assert getattr(RunContext.from_environ({name: ""}), field) == \
        getattr(RunContext.from_environ({}), field)


def test_debug_requested_follows_the_same_rule():
    assert context.debug_requested({"DVC_DALI_DEBUG": " 1 "})
    assert not context.debug_requested({"DVC_DALI_DEBUG": " 0 "})
    assert not context.debug_requested({})


@pytest.mark.parametrize("value, level", [(" 0 ", 20), ("0", 20), ("", 20), (" 1 ", 10),
                                          ("1", 10)])
def test_the_loggers_debug_switch_follows_the_same_rule(value, level):
    """The logger reads DVC_DALI_DEBUG at import: ' 0 ' turned debug lines on."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import dvc_dali.core.log as m; "
                          "print(m.logger.level)"], capture_output=True, text=True,
                         env={**os.environ, "DVC_DALI_DEBUG": value}, check=True)
    assert int(out.stdout) == level


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_huge_value_is_quoted_short(name):
    """A 5,000-character value was repeated whole in the one-line message."""
    with pytest.raises(ConfigError) as err:
        RunContext.from_environ({name: "9" * 4999 + "x"})
    message = str(err.value)
    assert message.startswith(f"{name}='999") and "(5000 characters)" in message, message
    assert len(message) < 600 and "\n" not in message, message


@pytest.mark.parametrize("name", SECONDS)
@pytest.mark.parametrize("value", ["+1", "-0", "-0.0", "+1e3"])
def test_seconds_with_a_sign_are_refused_as_other_numbers_are(name, value):
    """float() took '+1' and '-0' (found by a sweep): digits 0-9, a fraction
    and an exponent only, as the docs say; '1e-3' keeps its exponent's sign."""
    refused(name, value)
    assert getattr(RunContext.from_environ({name: "1e-3"}), GOOD[name][1]) == 0.001


@pytest.mark.parametrize("name", INTEGERS)
def test_a_huge_count_is_taken_as_documented(name):
    """A count or number of bytes beyond any run's is all of it (the docs say so)."""
    huge = "9" * 40
    assert getattr(RunContext.from_environ({name: huge}), GOOD[name][1]) == int(huge)
