"""The run this process trains under `dvc exp run`: what belongs to one run,
not to the process (process_state.py keeps the caches and pools).

One stage command trains one run, so a process has at most one: made at the
run's start (the Checkpointer's or a bare script's) or at its first
recording, by :func:`of`, and handed to whoever needs it. A second run in
the same process (another DVC repository, experiment name or stage) once
the first has begun (a start taken, a row recorded) is refused rather than
mixed with the first: its rows would carry the first's
params and continue its lineage. ``process_state.reset()`` forgets it, as a
new process would; a forked child inherits it (the run it was forked in).

Plain data, as process_state: no other dvc_dali module above core is
imported, not even for types (the recorder's are named in comments).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .context import RunContext
from .errors import RecordError


@dataclass
class Run:
    """One run: its identity, and what it learned at its start and since."""

    dvc_root: str
    dvc_exp_name: Optional[str]  # DVC_EXP_NAME: this invocation's name (None: DVC gave none)
    stage: Optional[str]  # DVC_STAGE
    start: Optional[Any] = None  # recording.run_start.RunStart: the params it trains with
    # whether its rows branch off as a run of their own (a retrained applied
    # row); None until the run started (before its first row, once)
    branched: Optional[bool] = None
    # (step, row) it recorded last; on a rank other than 0, (step, ""): rank 0 recorded it
    kept: Optional[tuple[int, str]] = None
    # checkpoint paths named after its start, found to be the stage's output
    checked_outs: set[str] = field(default_factory=set)
    # the lineage tip per (main git dir, DVC_EXP_NAME, stage address):
    # (commit sha, step, run name), as this process published it
    tips: dict[tuple[str, str, str], tuple[Optional[str], int, str]] = field(
        default_factory=dict)
    # per tips key: when the run its rows belong to began (rows.started_token;
    # None: not known), for their lineage lines and retention
    started: dict[tuple[str, str, str], Optional[str]] = field(default_factory=dict)

    def begun(self) -> bool:
        """Whether it holds anything yet (a start, a row): a run asked for
        and refused before either (a stage not found) claims nothing."""
        return (self.start is not None or self.branched is not None or self.kept is not None
                or bool(self.tips))

    def describe(self) -> str:
        return (f"experiment {self.dvc_exp_name or '(unnamed)'} of stage {self.stage or '?'} "
                f"in {self.dvc_root}")


_current: Optional[Run] = None


def of(ctx: RunContext) -> Run:
    """The run ``ctx`` describes: this process's, made on the first call.

    Raises:
        RecordError: this process already trains another run.
    """
    global _current
    identity = (ctx.dvc_root or "", ctx.dvc_exp_name, ctx.stage)
    if _current is None or not _current.begun():
        _current = Run(*identity)
    elif (_current.dvc_root, _current.dvc_exp_name, _current.stage) != identity:
        other = Run(*identity)
        raise RecordError(
            f"this process trains {_current.describe()}, and was asked to record "
            f"{other.describe()} too: one process trains one run (its rows would carry the "
            "first run's params). Start the second in a process of its own.")
    return _current


def current() -> Optional[Run]:
    """This process's run, if one started (None outside `dvc exp run`)."""
    return _current


def forget() -> None:
    """As in a new process: no run (process_state.reset calls it)."""
    global _current
    _current = None
