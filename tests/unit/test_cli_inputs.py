"""What the `dvc-dali` command refuses in its arguments (dvc_dali/cli/inputs.py),
and git's reason as it is said: tables."""

from __future__ import annotations

import os

import pytest

from dvc_dali.cli import inputs
from dvc_dali.core.errors import ConfigError
from dvc_dali.reading.gitcmd import reason


@pytest.mark.parametrize("checkpoint, says", [
    ("checkpoint", ""),
    ("sub/ck", ""),
    ("/", "--checkpoint / is outside the DVC project"),
    ("../elsewhere", "--checkpoint ../elsewhere is outside the DVC project"),
    (".", "--checkpoint . is the DVC project itself"),
])
def test_checkpoint_must_lie_in_the_project(tmp_path, monkeypatch, checkpoint, says):
    monkeypatch.chdir(tmp_path)
    got = inputs.checkpoint_problem(checkpoint, str(tmp_path))
    assert got.startswith(says) and bool(got) == bool(says), got
    assert inputs.checkpoint_problem(checkpoint, None) == ""  # outside a project: nothing to say


@pytest.mark.parametrize("keep_last, keep_best, says", [
    (None, None, None),
    (3, "train/acc:max", None),
    (-3, None, "--keep-last=-3"),
    (0, None, "--keep-last=0"),
    (None, "garbage", "--keep-best='garbage'"),
    (None, "acc:maxx", "--keep-best='acc:maxx'"),
    (None, ":min", "--keep-best=':min'"),
])
def test_run_options_are_named_as_given(tmp_path, keep_last, keep_best, says):
    if says is None:
        assert inputs.run_options(keep_last, keep_best, "checkpoint", None) == (
            keep_last, keep_best)
    else:
        with pytest.raises(ConfigError, match="^" + says.replace("[", r"\[")):
            inputs.run_options(keep_last, keep_best, "checkpoint", str(tmp_path))


def test_a_program_that_cannot_start_is_named(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "plain.sh").write_text("echo\n")
    (tmp_path / "ok.sh").write_text("#!/bin/sh\n")
    (tmp_path / "ok.sh").chmod(0o755)
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    table = {
        "./ok.sh": "",
        "ok.sh": "no such command on PATH",  # a bare name is looked up on PATH only
        "sh": "",
        "./nope": "no such file in ",
        "./dangling": "no such file in ",
        str(tmp_path / "nope"): "no such file;",
        "./dir": "a directory, not a program",
        "./plain.sh": "not executable; `chmod +x ./plain.sh`",
    }
    for program, says in table.items():
        got = inputs.command_problem(program, os.defpath, str(tmp_path))
        assert (says in got) if says else got == "", (program, got)
        if says:
            assert got.startswith(f"{program!r} (the training command after --): "), got
    assert inputs.command_problem("ok.sh", str(tmp_path), str(tmp_path)) == ""


J = b'{"step": 2, "train": {"acc": 0.5}}'


@pytest.mark.parametrize("blobs, is_dir, says, refused", [
    ([J, None], False, "", False),
    ([b'{"loss": 1}'], False, "", False),
    ([None, None], False, "no row holds m.json (", True),
    ([None], True, "no row holds m.json, a directory here (", True),
    ([b"stages: {}\n"], False, "no row's m.json holds metrics: it is not JSON", True),
    ([b"\xff\x00"], False, "no row's m.json holds metrics: it is not JSON", True),
    ([b"[1]", None], False, "no row's m.json holds metrics: it is JSON, but not an object", True),
    ([b"[1]", b"{"], False, "no row's m.json holds metrics: it is JSON, but not an object", True),
    # a DVCLive file of the step alone: a metrics file, without a metric yet
    ([b'{"step": 3}'], False, "no row's m.json holds a metric: it holds no number", False),
    ([b'{"a": "x"}', b"{"], False, "no row's m.json holds a metric: it holds no number", False),
])
def test_metrics_file_verdict(blobs, is_dir, says, refused):
    got, refuses = inputs.metrics_problem("m.json", blobs, is_dir)
    assert got.startswith(says) and bool(got) == bool(says) and refuses == refused, got
    if says:
        assert got.endswith("default dvclive/metrics.json)"), got


@pytest.mark.parametrize("given, says", [
    ("origin", ""),
    ("https://example.invalid/r.git", ""),
    ("git@example.invalid:r.git", ""),
    ("here", ""),  # an existing path
    ("orign", "git remote 'orign': no remote of that name here (configured: origin, up)"),
    ("./gone", "git remote './gone': no such path"),
    ("/no/such/repo", "git remote '/no/such/repo': no such path"),
    ("-x", "git remote '-x': no remote of that name"),
])
def test_git_remote_verdict(tmp_path, given, says):
    (tmp_path / "here").mkdir()
    got = inputs.git_remote_problem(given, ["origin", "up"], str(tmp_path))
    assert got.startswith(says) and bool(got) == bool(says), got


@pytest.mark.parametrize("given, says", [
    ({"exp": None, "metrics_file": None}, ""),
    ({"exp": ["a", "b"], "git_remote": "origin"}, ""),
    ({"exp": ""}, "experiment name '' is empty"),
    ({"exp": ["a", "  "]}, "experiment name '  ' is empty"),
    ({"metrics_file": ""}, "--metrics-file '' is empty"),
    ({"git_remote": ""}, "git remote '' is empty"),
    ({"stage": " "}, "--stage ' ' is empty"),
    ({"dir": ""}, "directory '' is empty"),
    ({"checkpoint": ""}, "--checkpoint '' is empty"),
    ({"verify": "", "command": []}, ""),  # --verify '': the workspace's checkpoint
])
def test_blank_arguments(given, says):
    got = inputs.blank_problem(given)
    assert got.startswith(says) and bool(got) == bool(says), got


@pytest.mark.parametrize("stderr, said", [
    ("fatal: 'x' does not appear to be a git repository\nfatal: Could not read from remote "
     "repository.\n\nPlease make sure you have the correct access rights\nand the repository "
     "exists.\n", "'x' does not appear to be a git repository"),
    ("ssh: Could not resolve hostname h: Name or service not known\nfatal: Could not read "
     "from remote repository.\n", "ssh: Could not resolve hostname h: Name or service not known"),
    ("hint: see git help\nerror: failed to push some refs to 'x'\n",
     "failed to push some refs to 'x'"),
    ("", "no reason given"),
    ("fatal: " + "y" * 300, "y" * 157 + "..."),
])
def test_git_reason_is_one_short_line(stderr, said):
    assert reason(stderr) == said
