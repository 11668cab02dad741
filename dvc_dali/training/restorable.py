"""Everything a checkpoint restores, behind one protocol (as torchdata's
``Stateful``): a :class:`Restorable` is registered with the Checkpointer
once, restored there from the checkpoint being resumed (or built fresh),
and captured at every save into its part of the manifest.

The kinds: a DALI pipeline (:class:`DaliPipeline`, saved through the
framework iterator over it when there is one, so the iterator's counters
come back too), a TensorFlow ``DALIDataset`` (:class:`TfDataset`, its
iterators seen as one stream), DALI dynamic mode (:class:`DynamicMode`).
The global random generators are arrays of the checkpoint instead
(rng_state.py): they are set back at the loop's first read, after the
model's seeded initialisation.

:class:`SavedCheckpoint` hands each saved state out only to what is built
the same way: DALI restores silently into a different pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from ..dali import dali_dynamic, dali_iterators, dali_state, dali_tf
from ..proof import data_contents
from ..format import store
from ..core.errors import CheckpointCorruptError, PipelineMismatchError

PIPELINES, DYNAMIC = "pipelines", "dynamic"  # the manifest's parts


class Restorable(Protocol):
    """One thing whose state a checkpoint holds."""

    section: ClassVar[str]  # the manifest part its capture goes to
    name: str

    def restore(self, saved: SavedCheckpoint | None) -> None:
        """Build it from ``saved`` (None: fresh), refusing a state it cannot use."""

    def capture(self) -> Any:
        """Its state now, as the manifest entry (with the bytes to write)."""


class SavedCheckpoint:
    """The checkpoint being resumed, matched by name against what is built now."""

    def __init__(self, snapshot: store.Snapshot, param_changes: tuple[str, ...],
                 inexact: bool) -> None:
        self.snapshot = snapshot
        self.param_changes = param_changes  # named in a mismatch, which they may explain
        self.inexact = inexact  # DVC_DALI_INEXACT: changed data said, not refused
        self.explain_data = lambda old, new: []  # the files behind a changed data digest
        self.manifest_path = snapshot.path / store.MANIFEST

    def entry(self, name: str) -> dict[str, Any]:
        return self.snapshot.manifest["pipelines"][name]

    def state_file(self, name: str) -> Path:
        return self.snapshot.path / self.entry(name)["file"]

    def pipeline_state(self, name: str, description: dict[str, Any],
                       kind: str = dali_state.KIND) -> bytes:
        """Pipeline ``name``'s saved state, checked; refused for another
        pipeline, or one built another way (``kind``: a DALI pipeline, a
        TensorFlow DALIDataset)."""
        saved = self.snapshot.manifest["pipelines"]
        if name not in saved:
            raise PipelineMismatchError(
                f"{self.manifest_path}: has no pipeline {name!r} (it holds "
                f"{sorted(saved) or 'none'}), so {name!r} cannot resume where the others do. "
                "Register the pipelines under the names they were saved with, or start over "
                "with `dvc-dali reset`.")
        saved_kind = saved[name].get("kind", dali_state.KIND)
        if saved_kind != kind:
            raise PipelineMismatchError(
                f"{self.manifest_path}: pipeline {name!r} was saved from {_BUILT_BY[saved_kind]}"
                f", and is now built with {_BUILT_BY[kind]}; their states do not carry over. "
                "Build it the way it was saved to resume, or start over with `dvc-dali reset`.")
        self._check_description(name, saved[name].get("description"), description)
        state = self.snapshot.pipeline_states[name]
        if kind == dali_tf.KIND:
            dali_tf.unpack(state, str(self.state_file(name)))  # names the file if damaged
        else:
            dali_state.read_state(state, str(self.state_file(name)))
        return state

    def _check_description(self, name: str, old: Any, description: dict[str, Any]) -> None:
        if not isinstance(old, dict):
            raise CheckpointCorruptError(f"{self.manifest_path}: pipeline {name!r} has no "
                                         "description; start over with `dvc-dali reset`.")
        diff = dali_state.differences(old, description)
        if diff:
            diff += self.explain_data(old, description)
            raise PipelineMismatchError(
                f"{self.manifest_path}: pipeline {name!r} differs from the one that wrote the "
                "checkpoint, and DALI would restore into it silently, producing other "
                "batches:\n  " + "\n  ".join(diff)
                + "".join(f"\n  param {c}" for c in self.param_changes)
                + "\nRun with the saved settings to resume, or start over with "
                "`dvc-dali reset` (or Checkpointer(..., resume=False)).")

    def dynamic_state(self, name: str) -> str:
        saved = self.snapshot.dynamic_states
        if name not in saved:
            raise PipelineMismatchError(
                f"{self.manifest_path}: has no dynamic-mode state {name!r} (it holds "
                f"{sorted(saved) or 'none'}); use the saved name, or start over with "
                "`dvc-dali reset`.")
        return saved[name]


_BUILT_BY = {dali_state.KIND: "Checkpointer.pipeline() (a DALI pipeline)",
             dali_tf.KIND: "Checkpointer.tf_dataset() (a TensorFlow DALIDataset)"}


def _with_contents(entry: dict[str, Any], contents: data_contents.Contents) -> dict[str, Any]:
    """The entry with its data's content digests (joined now: the first save
    waits for the digests still being computed)."""
    records = contents.result()
    if records:
        entry[data_contents.KEY] = records
    return entry


@dataclass(eq=False)
class DaliPipeline:
    """A DALI pipeline, built by :meth:`restore` with its saved state."""

    section: ClassVar[str] = PIPELINES
    name: str
    pipe: Any
    description: dict[str, Any]
    contents: data_contents.Contents  # its data's digests, being computed
    iterator: Any = None  # the framework iterator over it, once there is one

    def restore(self, saved: SavedCheckpoint | None) -> None:
        if saved is None:
            dali_state.build(self.pipe, self.name)
            return
        state = saved.pipeline_state(self.name, self.description)
        dali_state.build(self.pipe, self.name, state, str(saved.state_file(self.name)))
        data_contents.check(self.contents, saved.entry(self.name), str(saved.manifest_path),
                            saved.inexact)

    def capture(self) -> dict[str, Any]:
        # under a framework iterator, through it: pipe.checkpoint() would lose
        # the iterator's counters
        through = (dali_iterators.pipeline_states([self.iterator]).get(id(self.pipe))
                   if self.iterator is not None else None)
        state = through or dali_state.capture(self.pipe)
        info = dali_state.read_state(state, self.name)
        return _with_contents({
            "state": state,
            "fingerprint": dali_state.fingerprint(self.description),
            "description": self.description,
            "iter": info["iter"],
            "epoch_idx": info["epoch_idx"],
            "serialized": dali_state.serialized(self.pipe),  # for `dvc-dali doctor --verify`
        }, self.contents)


@dataclass(eq=False)
class TfDataset:
    """A TensorFlow DALIDataset's stream: :meth:`restore` sets where its
    first iterator starts."""

    section: ClassVar[str] = PIPELINES
    name: str
    pipe: Any
    description: dict[str, Any]
    contents: data_contents.Contents
    stream: dali_tf.Stream | None = field(default=None)
    # the dataset ends in dvc-dali's check node (dali_tf); a state saved
    # without it (by an earlier dvc-dali) restores only into a dataset without it
    check_node: bool = True

    def restore(self, saved: SavedCheckpoint | None) -> None:
        state, where = None, ""
        if saved is not None:
            state = saved.pipeline_state(self.name, self.description, kind=dali_tf.KIND)
            where = str(saved.state_file(self.name))
            self.check_node = saved.entry(self.name).get(dali_tf.CHECK_NODE) is True
            data_contents.check(self.contents, saved.entry(self.name),
                                str(saved.manifest_path), saved.inexact)
        self.stream = dali_tf.Stream(state, where)

    @property
    def iterated(self) -> bool:
        return self.stream is not None and self.stream.iterated

    def capture(self) -> dict[str, Any]:
        entry = {"state": self.stream.state(), "kind": dali_tf.KIND,
                 "fingerprint": dali_state.fingerprint(self.description),
                 "description": self.description}
        if self.check_node:
            entry[dali_tf.CHECK_NODE] = True
        return _with_contents(entry, self.contents)


@dataclass(eq=False)
class DynamicMode:
    """A DALI dynamic-mode Checkpoint: readers and RNGs registered on it get
    their saved states at registration."""

    section: ClassVar[str] = DYNAMIC
    name: str
    checkpoint: Any = None

    def restore(self, saved: SavedCheckpoint | None) -> None:
        state = saved.dynamic_state(self.name) if saved is not None else None
        where = str(saved.snapshot.path) if saved is not None else ""
        self.checkpoint = dali_dynamic.checkpoint(self.name, state, where)

    def capture(self) -> str:
        return dali_dynamic.serialize(self.checkpoint)
