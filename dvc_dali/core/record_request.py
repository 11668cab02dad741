"""The records that cross from the training side (a Checkpointer, a bare
make_checkpoint(), `dvc-dali run`) to the recorder (recording/pipeline.py):
what one recording is asked, and which of its run's rows it keeps. Plain
data, importing nothing: a process that records nothing never loads the
recorder for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional


class Retention(NamedTuple):
    """Which rows of a run recording keeps: the last ``keep_last`` (None: all)
    and the best by ``keep_best`` ('train/acc:max'; see best.py). A tuple
    too, (keep_last, keep_best), as RunContext.retention has always given it."""

    keep_last: Optional[int] = None
    keep_best: Optional[str] = None


@dataclass(frozen=True)
class RecordRequest:
    """What one recording is asked (recording.pipeline.record documents each field)."""

    step: Optional[int] = None  # None: one more than the run's previous row
    stage: Optional[str] = None  # the stage's address; None: DVC_STAGE, else found from out
    name: Optional[str] = None  # the row's name; None: "<run>-step<N>"
    message: str = ""  # first line of the row's commit message
    out: Optional[str] = None  # the checkpoint output
    expect_latest: Optional[str] = None  # LATEST as the Checkpointer just wrote it
    resumed: Optional[bool] = None  # False: a fresh run (no parent row); None: a bare script
    branched: bool = False  # resumed with changed params: its rows are a run of their own
    # an asynchronous checkpoint's (paths, row_files.Stamps) of the other files
    # its row holds, taken at the call; None: not compared
    held_files: Optional[tuple] = None
    # when the run began (seconds since the epoch; None: not known, a bare
    # script or an older release's checkpoint): rows of its name made before
    # are another run's (a finished one restarted under it, `-n a -f`), which
    # retention leaves alone
    run_started: Optional[float] = None
