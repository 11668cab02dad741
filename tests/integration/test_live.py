"""Checkpointer.live's DVCLive at each checkpoint: where Studio is not
configured, DVCLive's gathering of the data it would post there (every
metrics file parsed whole at each ``next_step``, a cost that grows with the
history) is skipped, and the metrics are written as before; where Studio is
configured (a real HTTP server on this machine standing in for it), the
data is gathered and posted as DVCLive does. Its writes wait for an
asynchronous checkpoint in flight."""

from __future__ import annotations

import gc
import os
import json
import shutil
import subprocess
import sys
import threading
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("dvclive")

import dvclive.live  # noqa: E402
import dvclive.vscode  # noqa: E402
import numpy as np  # noqa: E402

import dvc_dali  # noqa: E402
from dvc_dali.integrations.live import resume_live  # noqa: E402

from tests.helpers import child_env  # noqa: E402


@pytest.fixture
def parsed(monkeypatch):
    """How many times DVCLive parsed its metrics files for Studio (its own
    function, called through)."""
    calls = []
    real = dvclive.live.parse_metrics

    def counting(live):
        calls.append(1)
        return real(live)

    monkeypatch.setattr(dvclive.live, "parse_metrics", counting)
    return calls


def _log(live, steps: int) -> None:
    for step in range(steps):
        live.log_metric("train/loss", 1.0 / (step + 1))
        live.next_step()


def test_without_studio_nothing_is_gathered_and_the_metrics_are_written(
        tmp_path, monkeypatch, parsed):
    monkeypatch.chdir(tmp_path)
    for var in ("DVC_STUDIO_TOKEN", "STUDIO_TOKEN", "DVC_STUDIO_URL", "STUDIO_REPO_URL"):
        monkeypatch.delenv(var, raising=False)
    live = resume_live(0, False, "dvclive")
    _log(live, 3)
    live.end()
    assert parsed == [] and live._studio_queue is None  # noqa: SLF001
    assert json.loads((tmp_path / "dvclive" / "metrics.json").read_text())["step"] == 2
    rows = (tmp_path / "dvclive" / "plots" / "metrics" / "train" / "loss.tsv").read_text()
    assert rows.splitlines()[1:] == ["0\t1.0", "1\t0.5", "2\t0.3333333333333333"]


class _Studio(BaseHTTPRequestHandler):
    events: list[str] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.events.append(body.get("type"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_with_studio_the_data_is_gathered_and_posted(tmp_path, monkeypatch, parsed):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Studio)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                        "--allow-empty", "-m", "init"], cwd=tmp_path, check=True)
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("DVC_STUDIO_TOKEN", "token")
        monkeypatch.setenv("DVC_STUDIO_URL", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("STUDIO_REPO_URL", "https://example.com/project.git")
        live = resume_live(0, False, "dvclive")
        _log(live, 2)
        live.end()
    finally:
        server.shutdown()
    assert len(parsed) >= 2, parsed
    assert "data" in _Studio.events and "start" in _Studio.events, _Studio.events


def test_its_writes_wait_for_the_asynchronous_checkpoint_in_flight(tmp_path, monkeypatch):
    """`next_step` after an asynchronous `make_checkpoint` (a large array:
    still being written) waits for it, as `ck.wait()` would; a Live kept
    does not keep its Checkpointer (and so its directory) alive."""
    monkeypatch.chdir(tmp_path)
    ck = dvc_dali.Checkpointer(tmp_path / "ck", asynchronous=True, rng=False)
    live = ck.live()
    ck.make_checkpoint(1, arrays={"big": np.ones(20_000_000)})
    live.log_metric("train/loss", 0.5)  # appends to its .tsv at once
    assert "wait_s" in ck.timings  # waited (and took the one in flight)
    live.next_step()
    assert ck.make_checkpoint(2, arrays={"w": np.ones(2)}) is None
    ck.close()
    kept = weakref.ref(ck)
    del ck
    gc.collect()
    assert kept() is None
    live.log_metric("train/loss", 0.25)
    live.next_step()  # its Checkpointer gone: written as DVCLive writes
    assert json.loads((tmp_path / "dvclive/metrics.json").read_text())["step"] == 1


def test_another_threads_write_waits_and_leaves_the_failure_to_the_training_thread(
        tmp_path, monkeypatch):
    """DVCLive's system monitor logs from a thread of its own: its writes
    wait for the checkpoint in flight too, and a checkpoint that failed is
    still raised by the training thread's next call, not in that thread."""
    monkeypatch.chdir(tmp_path)
    ck = dvc_dali.Checkpointer(tmp_path / "ck", asynchronous=True, rng=False)
    live = ck.live()
    raised = []

    def monitor():
        try:
            live.log_metric("system/cpu", 1.0, timestamp=True)
        except Exception as exc:  # noqa: BLE001 (what the thread got is the point)
            raised.append(exc)

    ck.make_checkpoint(1, arrays={"big": np.ones(20_000_000)})
    writer = threading.Thread(target=monitor)
    writer.start()
    writer.join()
    assert dvc_dali.load(tmp_path / "ck").step == 1  # written before the thread wrote
    ck.wait()
    shutil.rmtree(tmp_path / "ck")
    (tmp_path / "ck").write_text("")  # the next write fails
    ck.make_checkpoint(2, arrays={"w": np.ones(2)})
    writer = threading.Thread(target=monitor)
    writer.start()
    writer.join()
    assert raised == []
    with pytest.raises(dvc_dali.CheckpointWriteError):
        ck.wait()


@pytest.mark.parametrize("summary", ["kept", "lost"])
def test_a_resume_keeps_a_text_metric(tmp_path, monkeypatch, summary):
    """DVCLive's log_metric takes text too; every resume of a run that logged
    one failed (float() of its last value in the history), summary or not."""
    from dvclive import Live

    from dvc_dali.integrations.live import resume_live

    monkeypatch.chdir(tmp_path)
    with Live("dvclive", save_dvc_exp=False, dvcyaml=False) as live:
        for step in range(4):
            live.log_metric("train/loss", 1.0 / (step + 1))
            live.log_metric("note", "sgd")
            live.next_step()
    if summary == "lost":  # rebuilt from the history then
        (tmp_path / "dvclive" / "metrics.json").unlink()
    live = resume_live(2, True, dir="dvclive")
    history = (tmp_path / "dvclive" / "plots" / "metrics" / "note.tsv").read_text()
    assert [line.split("\t")[0] for line in history.splitlines()[1:]] == ["0", "1", "2"]
    got = json.loads((tmp_path / "dvclive" / "metrics.json").read_text())
    assert got["note"] == "sgd" and got["step"] in (2, 3), got
    assert live.step == 2


LIVE_TOO_BIG = """
import resource, signal, sys, numpy as np, dvc_dali
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
ck = dvc_dali.Checkpointer(sys.argv[1], rng=False)
live = ck.live()
live.log_metric("train/loss", 0.5)
live.next_step()
ck.save(1, arrays={"w": np.ones(2)})
resource.setrlimit(resource.RLIMIT_FSIZE, (20, 20))  # DVCLive's files cannot grow
live.log_metric("train/loss", 0.25)
"""


def test_a_dvclive_file_that_cannot_be_written_is_one_line(tmp_path):
    """It ended the run with DVCLive's OSError traceback (found by a sweep)."""
    proc = subprocess.run([sys.executable, "-c", LIVE_TOO_BIG, str(tmp_path / "ck")],
                          cwd=tmp_path, capture_output=True, text=True, env=child_env())
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in said, said
    assert ("RecordError: dvclive: DVCLive's log_metric() could not write there (File too "
            "large), so the run stops before its next row") in said, said
    assert dvc_dali.Checkpointer(tmp_path / "ck").step == 1


def test_each_step_signals_vs_code_as_dvclive_does_without_an_fsync(tmp_path, monkeypatch):
    """DVCLive's next_step tells VS Code's extension a step is done through
    .dvc/tmp/exps/run/DVCLIVE_STEP_COMPLETED and fsyncs it on the training
    thread; this Live writes the same file at the same moment, unsynced."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "init"], cwd=tmp_path, check=True)
    (tmp_path / ".dvc").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    synced = []
    real_fsync = dvclive.vscode.os.fsync

    def counting(fd):
        synced.append(fd)
        return real_fsync(fd)

    monkeypatch.setattr(dvclive.vscode.os, "fsync", counting)
    signal = tmp_path / ".dvc" / "tmp" / "exps" / "run" / "DVCLIVE_STEP_COMPLETED"
    theirs = dvclive.Live(dir="theirs", save_dvc_exp=False, dvcyaml=False)
    _log(theirs, 1)
    assert synced and json.loads(signal.read_text()) == {"pid": os.getpid(), "step": 0}
    signal.unlink()
    synced.clear()
    live = resume_live(4, True, "dvclive")
    live.log_metric("train/loss", 0.5)
    live.next_step()
    assert json.loads(signal.read_text()) == {"pid": os.getpid(), "step": 4}
    assert live.step == 5 and synced == []
    assert json.loads((tmp_path / "dvclive" / "metrics.json").read_text())["step"] == 4
    live.end()
    assert not signal.exists()  # DVCLive's end() removes it, as before


def test_another_dvclives_next_step_is_kept(tmp_path, monkeypatch):
    """Where DVCLive's next_step no longer signals through the function this
    was written against, its own next_step is left as it is."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dvclive.live, "mark_dvclive_step_completed", lambda step: None)
    live = resume_live(0, False, "dvclive")
    assert "next_step" not in vars(live)
