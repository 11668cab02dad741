"""Everything a checkpoint restores, behind one protocol (as torchdata's
``Stateful``): a :class:`Restorable` is registered with the Checkpointer
once, restored there from the checkpoint being resumed (or built fresh),
and captured at every save into its part of the manifest; the manifest's
parts are assembled from the captures (:func:`assemble`), by one rule.

The kinds: a DALI pipeline (:class:`DaliPipeline`, saved through the
framework iterator over it when there is one, so the iterator's counters
come back too), a TensorFlow ``DALIDataset`` (:class:`TfDataset`, its
iterators seen as one stream), DALI dynamic mode (:class:`DynamicMode`),
the global random generators (:class:`RandomGenerators`, an array of the
checkpoint: restore reads and checks them, and they are set back at the
loop's resume point, its first read of the checkpoint, after the model's
seeded initialisation), and the batch proof (:class:`BatchProof`, the
digests of the batches after the checkpoint resumed, recorded into the
next).

The batch proof stores no entry of its own: its digests are a field,
``batches``, of the entries of the streams they are of (a pipeline's entry,
a dynamic-mode Checkpoint's by reader name), where the format has always
kept them. So it is an *annotation* (section :data:`ANNOTATION`, named by
the field it writes): its capture is ``{part: {entry: value}}`` and
:func:`assemble` sets ``manifest[part][entry][name] = value`` in the
entries the other Restorables captured. Chosen over a typed
``Captured(entry, annotations)`` return so that capture stays one kind of
value for every Restorable (what the manifest stores at its place), and
over letting the proof write into the other entries (what it did): no
Restorable touches another's capture, and the merge is one documented
rule, which refuses a field two of them write.

:class:`SavedCheckpoint` hands each saved state out only to what is built
the same way: DALI restores silently into a different pipeline.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Protocol

from ..dali import dali_dynamic, dali_iterators, dali_state, dali_tf
from ..proof import batch_digests, data_contents
from ..format import store
from ..core.errors import CheckpointCorruptError, PipelineMismatchError
from ..core.log import logger
from . import rng_state

# the manifest's parts a capture goes to; ANNOTATION: fields of other parts' entries
PIPELINES, DYNAMIC, ARRAYS, ANNOTATION = "pipelines", "dynamic", "arrays", "annotation"


class Restorable(Protocol):
    """One thing whose state a checkpoint holds.

    ``capture()`` returns the JSON value the manifest stores under
    ``manifest[section][name]``, with what goes to the snapshot's member
    files in place: a ``"state"`` field (bytes or text: the entry's
    ``file``) in ``pipelines`` and ``dynamic``; arrays in ``arrays`` (each a
    ``.npy`` file). A Restorable of section :data:`ANNOTATION` stores fields
    of other entries instead: its capture is ``{part: {entry: value}}``,
    stored as ``manifest[part][entry][name]`` (:func:`assemble`).
    ``restore(saved)`` builds or checks it from the checkpoint being resumed
    (``None``: fresh), refusing a state it cannot use; it sets nothing global.
    """

    section: ClassVar[str]  # the manifest part its capture goes to
    name: str

    def restore(self, saved: SavedCheckpoint | None) -> None:
        """Build it from ``saved`` (None: fresh), refusing a state it cannot use."""

    def capture(self) -> dict[str, Any]:
        """Its state now: the manifest's value at its place (see the class)."""


_LAST = {ANNOTATION: 1, ARRAYS: 2}  # captured after the entries they annotate; the
# generators last, after anything else this process does at a save


def assemble(sources: Iterable[Restorable]) -> dict[str, dict[str, Any]]:
    """The manifest's parts, ``{section: {name: capture}}``, from every
    source's capture (entries first, then annotations, then arrays); each
    annotation's fields set into the entries captured (an entry not captured
    gets none). A field already there is refused: no two Restorables write
    one place."""
    parts: dict[str, dict[str, Any]] = {PIPELINES: {}, DYNAMIC: {}, ARRAYS: {}}
    for source in sorted(sources, key=lambda s: _LAST.get(s.section, 0)):
        if source.section != ANNOTATION:
            parts.setdefault(source.section, {})[source.name] = source.capture()
            continue
        for part, values in source.capture().items():
            for entry, value in values.items():
                target = parts.get(part, {}).get(entry)
                if target is None:
                    continue
                if source.name in target:
                    raise ValueError(f"manifest {part}.{entry}.{source.name}: written twice")
                target[source.name] = value
    return parts


class SavedCheckpoint:
    """The checkpoint being resumed, matched by name against what is built now."""

    def __init__(self, snapshot: store.Snapshot, param_changes: tuple[str, ...],
                 inexact: bool) -> None:
        self.snapshot = snapshot
        self.param_changes = param_changes  # named in a mismatch, which they may explain
        self.inexact = inexact  # DVC_DALI_INEXACT: changed data said, not refused
        self.explain_data = lambda old, new: []  # the files behind a changed data digest
        # a change let through on purpose (DVC_DALI_INEXACT=1): the batch
        # digests leave the checkpoint's segment (set by the Checkpointer)
        self.went_inexact: Callable[[], None] = lambda: None
        self.manifest_path = snapshot.path / store.MANIFEST

    def entry(self, name: str) -> dict[str, Any]:
        return self.snapshot.manifest["pipelines"][name]

    def lacks(self, name: str) -> bool:
        """Pipeline ``name`` is not in the checkpoint: it was registered after
        the checkpoint was written (a validation pipeline built at its first
        use), so it starts from its beginning, as it did in the run that
        wrote the checkpoint (it was refused: only `dvc-dali reset` went on;
        found by a sweep). Said once."""
        if name in self.snapshot.manifest["pipelines"]:
            return False
        logger.info("pipeline %r is not in %s (registered after it was written): it starts "
                    "from its beginning", name, self.manifest_path)
        return True

    def state_file(self, name: str) -> Path:
        return self.snapshot.path / self.entry(name)["file"]

    def pipeline_state(self, name: str, description: dict[str, Any],
                       kind: str = dali_state.KIND,
                       contents: data_contents.Contents | None = None) -> bytes:
        """Pipeline ``name``'s saved state, checked; refused for another
        pipeline, or one built another way (``kind``: a DALI pipeline, a
        TensorFlow DALIDataset; ``contents``: its data's digests now, to name
        the files that changed)."""
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
        self._check_description(name, saved[name].get("description"), description, contents)
        state = self.snapshot.pipeline_states[name]
        if kind == dali_tf.KIND:
            dali_tf.unpack(state, str(self.state_file(name)))  # names the file if damaged
        else:
            dali_state.read_state(state, str(self.state_file(name)))
        return state

    def _check_description(self, name: str, old: Any, description: dict[str, Any],
                           contents: data_contents.Contents | None) -> None:
        if not isinstance(old, dict):
            raise CheckpointCorruptError(f"{self.manifest_path}: pipeline {name!r} has no "
                                         "description; start over with `dvc-dali reset`.")
        # a data digest of another walk than this release's is not compared
        # (an older release's refused data that had not changed; sweep X)
        verdicts = data_contents.data_verdicts(old, description,
                                               self.entry(name).get(dali_state.WALK_KEY))
        diff = dali_state.differences(old, description, frozenset(
            where for where, (outcome, _) in verdicts.items() if outcome != data_contents.CHANGED))
        if contents is not None:
            contents.unverified.update({where: why for where, (outcome, why) in verdicts.items()
                                        if outcome == data_contents.NOT_VERIFIED})
        if diff:
            # DVC's dvc.lock names the files of a dependency; data outside the
            # repository (or behind a link) only the content digests can name:
            # it said "Run with the saved settings" (found by a sweep)
            data = self.explain_data(old, description) or data_contents.changed_in(
                contents, self.entry(name))
            only_data = all(line.startswith("data.") for line in diff)
            fix = ("Restore the data as it was (`git checkout` or `dvc checkout` of it) to "
                   "resume, or start over on the new data with" if data or only_data else
                   "Run with the saved settings to resume, or start over with")
            raise PipelineMismatchError(
                f"{self.manifest_path}: pipeline {name!r} differs from the one that wrote the "
                "checkpoint, and DALI would restore into it silently, producing other "
                "batches:\n  " + "\n  ".join(diff + data)
                + "".join(f"\n  param {c}" for c in self.param_changes)
                + f"\n{fix} `dvc-dali reset` (or Checkpointer(..., resume=False)).")

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
    entry[dali_state.WALK_KEY] = dali_state.WALK  # the walk of its data digests
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
        if saved is None or saved.lacks(self.name):
            dali_state.build(self.pipe, self.name)
            return
        state = saved.pipeline_state(self.name, self.description, contents=self.contents)
        dali_state.build(self.pipe, self.name, state, str(saved.state_file(self.name)))
        if data_contents.check(self.contents, saved.entry(self.name),
                               str(saved.manifest_path), saved.inexact):
            saved.went_inexact()

    def capture(self) -> dict[str, Any]:
        # under a framework iterator, through it: pipe.checkpoint() would lose
        # the iterator's counters
        through = (dali_iterators.pipeline_states([self.iterator]).get(id(self.pipe))
                   if self.iterator is not None else None)
        state = through or dali_state.capture(self.pipe)
        info = dali_state.read_state(state, self.name)
        fingerprint, graph = self._graph
        return _with_contents({
            "state": state,
            "fingerprint": fingerprint,
            "description": self.description,
            "iter": info["iter"],
            "epoch_idx": info["epoch_idx"],
            "serialized": graph,  # for `dvc-dali doctor --verify`
        }, self.contents)

    @functools.cached_property
    def _graph(self) -> tuple[str, str]:
        """The fingerprint and the serialized graph: fixed once the pipeline is
        built, so computed at the first checkpoint only (~0.3 ms each time)."""
        return dali_state.fingerprint(self.description), dali_state.serialized(self.pipe)


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
        if saved is not None and not saved.lacks(self.name):
            state = saved.pipeline_state(self.name, self.description, kind=dali_tf.KIND,
                                         contents=self.contents)
            where = str(saved.state_file(self.name))
            self.check_node = saved.entry(self.name).get(dali_tf.CHECK_NODE) is True
            if data_contents.check(self.contents, saved.entry(self.name),
                                   str(saved.manifest_path), saved.inexact):
                saved.went_inexact()
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

    def capture(self) -> dict[str, Any]:
        return {"state": dali_dynamic.serialize(self.checkpoint, self.name)}


@dataclass(eq=False)
class RandomGenerators:
    """The global random generators (rng_state), an array of the checkpoint.

    :meth:`restore` only reads and checks the saved state (a damaged one is
    refused, naming its field) and stages it; :meth:`set_back` sets them at
    the loop's resume point (the Checkpointer's first read of its contents),
    once."""

    section: ClassVar[str] = ARRAYS
    name: str = rng_state.KEY
    staged: rng_state.Staged | None = None  # set back at the resume point, then None

    def restore(self, saved: SavedCheckpoint | None) -> None:
        state = saved.snapshot.arrays.get(self.name) if saved is not None else None
        self.staged = (rng_state.check(state, str(saved.manifest_path))
                       if state is not None else None)

    def set_back(self) -> None:
        """The resume point: the staged state set, once."""
        staged, self.staged = self.staged, None
        if staged is not None:
            staged.apply()

    def capture(self) -> dict[str, Any]:
        return rng_state.capture()


def _say_companion(step: int, log: batch_digests.CompanionLog, problem: str,
                   found: dict[str, list[list[str]]], unfinished: bool = False) -> None:
    """What a resume says of the companion file of the checkpoint at ``step``
    (``log``, read with ``problem``) when not all of it could be read. The
    file is made (empty) right after its save: missing, the digests of
    whatever batches followed were lost (said with where it was looked for);
    damaged, the batches past the digests read from it are not compared;
    empty after a checkpoint short of its run's total_steps (``unfinished``:
    a kill, not the run's end), nothing is compared."""
    companion = log.path
    if problem == batch_digests.MISSING:
        others = [str(d) for d in log.looked if companion is None or d != companion.parent]
        if not found:
            logger.info("no digests of the batches after the checkpoint at step %d were found "
                        "(%s is missing%s, and no later row of its run holds them): those "
                        "batches are not verified", step, companion,
                        f" (looked in {', '.join(others)} too)" if others else "")
    elif problem:
        read = ", ".join(f"{len(b)} of {name!r}" for name, b in found.items() if b)
        logger.warning("the digests of the batches after the checkpoint at step %d: %s %s "
                       "(digests read: %s), so %s are not verified", step, companion, problem,
                       read or "none", "the batches past those" if read else "those batches")
    elif not any(found.values()) and unfinished:  # killed: it compares nothing, said
        logger.info("no digest of a batch after the checkpoint at step %d is recorded in %s "
                    "(no batch followed it, or a kill came before the first one's digest was "
                    "written): no batch is compared", step, companion)


@dataclass(eq=False)
class BatchProof:
    """The batch digests (batch_digests.Recorder) of the streams registered
    with a Checkpointer: :meth:`restore` has the recorder compare the
    batches after the resumed checkpoint with the digests its run recorded;
    :meth:`capture` annotates each stream's entry with its digests since the
    last save (an :data:`ANNOTATION` named ``batches``)."""

    section: ClassVar[str] = ANNOTATION
    name: str = field(default=batch_digests.KEY, init=False)
    recorder: batch_digests.Recorder
    sources: dict[tuple[str, str], Any]  # the Checkpointer's registry: the pipelines' data
    readers: dict[str, tuple[str, str]]  # dynamic-mode stream -> (Checkpoint, reader)
    versions: Callable[[], dict[str, str]]  # the packages' versions now
    # the digests after checkpoint ``log id`` from the row its run recorded
    # after step ``step`` (under `dvc exp run`; else None)
    from_rows: Callable[[int, str], dict[str, list[list[str]]]] | None = None

    def restore(self, saved: SavedCheckpoint | None) -> None:
        """The digests of the batches the resumed checkpoint was followed by:
        kept beside it, else (an applied row on another machine) in the row
        its run recorded next."""
        if saved is None:
            return
        manifest = saved.snapshot.manifest
        log_id = batch_digests.log_id_of(manifest)
        if log_id is not None and not self.recorder.on:
            logger.warning("the batches after the checkpoint at step %d are not compared with "
                           "those the run it resumes produced (DVC_DALI_VERIFY_BATCHES=0): this "
                           "resume is not verified", saved.snapshot.step)
        if log_id is None and self.recorder.on and (manifest.get(PIPELINES)
                                                    or manifest.get("dynamic")):
            logger.info("the checkpoint at step %d holds no batch digests (saved with "
                        "DVC_DALI_VERIFY_BATCHES=0, or by a dvc-dali before them): the batches "
                        "after it are not compared; this resume is not verified",
                        saved.snapshot.step)
        if log_id is None or not self.recorder.on:
            return
        log = batch_digests.find_log([self.recorder.directory, *self.recorder.elsewhere],
                                     log_id)
        found, problem = log.found, log.problem
        if not found and self.from_rows is not None:
            found = self.from_rows(saved.snapshot.step, log_id)
            problem = "" if found else problem  # the row its run recorded next holds them
        held = batch_digests.streams_of(manifest)
        foreign = sorted(set(found) - held)
        if foreign and not problem:  # a companion file naming streams the checkpoint lacks
            problem = (f"names {', '.join(map(repr, foreign))}, which the checkpoint does not "
                       "hold")
        total = (manifest.get("run") or {}).get("total_steps")
        _say_companion(saved.snapshot.step, log, problem,
                       {n: b for n, b in found.items() if n not in foreign},
                       type(total) is int and saved.snapshot.step < total)  # noqa: E721
        self.recorder.resume(log_id, found, saved.snapshot.step, self._why(manifest),
                             str(saved.manifest_path), held,
                             log.path.parent if log.path and not log.looked else None)

    def _why(self, manifest: dict[str, Any]) -> Callable[[str], str]:
        """What changed since the checkpoint, for a stream's mismatch message
        (it holds the registry, not the Checkpointer)."""
        saved_versions = manifest.get("versions") or {}
        sources, versions = self.sources, self.versions

        def why(name: str) -> str:
            if name not in manifest[PIPELINES]:  # a dynamic-mode reader: no description
                return batch_digests.what_changed(saved_versions, versions(),
                                                  [batch_digests.UNDESCRIBED])
            entry = manifest[PIPELINES].get(name) or {}
            source = sources.get((PIPELINES, name))
            contents = getattr(source, "contents", None)
            data = data_contents.changed_in(contents, entry)
            causes = [batch_digests.TF_RANDOM] if isinstance(source, TfDataset) else []
            return batch_digests.what_changed(saved_versions, versions(), data, causes)

        return why

    def capture(self) -> dict[str, Any]:
        pipelines = [name for part, name in self.sources if part == PIPELINES]
        return batch_digests.records(self.recorder, pipelines, self.readers)
