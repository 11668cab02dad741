"""The manifest's optional per-pipeline ``contents`` (data_contents.py):
checked when present, absent in older manifests."""

from __future__ import annotations

import copy

import pytest

from dvc_dali.format import manifest_schema
from dvc_dali.core.errors import CheckpointCorruptError

from tests.unit.test_manifest_schema import TODAY, WHERE

GOOD = {"reader.file_root": {"files": 2, "bytes": 10, "crc32": "0123abcd" "ffffffff"}}
FIELD = "pipelines.train.contents['reader.file_root']"


def with_contents(contents) -> dict:
    manifest = copy.deepcopy(TODAY)
    manifest["pipelines"]["train"]["contents"] = contents
    return manifest


def test_absent_and_present():
    manifest_schema.validate(copy.deepcopy(TODAY), WHERE)  # older manifests have none
    manifest_schema.validate(with_contents(GOOD), WHERE)


@pytest.mark.parametrize("record,field", [
    ({"files": 2, "bytes": 10, "crc32": "0123abcd"}, f"{FIELD}.crc32"),  # one digest short
    ({"files": 1, "bytes": 10, "crc32": "0123ABCD"}, f"{FIELD}.crc32"),  # not lowercase
    ({"files": -1, "bytes": 10, "crc32": ""}, f"{FIELD}.files"),
    ({"files": 0, "crc32": ""}, f"{FIELD}.bytes"),
    ("x", FIELD),
])
def test_bad_records_name_the_field(record, field):
    with pytest.raises(CheckpointCorruptError) as err:
        manifest_schema.validate(with_contents({"reader.file_root": record}), WHERE)
    assert err.value.field == field, str(err.value)
