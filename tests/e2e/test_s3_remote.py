"""Rows pushed as they are recorded to an S3-compatible DVC remote (moto in
server mode, started here), and that remote going away mid-run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.dvc_project import git_init, run, template_project
from tests.helpers.preempt import preemptible_project, start, trainer_ready, weights
from tests.helpers.remotes import remote_rows
from tests.helpers.rows import exp_rows

pytest.importorskip("dvc_s3")
boto3 = pytest.importorskip("boto3")

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}
RUNNING = re.compile(r"Running on (http://127\.0\.0\.1:\d+)")


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server on a port it binds itself (port 0: no other test can
    take it between a look and a bind, so this module runs beside others);
    yields (endpoint, server process)."""
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    endpoint = None
    for line in server.stderr:  # werkzeug says where it listens once it does
        found = RUNNING.search(line)
        if found:
            endpoint = found.group(1)
            break
    assert endpoint, f"moto server ended (status {server.wait()})"
    # its request log goes on to stderr: read, or a full pipe would stop it
    threading.Thread(target=server.stderr.read, daemon=True).start()
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="dvc")
    yield endpoint, server
    server.terminate()
    server.wait()


def with_s3_remotes(project: Path, tmp_path: Path, endpoint: str,
                    auto_push: bool = True) -> Path:
    bare = tmp_path / "origin.git"
    run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], tmp_path)
    run(["git", "remote", "add", "origin", str(bare)], project)
    run(["dvc", "remote", "add", "-d", "s3", "s3://dvc/store"], project)
    run(["dvc", "remote", "modify", "s3", "endpointurl", endpoint], project)
    if auto_push:
        run(["dvc", "config", "exp.auto_push", "true"], project)
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "s3 remote"], project)
    run(["git", "push", "-q", "origin", "main"], project)
    return bare


def s3_missing(endpoint: str, bare: Path, sha: str) -> list[str]:
    import json

    import yaml

    client = boto3.client("s3", endpoint_url=endpoint)
    keys = {o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket="dvc")
            for o in page.get("Contents", [])}

    def key(md5: str) -> str:
        return f"store/files/md5/{md5[:2]}/{md5[2:]}"

    missing = []
    lock = yaml.safe_load(run(["git", "show", f"{sha}:dvc.lock"], bare).stdout)
    for entry in lock["stages"].values():
        for out in entry.get("outs", []):
            if out["path"] not in ("checkpoint", "model"):
                continue
            if key(out["md5"]) not in keys:
                missing.append(out["md5"])
            elif out["md5"].endswith(".dir"):
                listing = json.loads(client.get_object(Bucket="dvc", Key=key(out["md5"]))
                                     ["Body"].read())
                missing += [i["relpath"] for i in listing if key(i["md5"]) not in keys]
    return missing


def test_rows_reach_s3_as_recorded_and_resume_on_a_new_clone(tmp_path, s3):
    endpoint, _ = s3
    (tmp_path / "ref").mkdir()
    reference = template_project(tmp_path / "ref")
    run(["dvc", "exp", "run", "-n", "ref"], reference)
    project = preemptible_project(tmp_path)
    bare = with_s3_remotes(project, tmp_path, endpoint)
    proc = start(project, "-n", "a", "-S", "train.checkpoint_every=5", env={"PREEMPT_AT": "13"})
    trainer_ready(project, proc)
    while "a-step10" not in remote_rows(bare):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    for name, sha in remote_rows(bare).items():
        assert s3_missing(endpoint, bare, sha) == [], name
    fresh = tmp_path / "fresh"
    run(["git", "clone", "-q", str(bare), str(fresh)], tmp_path)
    git_init(fresh)
    run(["dvc", "exp", "pull", "origin", "a-step10"], fresh)
    run(["dvc", "exp", "apply", "a-step10"], fresh)
    again = run(["dvc", "exp", "run", "-S", "train.checkpoint_every=5"], fresh)
    assert "resuming at step 10" in again.stdout + again.stderr
    assert weights(fresh) == weights(reference)


def test_an_s3_remote_that_goes_away_never_stops_training(tmp_path, s3):
    endpoint, server = s3
    project = preemptible_project(tmp_path)
    bare = with_s3_remotes(project, tmp_path, endpoint)
    proc = start(project, "-n", "a", "-S", "train.checkpoint_every=5", env={
        "PREEMPT_AT": "12", "AWS_MAX_ATTEMPTS": "1", "DVC_DALI_PUSH_GRACE": "3"})
    trainer_ready(project, proc)
    while "a-step10" not in remote_rows(bare):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    server.terminate()  # connections refused from now on
    server.wait()
    os.kill(int((project / "preempt-ready").read_text()), signal.SIGUSR1)
    out = proc.communicate()[0]
    # the preemption row is recorded, not pushed, and says how to push it
    assert "step 12 is kept as row a-step12, NOT pushed to origin" in out, out
    assert "push them with `dvc-dali push origin a`" in out, out
    assert {r for r in exp_rows(project) if "-step" in r} == {"a-step5", "a-step10",
                                                              "a-step12"}
    assert set(remote_rows(bare)) == {"a-step5", "a-step10"}


def test_dvc_dali_push_to_an_s3_remote_that_is_down_says_one_line(tmp_path, s3):
    """Python's "RuntimeWarning: coroutine 'S3FileSystem._exists' was never
    awaited" (s3fs's, with a source line and a tracemalloc hint) came before
    the one line saying why nothing was pushed (found by a sweep; it takes a
    few rows' files)."""
    endpoint, server = s3
    project = template_project(tmp_path, steps=12)
    bare = with_s3_remotes(project, tmp_path, endpoint, auto_push=False)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=2"], project)
    server.terminate()  # connections refused from now on
    server.wait()
    said = run(["dvc-dali", "push", "origin", "a"], project, check=False)
    assert said.returncode == 1 and remote_rows(bare) == {}, said.stderr
    assert said.stdout == "" and said.stderr.startswith("dvc-dali push: dvc push of 7 row(s) "
                                                        "failed: Could not connect to the "
                                                        "endpoint URL"), said.stderr
    assert len(said.stderr.splitlines()) == 1, said.stderr


def _pushed_then_cloned(tmp_path: Path, endpoint: str) -> tuple[Path, Path]:
    """Run a (rows a-step2, a-step4) pushed with its data to the S3 remote,
    and a fresh clone of origin; (project, clone)."""
    project = template_project(tmp_path, steps=4)
    bare = with_s3_remotes(project, tmp_path, endpoint, auto_push=False)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=2"], project)
    run(["dvc-dali", "push", "origin", "a"], project)
    fresh = tmp_path / "fresh"
    run(["git", "clone", "-q", str(bare), str(fresh)], tmp_path)
    git_init(fresh)
    return project, fresh


def test_dvc_dali_pull_from_an_s3_remote_that_is_down_says_it_cannot_reach_it(tmp_path, s3):
    """DVC's own "ERROR: failed to connect to s3 (dvc/store/files/md5) - Could not
    connect..." came before the one line, which then said the rows were "not
    on the DVC remote" and to push them from the recording machine, though
    the remote was only down (found by a sweep)."""
    endpoint, server = s3
    project, fresh = _pushed_then_cloned(tmp_path, endpoint)
    server.terminate()  # connections refused from now on
    server.wait()
    said = run(["dvc-dali", "pull", "origin", "a"], fresh, check=False,
               env={"AWS_MAX_ATTEMPTS": "1"})
    assert said.returncode == 1 and said.stdout == "", said.stderr
    assert len(said.stderr.splitlines()) == 1, said.stderr
    assert said.stderr.startswith("dvc-dali pull: NOT pulled from origin: cannot reach the "
                                  "DVC remote s3"), said.stderr
    assert "not on the DVC remote" not in said.stderr and "push their" not in said.stderr
    assert not [r for r in exp_rows(fresh) if "-step" in r]
    # the data already in the local cache (a shared one): the rows come, said once
    run(["dvc", "cache", "dir", "--local", str(project / ".dvc" / "cache")], fresh)
    said = run(["dvc-dali", "pull", "origin", "a"], fresh, check=False,
               env={"AWS_MAX_ATTEMPTS": "1"})
    assert said.returncode == 0 and said.stderr == "", said.stderr
    assert {r for r in exp_rows(fresh) if "-step" in r} == {"a-step2", "a-step4"}
