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

Everywhere else the import does nothing but read a few environment
variables: outside `dvc exp run` of DVC 3 (DVC 2 and `dvc-dali run` set
DVC_CHECKPOINT themselves), in a process a checkpoint stage started (it
inherits DVC_CHECKPOINT), in a multiprocessing worker (spawn, forkserver:
torch DataLoader workers, DALI's parallel external source; its parent
decided), and in a stage whose dvc.yaml declares no `checkpoint: true`
for it, which is found without DVC: the stage's dvc.yaml is read as text,
and parsed (ruamel.yaml, DVC's YAML library) only when it names
`checkpoint` at all. Only a stage that declares one imports DVC, installs
the exit hooks and sets the variables. This module imports nothing at its
top but the standard library's ``os`` and ``sys``: `import dvc_dali`
stays as cheap outside a checkpoint stage as outside any stage.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

SIGNAL_NAME = "DVC_CHECKPOINT"  # context.SIGNAL_NAME, not imported here (see above)
PIPELINE_FILE = "dvc.yaml"


def in_stage(env: Mapping[str, str]) -> bool:
    """A DVC 3 `dvc exp run` stage (DVC >= 3.49 sets DVC_STAGE) whose
    checkpoint stage start has not run in this process or a parent."""
    return bool(not env.get(SIGNAL_NAME) and env.get("DVC_STAGE") and env.get("DVC_ROOT")
                and env.get("DVC_EXP_BASELINE_REV"))


def in_worker() -> bool:
    """A multiprocessing child (spawn or forkserver) importing dvc_dali: while
    it prepares (it imports the parent's main module, unpickles its target)
    or after. A forked child imports nothing again."""
    process = sys.modules.get("multiprocessing.process")
    if process is None:
        return False
    return bool(process.parent_process() is not None
                or getattr(process.current_process(), "_inheriting", False))


def candidate_files(address: str, cwd: str, root: Optional[str]) -> list[str]:
    """The dvc.yaml files a DVC_STAGE address '[<dvc.yaml path>:]<name>' may
    mean: the path is relative to where `dvc` ran, and the stage's command runs
    in its wdir, below its dvc.yaml; so dvc.yaml in cwd and each directory above
    it up to the repository root, and the address's path from the root."""
    path = address.rpartition(":")[0]
    found, here = [], os.path.abspath(cwd)
    while True:
        found.append(os.path.join(here, PIPELINE_FILE))
        if root is None or here == root or os.path.dirname(here) == here:
            break
        here = os.path.dirname(here)
    if root is not None:
        found.append(os.path.join(root, path or PIPELINE_FILE))
    return list(dict.fromkeys(found))


def declares_checkpoint(texts: list[str], name: str) -> Optional[bool]:
    """Whether stage ``name`` declares a `checkpoint: true` output in one of
    these dvc.yaml texts (the rule of checkpoint_outputs.py, applied to the
    raw entry as DVC does: a foreach/matrix stage 'a@b' has no entry of its
    own, so none); None when that cannot be told without DVC (no text, one
    that does not parse)."""
    if not texts:
        return None
    texts = [t for t in texts if "checkpoint" in t]
    if not texts:
        return False
    from ruamel.yaml import YAML, YAMLError  # DVC's own YAML library; safe: plain data

    from ..core.checkpoint_outputs import checkpoint_outputs

    for text in texts:
        try:
            data = YAML(typ="safe", pure=True).load(text)
        except YAMLError:
            return None
        stages = data.get("stages") if isinstance(data, dict) else None
        entry = stages.get(name) if isinstance(stages, dict) else None
        if checkpoint_outputs(entry):
            return True
    return False


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _repo_root(cwd: str) -> Optional[str]:
    here = os.path.abspath(cwd)
    while True:
        if os.path.isdir(os.path.join(here, ".dvc")):
            return here
        if os.path.dirname(here) == here:
            return None
        here = os.path.dirname(here)


def may_be_checkpoint_stage(address: str, cwd: str) -> bool:
    """False when the stage surely declares no `checkpoint: true` output,
    told from its dvc.yaml without DVC; True when it does or may (DVC then
    decides, ``_checkpoint_stage``)."""
    texts = [t for t in map(_read, candidate_files(address, cwd, _repo_root(cwd)))
             if t is not None]
    answer = declares_checkpoint(texts, address.rpartition(":")[2])
    return answer is not False


def _checkpoint_stage(ctx: Any) -> bool:
    """Whether the running stage declares a `checkpoint: true` output (DVC's
    answer, which finds the stage among all the repository's dvc.yaml files)."""
    from ..core.errors import DvcDaliError
    from ..core.log import logger
    from ..recording import dvc_door
    from ..recording.maintenance import repo_at
    from ..recording.stage import find_stage

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
    if not in_stage(env) or in_worker() or not may_be_checkpoint_stage(env["DVC_STAGE"],
                                                                        os.getcwd()):
        return
    from ..core import exit_hooks
    from ..core.context import RECORDS_ITSELF, RunContext
    from ..core.errors import DvcDaliError

    try:
        ctx = RunContext.from_environ()
    except DvcDaliError:
        exit_hooks.install_hook()  # a bad DVC_DALI_* value: refused here, in one line
        raise
    if ctx.mode != "record" or not _checkpoint_stage(ctx):
        return
    from ..recording import pipeline as recording

    # torch is not imported yet: torchrun's variable tells a rank (whose agent
    # stops the others with SIGTERM) from a single process
    exit_hooks.install(ctx, sigterm=env.get("WORLD_SIZE", "1") == "1")
    # first: a process started from here (or later) inherits it and does not
    # do all this again
    env[SIGNAL_NAME] = "1"  # what DVC 2 set for checkpoint stages
    env[RECORDS_ITSELF] = "1"
    recording.start_bare_run(ctx, None)
