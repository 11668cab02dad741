"""dvc-dali: the state of NVIDIA DALI pipelines as DVC experiment checkpoints.

    ckpt = dvc_dali.Checkpointer("checkpoint")
    pipe = ckpt.pipeline("train", my_pipeline, batch_size=32, num_threads=2,
                         device_id=None, seed=1)
    weights = ckpt.arrays.get("w", init_weights())
    for step in range(ckpt.step, total_steps):
        ...
        ckpt.make_checkpoint(step + 1, arrays={"w": weights})
"""

from ._version import __version__
from .checkpointer import Checkpointer
from .errors import (
    CheckpointCorruptError,
    CheckpointFormatError,
    CheckpointLockedError,
    CheckpointWriteError,
    ConfigError,
    DvcDaliError,
    PipelineMismatchError,
    RankMismatchError,
    RecordError,
    SignalError,
    UnchangedCheckpointError,
    UnnamedOperatorWarning,
    UnsupportedPipelineError,
)
from .checkpoint_signal import make_checkpoint
from .history import best_row, rows
from .load import Loaded, load

__all__ = [
    "Checkpointer",
    "make_checkpoint",
    "load",
    "Loaded",
    "rows",
    "best_row",
    "DvcDaliError",
    "CheckpointCorruptError",
    "CheckpointFormatError",
    "CheckpointLockedError",
    "CheckpointWriteError",
    "ConfigError",
    "PipelineMismatchError",
    "RankMismatchError",
    "RecordError",
    "SignalError",
    "UnchangedCheckpointError",
    "UnnamedOperatorWarning",
    "UnsupportedPipelineError",
    "__version__",
]
