"""What `import dvc_dali` does first inside a DVC 3 `dvc exp run` stage that
declares a `checkpoint: true` output: what DVC 2 did before it ran such a
stage, done before the script reads its checkpoint or trains a step.

- A stage DVC 3 cannot resume (no `persist: true`, no `always_changed: true`:
  a DVC 2 project run as it is) is refused, naming `dvc-dali migrate`.
- DVC 2 set DVC_CHECKPOINT=1 for such stages, and DVC 2 scripts train only
  when it is set; DVC 3 never sets it, so they would "succeed" having
  trained nothing. It is set here, marked as dvc-dali's (RECORDS_ITSELF), so
  this process still records its rows itself.
- A --temp or queued run gets the workspace's checkpoint (DVC does not carry
  it), and an applied row whose run went on from it, rerun unchanged, is
  refused ("Nothing to do for unchanged checkpoint"), as DVC 2 did.

Nothing happens outside `dvc exp run` of DVC 3 (DVC 2 and `dvc-dali run`
set DVC_CHECKPOINT themselves), nor for stages without `checkpoint: true`.
"""

from __future__ import annotations

import os

from .context import RECORDS_ITSELF, SIGNAL_NAME, RunContext
from .errors import DvcDaliError
from .log import logger


def _checkpoint_stage(ctx: RunContext) -> bool:
    """Whether the running stage declares a `checkpoint: true` output."""
    from .recording import dvc_door
    from .recording.maintenance import repo_at
    from .recording.stage import find_stage

    try:
        stage = find_stage(repo_at(os.getcwd()), ctx.stage, None, ctx.stage)
    except DvcDaliError as exc:  # not this package's business to refuse here
        logger.debug("stage %s not examined at import: %s", ctx.stage, exc)
        return False
    return bool(dvc_door.declared_checkpoint_outs(stage))


def on_import() -> None:
    """Called once, when dvc_dali is imported; a refusal is a one-line error
    (exit_hooks) raised from the import, before the script's first line
    of training."""
    env = os.environ
    if env.get(SIGNAL_NAME) or not (env.get("DVC_STAGE") and env.get("DVC_ROOT")
                                    and env.get("DVC_EXP_BASELINE_REV")):
        return
    from . import exit_hooks

    exit_hooks.install_hook()  # a bad DVC_DALI_* value: refused here, in one line
    ctx = RunContext.from_environ()
    if ctx.mode != "record" or not _checkpoint_stage(ctx):
        return
    from .recording import pipeline as recording

    # torch is not imported yet: torchrun's variable tells a rank (whose agent
    # stops the others with SIGTERM) from a single process
    exit_hooks.install(ctx, sigterm=env.get("WORLD_SIZE", "1") == "1")
    # first: a process started from here (or later) inherits it and does not
    # do all this again
    env[SIGNAL_NAME] = "1"  # what DVC 2 set for checkpoint stages
    env[RECORDS_ITSELF] = "1"
    recording.start_bare_run(ctx, None)
