"""What the framework callbacks say when a fit ends short of the run's
``total_steps``: the run is left unfinished, and its last row looks like a
finished run's unless this is said (Keras's ``epochs * steps_per_epoch``,
Lightning's ``max_steps``/``max_epochs``, below ``total_steps``)."""

from __future__ import annotations


def unfinished_line(where: str, step: int, total_steps: int | None, fit: str,
                    more: str) -> str | None:
    """The one line to say after a fit that ended at ``step`` in checkpoint
    ``where``; None where the run is finished or has no ``total_steps``.
    ``fit`` names the fit call, ``more`` what trains the rest."""
    if total_steps is None or step >= total_steps:
        return None
    return (f"{fit} ended at step {step} of total_steps={total_steps} ({where}): the run is "
            f"unfinished. A later fit continues it from step {step}; to finish it, {more}.")
