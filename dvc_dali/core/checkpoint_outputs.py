"""Which outputs of a stage are checkpoints: the one rule, read from the
stage's entry in dvc.yaml (a plain dict, as YAML loads it). Pure: no DVC, no
files, so `dvc-dali migrate` and the recorder (through dvc_door) give the
same answer.

DVC 2 and DVC 3 accept ``checkpoint: true`` on an entry of any of the three
output lists (``outs``, ``metrics``, ``plots``), so all three are read. An
entry counts when it is a one-key mapping ``{path: options}`` whose options
hold ``checkpoint`` set to the boolean true (a plain ``- path`` has no
options).
"""

from __future__ import annotations

from typing import Any, NamedTuple

OUTPUT_LISTS = ("outs", "metrics", "plots")


class CheckpointOutput(NamedTuple):
    """One `checkpoint: true` output, and where the stage entry holds it."""

    list_name: str  # "outs", "metrics" or "plots"
    index: int  # its position in that list
    key: Any  # its key in the entry, as loaded (the output path)
    options: Any  # the mapping of its options

    @property
    def path(self) -> str:
        return str(self.key)


def checkpoint_outputs(stage: Any) -> list[CheckpointOutput]:
    """The `checkpoint: true` outputs of one stage's dvc.yaml entry, in the
    order outs, metrics, plots; anything malformed is skipped (DVC refuses it)."""
    found: list[CheckpointOutput] = []
    for name in OUTPUT_LISTS:
        entries = stage.get(name) if isinstance(stage, dict) else None
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            if isinstance(entry, dict) and len(entry) == 1:
                (key, options), = entry.items()
                if isinstance(options, dict) and options.get("checkpoint") is True:
                    found.append(CheckpointOutput(name, i, key, options))
    return found
