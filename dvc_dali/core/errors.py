"""Exceptions. Every message names the file, what is wrong and what to do."""

from __future__ import annotations

import re

# A name that is not UTF-8 (a directory named with byte 0xff) comes from the
# file system as str with each such byte a lone surrogate (os.fsdecode), which
# stderr printed as \udcff, and repr() as '\udcff'; people read \xff.
_RAW_BYTE = re.compile("[\udc80-\udcff]")
_SHOWN_BYTE = re.compile(r"\\udc([89a-f][0-9a-f])")


def readable(text: str) -> str:
    """``text`` with each byte of a name that is not UTF-8 as ``\\xNN``, its
    raw form or as repr() showed it: every message naming a path passes here
    (a DvcDaliError's message, the log's lines, the CLI's errors)."""
    text = _RAW_BYTE.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", text)
    return _SHOWN_BYTE.sub(r"\\x\1", text) if "\\udc" in text else text


class DvcDaliError(Exception):
    """Base class of every error dvc-dali raises on purpose."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(readable(a) if isinstance(a, str) else a for a in args))


class CheckpointCorruptError(DvcDaliError):
    """A checkpoint file is missing, truncated, empty, garbage or edited (fails
    its digest or the manifest's checks); the message names the file and field."""


class CheckpointWriteError(DvcDaliError):
    """A checkpoint could not be written (disk full, permissions); the previous
    one stands."""


class CheckpointLockedError(DvcDaliError):
    """Another live process is writing the same checkpoint directory (such as
    the training process a killed `dvc exp run` leaves running); the message
    names its pid and command."""


class CheckpointFormatError(DvcDaliError):
    """A checkpoint from a foreign or newer format, or from DALI 1.x."""


class PipelineMismatchError(DvcDaliError):
    """The checkpoint was written by a different pipeline than the one built now.

    It lists what differs, old -> new, and the changed params; for changed
    data, the files by name. A batch that differs on resume (proof at
    runtime) is a ``BatchMismatchError``, a subclass of this one.
    """


class BatchMismatchError(PipelineMismatchError):
    """A resumed pipeline produced a batch other than the one the run it
    continues produced after the same checkpoint (proof at runtime)."""


class RankMismatchError(DvcDaliError):
    """A checkpoint saved by another number of processes, or another rank's state."""


class UnsupportedPipelineError(DvcDaliError):
    """A pipeline whose state DALI cannot capture exactly (an ``external_source``
    other than a one-argument callable)."""


class PipelineBuildError(DvcDaliError):
    """DALI could not build a pipeline (before any saved state was set into
    it): the message names the pipeline, the operator, the line of the
    script that made it, and what DALI found wrong."""


class SignalError(DvcDaliError):
    """The DVC_CHECKPOINT signal file could not be written, or was never
    answered (``DVC_DALI_SIGNAL_TIMEOUT``)."""


class RecordError(DvcDaliError):
    """A checkpoint could not be recorded as a DVC experiment (DVC 3); the
    checkpoint's files are intact and the message says where and what to do."""


class UnchangedCheckpointError(DvcDaliError):
    """A rerun of an applied row that its run already went on from, with nothing
    changed: its later rows hold that training (DVC 2 refused it too)."""


class ConfigError(DvcDaliError):
    """An environment variable or argument has a value dvc-dali does not accept
    (also a stage declaration DVC 3 cannot resume); the message names it and
    what it accepts."""


class ArgumentError(ConfigError, ValueError):
    """An argument of the Python API with a value it does not take (a
    pipeline name registered twice, a metric spec without ``:max`` or
    ``:min``); the message names the argument and what to pass. Also a
    ``ValueError``, as such refusals were before."""


class ArgumentTypeError(ConfigError, TypeError):
    """An argument of the Python API of a type it does not take (an object in
    ``arrays`` that cannot be saved without pickle, a pipeline source that
    is no pipeline, a path that is no path); the message names the argument
    (and the array) and what to pass. Also a ``TypeError``, as such refusals
    were before."""


class UnnamedOperatorWarning(UserWarning):
    """A stateful operator without ``name=``: its state is keyed by creation order."""
