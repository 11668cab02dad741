"""Every environment variable dvc-dali reads, read and checked in one place.

`dvc exp run` tells the stage command where it runs (DVC_ROOT, DVC_STAGE,
DVC_EXP_NAME, DVC_EXP_BASELINE_REV; DVC 2 and `dvc-dali run` also set
DVC_CHECKPOINT). dvc-dali's own DVC_DALI_* variables tune it. A bad value is
refused when the context is read (at ``Checkpointer`` creation or the first
``make_checkpoint()``), before any training step and before any row is
touched, naming the variable and what it accepts.

Read elsewhere, before or outside a context: DVC_DALI_DEBUG by log.py (the
logger exists first), a quick look at DVC_CHECKPOINT, DVC_STAGE, DVC_ROOT
and DVC_EXP_BASELINE_REV by stage_start.py (is this a stage at all; it
imports nothing from here, to stay cheap), DVC_ROOT by
row_queries.py (where the rows are), and DVC's own DVC_EXP_AUTO_PUSH and
DVC_EXP_GIT_REMOTE by DVC's helpers (dvc_door.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .arguments import check_count, check_str
from .errors import ArgumentError, ConfigError
from .record_request import Retention

SIGNAL_NAME = "DVC_CHECKPOINT"
# Set with DVC_CHECKPOINT when dvc-dali set it (stage_start.py) for a DVC 2
# script: this process records its rows itself, nobody watches the signal.
RECORDS_ITSELF = "DVC_DALI_RECORDS_ITSELF"
DEFAULT_WAIT_S = 3600.0
# The longest wait a seconds variable may ask for: ten years. Far longer is no
# wait anyone means, and a threading wait refuses what it cannot hold
# (threading.TIMEOUT_MAX; 1e20 s overflows time_t), after the run began.
MAX_WAIT_S = 315_360_000
CONTENT_DIGEST_MAX = 1_000_000_000  # bytes of a reader's data digested by content

#: name -> what it means, for the table of docs/reference/environment.md and `dvc-dali doctor`.
VARIABLES = {
    "DVC_ROOT": "set by `dvc exp run`: the DVC repository the run belongs to",
    "DVC_STAGE": "set by `dvc exp run` (DVC >= 3.49): the stage being run",
    "DVC_EXP_NAME": "set by `dvc exp run`: the experiment's name",
    "DVC_EXP_BASELINE_REV": "set by `dvc exp run`: the commit the experiment is based on",
    SIGNAL_NAME: "set by DVC 2 and `dvc-dali run`: someone else answers make_checkpoint()",
    "DVC_DALI_KEEP_LAST": "keep only the last N rows of a run (a positive integer)",
    "DVC_DALI_KEEP_BEST": "with KEEP_LAST, also keep the best row by a metric, "
                          "e.g. train/acc:max or loss:min",
    "DVC_DALI_LOCK_TIMEOUT": "seconds to wait for DVC's repo lock before a recording fails "
                             "(default 3600)",
    "DVC_DALI_SIGNAL_TIMEOUT": "seconds make_checkpoint() waits for DVC 2 or `dvc-dali run` "
                               "to answer (default 3600)",
    "DVC_DALI_SIGNAL_FILE": "set by `dvc-dali run` for its child: where the signal file goes",
    RECORDS_ITSELF: "set by dvc-dali with DVC_CHECKPOINT=1 for a DVC 2 script under DVC 3: "
                    "the process records its rows itself",
    "DVC_DALI_PUSH_GRACE": "seconds a preempted run waits for its rows' push before it exits "
                           "(default 20; Kubernetes' default grace period is 30)",
    "DVC_EXP_AUTO_PUSH": "DVC's: true pushes each row as it is recorded (as "
                         "`dvc config exp.auto_push true`)",
    "DVC_EXP_GIT_REMOTE": "DVC's: the git remote rows are pushed to (as `exp.git_remote`; "
                          "default origin)",
    "DVC_DALI_DEBUG": "1: print tracebacks with errors (as DVC's -v)",
    "DVC_DALI_RETRAIN": "1: train again from an applied row whose run already went on",
    "DVC_DALI_RNG": "0: do not save and restore the global random generators (random, NumPy's, "
                    "torch's) with checkpoints (default 1; Checkpointer(rng=...) wins)",
    "DVC_DALI_CONTENT_DIGEST_MAX": "bytes of a reader's data (file_root, file_list) up to which "
                                   "its files' contents are digested and checked on resume "
                                   "(default 1000000000; 0: names and sizes only)",
    "DVC_DALI_VERIFY_BATCHES": "batches digested after each checkpoint and compared on resume "
                               "(a number; 0: off; default all)",
    "DVC_DALI_INEXACT": "1: resume on purpose although the data's contents or the batches "
                        "changed since the checkpoint (the run is no longer exact)",
    "DVC_DALI_ASYNC": "1: asynchronous checkpoints, written and recorded in the background "
                      "(default 0; Checkpointer(asynchronous=...) wins)",
}


def _given(value: str | None) -> str | None:
    """An environment value, surrounding whitespace stripped; None when unset
    or empty. A value of only whitespace gives "", which every parser
    refuses (the same rule for every variable, docs/reference/environment.md)."""
    return None if value is None or value == "" else value.strip()


def _shown(value: str | None) -> str:
    """A value as an error message quotes it: its first 60 characters."""
    text = repr(value)
    return text if len(text) <= 62 else f"{text[:60]}...' ({len(value or '')} characters)"


def _ascii_int(text: str) -> int | None:
    """The number ``text`` spells in digits 0-9 only, else None: str.isdigit()
    and int() also take '²' or '٣', and int() refuses 5,000 digits."""
    if not (text.isascii() and text.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:  # longer than sys.get_int_max_str_digits()
        return None


def parse_keep_last(value: object, source: str) -> int | None:
    """A positive row count, or None (keep every row). ``source`` names where
    the value came from, for the message."""
    if value is None or value == "":
        return None
    if isinstance(value, str):  # ASCII digits, surrounding whitespace stripped
        number = _ascii_int(value.strip())
    else:  # bool is an int to Python, and int(2.5) would truncate: neither is a count
        try:
            number = None if isinstance(value, (bool, float)) else int(value)
        except (TypeError, ValueError):
            number = None
    if not isinstance(number, int) or number < 1:
        raise ConfigError(f"{source}={_shown(value)}: must be a positive integer, the number of "
                          "a run's latest checkpoint rows to keep; unset it to keep every row")
    return number


def parse_keep_best(value: object, source: str,
                    error: type[ConfigError] = ConfigError) -> str | None:
    """'<metric>:max' or '<metric>:min', or None (unset or empty: a variable)."""
    if value is None or (value == "" and error is ConfigError):
        return None
    text = value.strip() if isinstance(value, str) else ""
    metric, sep, mode = text.rpartition(":")
    if not sep or not metric.strip() or mode not in ("max", "min"):
        raise error(f"{source}={_shown(value)}: must be '<metric>:max' or '<metric>:min', a "
                          "DVCLive metric path such as 'train/acc:max' or 'loss:min'")
    return text


def parse_seconds(value: str | None, name: str, default: float = DEFAULT_WAIT_S) -> float:
    """Seconds from 0 to MAX_WAIT_S (unset or empty: ``default``)."""
    text = _given(value)
    if text is None:
        return default
    try:  # float() also takes '٣', '1_0' and a sign ('-0', '+1')
        plain = text.isascii() and "_" not in text and text[:1] not in "+-"
        seconds = float(text) if plain else math.nan
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_WAIT_S:
        raise ConfigError(f"{name}={_shown(value)}: must be a number of seconds from 0 to "
                          f"{MAX_WAIT_S} (ten years), e.g. {name}=600; unset it for the "
                          f"default {default:.0f}")
    return seconds


def parse_switch(value: str | None, name: str, default: bool = True) -> bool:
    """'1' or '0' (unset or empty: ``default``)."""
    text = _given(value)
    if text is None:
        return default
    if text not in ("0", "1"):
        raise ConfigError(f"{name}={_shown(value)}: must be 1 (on) or 0 (off); unset it for the "
                          f"default {int(default)}")
    return text == "1"


def parse_bytes(value: str | None, name: str, default: int) -> int:
    """A non-negative number of bytes (unset or empty: ``default``)."""
    text = _given(value)
    if text is None:
        return default
    number = _ascii_int(text)
    if number is None:
        raise ConfigError(f"{name}={_shown(value)}: must be a number of bytes (0 or more, digits "
                          f"0-9), e.g. {name}=500000000; unset it for the default {default}")
    return number


def parse_count(value: str | None, name: str) -> int:
    """A number of batches (0 or more), or -1 for all (unset, empty or "all")."""
    text = _given(value)
    if text is None or text.lower() == "all":
        return -1
    number = _ascii_int(text)
    if number is None:
        raise ConfigError(f"{name}={_shown(value)}: must be a number of batches (digits 0-9; 0 "
                          "turns it off) or 'all'; unset it for the default, all")
    return number


def parse_signal_file(value: str | None) -> str | None:
    """DVC_DALI_SIGNAL_FILE: an absolute file path (`dvc-dali run` sets one for its child)."""
    text = _given(value)
    if text is None:
        return None
    if not os.path.isabs(text) or os.path.isdir(text):
        raise ConfigError(f"DVC_DALI_SIGNAL_FILE={_shown(value)}: must be the absolute path of a "
                          "file, the signal file `dvc-dali run` watches (it sets this for its "
                          f"child); unset it to use .dvc/tmp/{SIGNAL_NAME}")
    return text


def debug_requested(environ: Mapping[str, str] | None = None) -> bool:
    """DVC_DALI_DEBUG=1, read without refusing anything: the exit hook asks it
    for an error that may be the refusal of this very variable."""
    value = (os.environ if environ is None else environ).get("DVC_DALI_DEBUG")
    return value is not None and value.strip() == "1"


@dataclass(frozen=True)
class RunContext:
    """What the environment says about this run, validated."""

    dvc_root: str | None = None
    stage: str | None = None
    dvc_exp_name: str | None = None  # DVC_EXP_NAME: what `dvc exp run -n` named this run
    baseline_rev: str | None = None
    watched: bool = False  # DVC_CHECKPOINT: DVC 2 or `dvc-dali run` answers the signal
    signal_file: str | None = None
    signal_timeout: float = DEFAULT_WAIT_S
    lock_timeout: float = DEFAULT_WAIT_S
    keep_last: int | None = None
    keep_best: str | None = None
    debug: bool = False
    retrain: bool = False
    push_grace: float = 20.0
    rng: bool = True  # DVC_DALI_RNG: save and restore the global random generators
    content_digest_max: int = CONTENT_DIGEST_MAX  # DVC_DALI_CONTENT_DIGEST_MAX (bytes)
    inexact: bool = False  # DVC_DALI_INEXACT: resume on purpose past a proof that failed
    verify_batches: int = -1  # DVC_DALI_VERIFY_BATCHES: batches proved after a checkpoint; -1 all
    asynchronous: bool = False  # DVC_DALI_ASYNC: Checkpointer(asynchronous=)'s default

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "RunContext":
        env = os.environ if environ is None else environ
        keep_best = parse_keep_best(env.get("DVC_DALI_KEEP_BEST"), "DVC_DALI_KEEP_BEST")
        return cls(
            dvc_root=env.get("DVC_ROOT") or None,
            stage=env.get("DVC_STAGE") or None,
            dvc_exp_name=env.get("DVC_EXP_NAME") or None,
            baseline_rev=env.get("DVC_EXP_BASELINE_REV") or None,
            watched=bool(env.get(SIGNAL_NAME)) and not env.get(RECORDS_ITSELF),
            signal_file=parse_signal_file(env.get("DVC_DALI_SIGNAL_FILE")),
            signal_timeout=parse_seconds(env.get("DVC_DALI_SIGNAL_TIMEOUT"),
                                         "DVC_DALI_SIGNAL_TIMEOUT"),
            lock_timeout=parse_seconds(env.get("DVC_DALI_LOCK_TIMEOUT"), "DVC_DALI_LOCK_TIMEOUT"),
            keep_last=parse_keep_last(env.get("DVC_DALI_KEEP_LAST"), "DVC_DALI_KEEP_LAST"),
            keep_best=keep_best,
            debug=parse_switch(env.get("DVC_DALI_DEBUG"), "DVC_DALI_DEBUG", default=False),
            retrain=parse_switch(env.get("DVC_DALI_RETRAIN"), "DVC_DALI_RETRAIN", default=False),
            push_grace=parse_seconds(env.get("DVC_DALI_PUSH_GRACE"), "DVC_DALI_PUSH_GRACE",
                                     default=20.0),
            rng=parse_switch(env.get("DVC_DALI_RNG"), "DVC_DALI_RNG"),
            content_digest_max=parse_bytes(env.get("DVC_DALI_CONTENT_DIGEST_MAX"),
                                           "DVC_DALI_CONTENT_DIGEST_MAX", CONTENT_DIGEST_MAX),
            inexact=parse_switch(env.get("DVC_DALI_INEXACT"), "DVC_DALI_INEXACT", default=False),
            verify_batches=parse_count(env.get("DVC_DALI_VERIFY_BATCHES"),
                                       "DVC_DALI_VERIFY_BATCHES"),
            asynchronous=parse_switch(env.get("DVC_DALI_ASYNC"), "DVC_DALI_ASYNC",
                                      default=False),
        )

    @property
    def mode(self) -> str:
        """'watched' (DVC 2 or `dvc-dali run` records), 'record' (DVC 3: this
        process records) or 'off' (not under `dvc exp run`)."""
        if self.watched:
            return "watched"
        if self.dvc_root and self.baseline_rev:
            # DVC 2 sets these for every stage too, but never DVC_STAGE (DVC >= 3.49
            # always does): recording a DVC 3 dvc.lock there would break DVC 2's run.
            return "record" if self.stage else "off"
        return "off"

    def refuse_stray_signal(self) -> None:
        """DVC_CHECKPOINT=1 left in the environment of DVC 3's `dvc exp run`
        (DVC_STAGE is set: DVC 2 never sets it; `dvc-dali run` names its
        signal file): nobody answers the signal, so the first checkpoint
        waited DVC_DALI_SIGNAL_TIMEOUT (an hour) and recorded nothing
        (found by a sweep). Refused before training."""
        if self.watched and self.stage and not self.signal_file:
            raise ConfigError(
                f"{SIGNAL_NAME}=1 is set, but this is DVC 3's `dvc exp run` (DVC_STAGE is "
                "set), which answers no checkpoint signal: every checkpoint would wait for "
                f"nobody. Unset {SIGNAL_NAME} (`unset {SIGNAL_NAME}`, or remove it from the "
                "stage's cmd): under DVC 3 dvc-dali records the rows itself")

    @property
    def under_exp_run(self) -> bool:
        return bool(self.dvc_root and self.baseline_rev)

    def retention(self, keep_last: object = None, keep_best: object = None) -> Retention:
        """Arguments win over the environment; both are checked, an argument
        by its type too (keep_last='3' or True, keep_best='' were taken)."""
        check_count(keep_last, "keep_last", "the number of a run's latest checkpoint rows to keep")
        check_str(keep_best, "keep_best", "'train/acc:max'")
        last = None if keep_last is None else int(keep_last)  # type: ignore[call-overload]
        best = parse_keep_best(keep_best, "keep_best", ArgumentError)
        return Retention(last if last is not None else self.keep_last,
                         best if best is not None else self.keep_best)


def repo_root(start: Path | None = None) -> Path | None:
    """The nearest directory holding `.dvc/`: the run's own repo, which for
    `--temp` and queued runs is not DVC_ROOT."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / ".dvc").is_dir():
            return candidate
    return None
