"""The one Restorable contract: every capture is the manifest's value at
its place, and the manifest is assembled from them by one rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from dvc_dali.training import restorable


@dataclass
class _Entry:
    section: ClassVar[str] = restorable.PIPELINES
    name: str
    value: dict[str, Any]

    def restore(self, saved: Any) -> None:
        pass

    def capture(self) -> dict[str, Any]:
        return dict(self.value)


@dataclass
class _Note:
    section: ClassVar[str] = restorable.ANNOTATION
    name: str
    value: dict[str, Any]
    order: list[str]

    def restore(self, saved: Any) -> None:
        pass

    def capture(self) -> dict[str, Any]:
        self.order.append("note")
        return self.value


def test_an_annotation_sets_its_field_in_the_entries_captured_before_it():
    order: list[str] = []
    note = _Note("batches", {"pipelines": {"a": {"log": "x"}, "gone": {"log": "y"}},
                             "dynamic": {"d": {"r": 1}}}, order)
    parts = restorable.assemble([note, _Entry("a", {"state": b"s", "iter": 1})])
    assert parts[restorable.PIPELINES] == {"a": {"state": b"s", "iter": 1,
                                                 "batches": {"log": "x"}}}
    assert parts[restorable.DYNAMIC] == {} and parts[restorable.ARRAYS] == {}  # none captured


def test_a_field_written_twice_is_refused():
    note = _Note("iter", {"pipelines": {"a": 2}}, [])
    with pytest.raises(ValueError, match="pipelines.a.iter: written twice"):
        restorable.assemble([_Entry("a", {"iter": 1}), note])


def test_dynamic_mode_captures_its_entry_like_the_others(monkeypatch):
    from dvc_dali.dali import dali_dynamic

    monkeypatch.setattr(dali_dynamic, "serialize", lambda checkpoint, name: "{}")
    assert restorable.DynamicMode("dyn").capture() == {"state": "{}"}
