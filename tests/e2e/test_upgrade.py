"""A project that lives across an upgrade of dvc-dali: what an older release
left on disk, resumed by this one under real `dvc exp run`.

The older release's form is made from this one's by the one change between
them that matters here, not by installing it (a release is a commit, not a
package on an index): dvc-dali up to a998e95 wrote each output's batch
digest unnamed, ``<dtype>/<CRC of repr(tl.shape())>/c<CRC of the bytes>``,
where this one writes a dense batch's ``<dtype>/<CRC of "<n>x<shape>">/crc32:
<CRC of the bytes>`` (observed: a4ef8da's example run and this one's, same
batches, below). Resuming such a run refused the exact batches ("sample shapes
differ"); found by sweep V.
"""

from __future__ import annotations

import re
import sys
import zlib
from pathlib import Path

import pytest

from tests.helpers.dvc_project import make_project, run
from tests.helpers.rows import exp_rows

KILL = "DVC_DALI_EXAMPLE_KILL_AT_STEP"
COMPANION = Path(".dvc/tmp/dvc-dali/batches")
# The example's batch: 32 float images 16x16x1 and 32 int32 labels of shape (1,).
BATCH, SAMPLES = 32, {"float": (16, 16, 1), "int32": (1,)}


def _crc(text: str) -> str:
    return f"{zlib.crc32(text.encode()):08x}"


# this release's shapes field of a dense batch -> the one dvc-dali a4ef8da wrote
OLDER = {(dtype, _crc(f"{BATCH}x{shape}")): _crc(repr([shape] * BATCH))
         for dtype, shape in SAMPLES.items()}


def _as_older(line: str) -> str:
    """A companion line's digests as dvc-dali before named digests wrote them."""
    for (dtype, now), then in OLDER.items():
        line = line.replace(f'"{dtype}/{now}/crc32:', f'"{dtype}/{then}/c')
    return line


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """The example killed at step 35 (its row of step 30 recorded, 5 batches
    after it digested), its companion log rewritten as the older release's."""
    project = make_project(tmp_path_factory.mktemp("upgrade"), example=True, prepared=True)
    out = run(["dvc", "exp", "run", "-n", "old"], project, check=False, env={KILL: "35"})
    assert out.returncode != 0 and "old-step30" in exp_rows(project)
    logs = sorted((project / COMPANION).glob("*.jsonl"))
    assert logs
    for log in logs:
        text = log.read_text()
        older = "\n".join(_as_older(line) for line in text.split("\n"))
        assert "/crc32:" not in older, text[:300]  # the example's batches are still these
        log.write_text(older)
    return project


def test_older_batch_digests_are_not_verified_and_other_bytes_still_refused(killed):
    verify = run([sys.executable, "-m", "dvc_dali.cli", "doctor", "--verify"], killed,
                 check=False)
    assert "sample shapes differ" not in verify.stdout + verify.stderr
    # an older digest of other bytes is a difference whatever its shapes field
    logs = sorted((killed / COMPANION).glob("*.jsonl"))
    kept = {log: log.read_text() for log in logs}
    for log, text in kept.items():  # batch 1's first output
        log.write_text(re.sub(r'/c[0-9a-f]{8}"', '/c00000000"', text, count=1))
    refused = run(["dvc", "exp", "run"], killed, check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "output 0: same dtype, other bytes" in said, said
    for log, text in kept.items():
        log.write_text(text)
    resumed = run(["dvc", "exp", "run"], killed)
    said = resumed.stdout + resumed.stderr
    assert "resuming from step 30" in said
    assert "BatchMismatchError" not in said and "are those the run it resumes" not in said
    assert ("batches 1-5 not verified (recorded by an older dvc-dali, which wrote sample "
            "shapes another way); so this resume is not proven exact") in said, said
    assert {"old-step40", "old-step50", "old-step60"} <= set(exp_rows(killed))
