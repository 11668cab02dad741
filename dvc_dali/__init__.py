"""dvc-dali: the state of NVIDIA DALI pipelines as DVC experiment checkpoints.

    ckpt = dvc_dali.Checkpointer("checkpoint")
    pipe = ckpt.pipeline("train", my_pipeline, batch_size=32, num_threads=2,
                         device_id=None, seed=1)
    weights = ckpt.arrays.get("w", init_weights())
    for step in range(ckpt.step, total_steps):
        ...
        ckpt.make_checkpoint(step + 1, arrays={"w": weights})
"""

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .core.errors import (
    ArgumentError,
    ArgumentTypeError,
    BatchMismatchError,
    CheckpointCorruptError,
    CheckpointFormatError,
    CheckpointLockedError,
    CheckpointWriteError,
    ConfigError,
    DvcDaliError,
    PipelineBuildError,
    PipelineMismatchError,
    RankMismatchError,
    RecordError,
    SignalError,
    UnchangedCheckpointError,
    UnnamedOperatorWarning,
    UnsupportedPipelineError,
)

# The rest on first use: `dvc-dali show` and `dvc_dali.load` need neither
# NumPy's import nor the Checkpointer's (a third of a short command's time).
_LAZY = {"Checkpointer": "training.checkpointer", "make_checkpoint": "training.signal_file",
         "rows": "reading.row_queries", "best_row": "reading.row_queries",
         "current_row": "reading.row_queries", "load": "reading.loading",
         "Loaded": "reading.loading", "Row": "reading.exp_refs"}

if TYPE_CHECKING:
    from .training.checkpointer import Checkpointer
    from .reading.exp_refs import Row
    from .reading.loading import Loaded, load
    from .reading.row_queries import best_row, current_row, rows
    from .training.signal_file import make_checkpoint


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dvc_dali' has no attribute {name!r}")

__all__ = [
    "Checkpointer",
    "make_checkpoint",
    "load",
    "Loaded",
    "rows",
    "Row",
    "best_row",
    "current_row",
    "DvcDaliError",
    "CheckpointCorruptError",
    "CheckpointFormatError",
    "CheckpointLockedError",
    "CheckpointWriteError",
    "ConfigError",
    "ArgumentError",
    "ArgumentTypeError",
    "PipelineBuildError",
    "PipelineMismatchError",
    "BatchMismatchError",
    "RankMismatchError",
    "RecordError",
    "SignalError",
    "UnchangedCheckpointError",
    "UnnamedOperatorWarning",
    "UnsupportedPipelineError",
    "__version__",
]

# Inside a DVC 3 `dvc exp run` stage with a `checkpoint: true` output: what
# DVC 2 did before running it, before the script reads anything (stage_start).
# Anywhere else it reads a few environment variables and returns: no DVC,
# NumPy or DALI import, no hook installed.
from .training.stage_start import on_import as _on_import  # noqa: E402

_on_import()
