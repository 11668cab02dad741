"""At a run's end, the params files are put back to those it trained with
(recording/run_start._put_params_back), only where another command changed
them."""

import logging
from contextlib import contextmanager

from dvc_dali.recording import run_start


@contextmanager
def said_lines():
    lines: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger("dvc_dali")
    log.addHandler(handler)
    try:
        yield lines
    finally:
        log.removeHandler(handler)


def _no_repo(tmp_path):
    """A directory that is there (a gone one is a killed queued run's, left
    alone) but holds no DVC repo: DVC's lock cannot be taken in it."""
    path = tmp_path / "no-repo"
    path.mkdir()
    return path


def test_unchanged_params_take_no_lock_and_say_nothing(tmp_path):
    """After a run failed on a full disk (DVC's lock file unwritable), each
    exit said "cannot put the params this run trained with back: [Errno 27]"
    though nothing needed putting back: the lock was taken first. Here the
    lock cannot be taken at all (no DVC repo)."""
    params = tmp_path / "params.yaml"
    params.write_bytes(b"train:\n  lr: 0.1\n")
    start = run_start.RunStart({str(params): params.read_bytes()})
    with said_lines() as lines:
        run_start._put_params_back(start, str(_no_repo(tmp_path)), 0.1)
    assert not [line for line in lines if "put back" in line or "cannot" in line], lines
    assert params.read_bytes() == b"train:\n  lr: 0.1\n"


def test_changed_params_that_cannot_be_put_back_are_named(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_bytes(b"train:\n  lr: 0.5\n")
    start = run_start.RunStart({str(params): b"train:\n  lr: 0.1\n"})
    with said_lines() as lines:
        run_start._put_params_back(start, str(_no_repo(tmp_path)), 0.1)
    said = "\n".join(lines)
    assert "params.yaml: changed by another command while this run trained, and cannot be " \
        "put back" in said and "DVC's own experiment of this run records the changed" in said
