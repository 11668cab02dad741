"""dvc_dali.cli.migrate as tables: dvc.yaml text in, dvc.yaml text out.

Every row is also checked for the rules that hold for any input: rewriting
twice changes nothing more, the result needs no further change, DVC's own
schema accepts it, and a file with nothing to do comes back byte for byte.
"""

from __future__ import annotations

import textwrap

import pytest

from dvc_dali.cli.migrate import (
    Change,
    MigrateError,
    check_project,
    main,
    named_files,
    plan,
    rewrite,
    wrap_command,
)

GUARDED = 'import os\nif os.environ.get("DVC_CHECKPOINT"):\n    train()\n'
PLAIN = "from dvc_dali import make_checkpoint\nmake_checkpoint()\n"
SCRIPTS = {"train.py": GUARDED, "plain.py": PLAIN, "src/train.py": GUARDED,
           "pkg/train.py": GUARDED, "run.sh": "touch $DVC_ROOT/.dvc/tmp/DVC_CHECKPOINT\n"}
RUN = "dvc-dali run --checkpoint checkpoint -- "


def y(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# id, dvc.yaml before, after (None: unchanged, byte for byte)
ROWS = [
    ("the DVC 2 stage, comments and order kept", y("""
        # training pipeline
        stages:
          train:
            cmd: python plain.py   # the loop
            deps: [plain.py]
            outs:
              - checkpoint:
                  checkpoint: true   # DVC 2 recorded these
                  cache: true
              - model
            metrics:
              - metrics.json:
                  cache: false
        # the end
        """), y("""
        # training pipeline
        stages:
          train:
            cmd: python plain.py   # the loop
            deps: [plain.py]
            outs:
              - checkpoint:
                  checkpoint: true   # DVC 2 recorded these
                  persist: true
                  cache: true
              - model
            metrics:
              - metrics.json:
                  cache: false
            always_changed: true
        # the end
        """)),
    ("flow options", y("""
        stages:
          train:
            cmd: python plain.py
            outs:
              - checkpoint: {checkpoint: true}
        """), y("""
        stages:
          train:
            cmd: python plain.py
            outs:
              - checkpoint: {checkpoint: true, persist: true}
            always_changed: true
        """)),
    ("no checkpoint output: nothing to do", y("""
        stages:
          prepare:
            cmd: python prep.py   # no checkpoint here
            outs:
              - data
              - model: {persist: true}
        """), None),
    ("no stages at all", "plots:\n  - metrics.json\n", None),
    ("empty file", "", None),
    ("already migrated: nothing to do", y("""
        stages:
          train:
            cmd: python plain.py
            outs:
              - checkpoint:
                  persist: true
                  checkpoint: true
            always_changed: true
        """), None),
    ("persist: false is set to true, its comment kept", y("""
        stages:
          train:
            cmd: python plain.py
            always_changed: true
            outs:
              - checkpoint:
                  checkpoint: true
                  persist: false   # was off
        """), y("""
        stages:
          train:
            cmd: python plain.py
            always_changed: true
            outs:
              - checkpoint:
                  checkpoint: true
                  persist: true   # was off
        """)),
    ("always_changed: false is set to true", y("""
        stages:
          train:
            cmd: python plain.py
            always_changed: False
            outs: [{checkpoint: {persist: true, checkpoint: true}}]
        """), y("""
        stages:
          train:
            cmd: python plain.py
            always_changed: true
            outs: [{checkpoint: {persist: true, checkpoint: true}}]
        """)),
    ("several stages: only those needing it change", y("""
        stages:
          prepare:
            cmd: python prep.py
            outs: [data]
          a:
            cmd: python plain.py a
            outs:
              - ck-a:
                  checkpoint: true
          # b is done already
          b:
            cmd: python plain.py b
            outs:
              - ck-b: {checkpoint: true, persist: true}
            always_changed: true
          c:
            cmd: python plain.py c
            metrics:
              - ck-c.json:
                  checkpoint: true
                  cache: false
        """), y("""
        stages:
          prepare:
            cmd: python prep.py
            outs: [data]
          a:
            cmd: python plain.py a
            outs:
              - ck-a:
                  checkpoint: true
                  persist: true
            always_changed: true
          # b is done already
          b:
            cmd: python plain.py b
            outs:
              - ck-b: {checkpoint: true, persist: true}
            always_changed: true
          c:
            cmd: python plain.py c
            metrics:
              - ck-c.json:
                  checkpoint: true
                  persist: true
                  cache: false
            always_changed: true
        """)),
    ("a flow stage", y("""
        stages:
          train: {cmd: python plain.py, outs: [{ck: {checkpoint: true}}]}
        """), y("""
        stages:
          train: {cmd: python plain.py, outs: [{ck: {checkpoint: true, persist: true}}], always_changed: true}
        """)),  # noqa: E501
    ("foreach stage: its `do` is migrated", y("""
        stages:
          train:
            foreach: [a, b]
            do:
              cmd: python plain.py ${item}
              outs:
                - ck-${item}:
                    checkpoint: true
        """), y("""
        stages:
          train:
            foreach: [a, b]
            do:
              cmd: python plain.py ${item}
              outs:
                - ck-${item}:
                    checkpoint: true
                    persist: true
              always_changed: true
        """)),
    ("matrix stage", y("""
        stages:
          train:
            matrix:
              lr: [0.1, 0.2]
            cmd: python plain.py ${item.lr}
            outs:
              - ck-${item.lr}: {checkpoint: true}
        """), y("""
        stages:
          train:
            matrix:
              lr: [0.1, 0.2]
            cmd: python plain.py ${item.lr}
            outs:
              - ck-${item.lr}: {checkpoint: true, persist: true}
            always_changed: true
        """)),
    ("CRLF line breaks and no final line break", y("""
        stages:
          train:
            cmd: python plain.py
            outs:
              - checkpoint:
                  checkpoint: true""").replace("\n", "\r\n"), y("""
        stages:
          train:
            cmd: python plain.py
            outs:
              - checkpoint:
                  checkpoint: true
                  persist: true
            always_changed: true""").replace("\n", "\r\n")),
    ("other indentation kept", y("""
        stages:
            train:
                cmd: python plain.py
                outs:
                -   checkpoint:
                        checkpoint: true
        """), y("""
        stages:
            train:
                cmd: python plain.py
                outs:
                -   checkpoint:
                        checkpoint: true
                        persist: true
                always_changed: true
        """)),
    ("non-ASCII text before the edits", y("""
        # Trainiert das Modell ✓ — 日本語
        stages:
          train:
            cmd: python plain.py --name é   # ü
            outs:
              - ck: {checkpoint: true}
        """), y("""
        # Trainiert das Modell ✓ — 日本語
        stages:
          train:
            cmd: python plain.py --name é   # ü
            outs:
              - ck: {checkpoint: true, persist: true}
            always_changed: true
        """)),
    ("outputs shared through an alias: edited once", y("""
        stages:
          a:
            cmd: python plain.py a
            outs: &outs
              - ck: {checkpoint: true}
          b:
            cmd: python plain.py b
            outs: *outs
        """), y("""
        stages:
          a:
            cmd: python plain.py a
            outs: &outs
              - ck: {checkpoint: true, persist: true}
            always_changed: true
          b:
            cmd: python plain.py b
            outs: *outs
            always_changed: true
        """)),
    # Scripts that train only when DVC_CHECKPOINT is set: the command is wrapped.
    ("DVC_CHECKPOINT-guarded script: command wrapped once", y("""
        stages:
          train:
            cmd: python train.py --epochs 3   # DVC 2 set DVC_CHECKPOINT
            deps: [train.py]
            outs:
              - checkpoint: {checkpoint: true}
        """), y(f"""
        stages:
          train:
            cmd: {RUN}python train.py --epochs 3   # DVC 2 set DVC_CHECKPOINT
            deps: [train.py]
            outs:
              - checkpoint: {{checkpoint: true, persist: true}}
            always_changed: true
        """)),
    ("guarded, already wrapped: not again", y(f"""
        stages:
          train:
            cmd: {RUN}python train.py
            outs:
              - checkpoint: {{checkpoint: true}}
        """), y(f"""
        stages:
          train:
            cmd: {RUN}python train.py
            outs:
              - checkpoint: {{checkpoint: true, persist: true}}
            always_changed: true
        """)),
    ("guarded, quoted command, wdir", y("""
        stages:
          train:
            wdir: src
            cmd: 'python train.py --name "it''s"'
            outs:
              - ../checkpoint: {checkpoint: true, persist: true}
            always_changed: true
        """), y("""
        stages:
          train:
            wdir: src
            cmd: 'dvc-dali run --checkpoint ../checkpoint -- python train.py --name "it''s"'
            outs:
              - ../checkpoint: {checkpoint: true, persist: true}
            always_changed: true
        """)),
    ("guarded, shell operators: under sh -c; env assignments in front", y("""
        stages:
          train:
            cmd:
              - python prep.py
              - python train.py > log.txt
              - SEED=1 python train.py
            outs:
              - checkpoint: {checkpoint: true, persist: true}
            always_changed: true
        """), y(f"""
        stages:
          train:
            cmd:
              - python prep.py
              - {RUN}sh -c 'python train.py > log.txt'
              - SEED=1 {RUN}python train.py
            outs:
              - checkpoint: {{checkpoint: true, persist: true}}
            always_changed: true
        """)),
    ("guarded, multi-line command: the guarded line wrapped", y("""
        stages:
          train:
            cmd: |
              python prep.py
              bash run.sh
            outs:
              - checkpoint: {checkpoint: true, persist: true}
            always_changed: true
        """), y(f"""
        stages:
          train:
            cmd: |
              python prep.py
              {RUN}bash run.sh
            outs:
              - checkpoint: {{checkpoint: true, persist: true}}
            always_changed: true
        """)),
    ("guarded through `-m pkg.train`", y("""
        stages:
          train:
            cmd: python -m pkg.train
            outs:
              - checkpoint: {checkpoint: true, persist: true}
            always_changed: true
        """), y(f"""
        stages:
          train:
            cmd: {RUN}python -m pkg.train
            outs:
              - checkpoint: {{checkpoint: true, persist: true}}
            always_changed: true
        """)),
    ("guarded dependency only: the whole command wrapped", y("""
        stages:
          train:
            cmd: ./train
            deps:
              - src/train.py
              - data
            outs:
              - checkpoint: {checkpoint: true, persist: true}
            always_changed: true
        """), y(f"""
        stages:
          train:
            cmd: {RUN}./train
            deps:
              - src/train.py
              - data
            outs:
              - checkpoint: {{checkpoint: true, persist: true}}
            always_changed: true
        """)),
    ("guarded script in a stage without a checkpoint output: untouched", y("""
        stages:
          train:
            cmd: python train.py
            outs: [model]
        """), None),
    ("folded command: rewritten as one double-quoted line", y("""
        stages:
          train:
            cmd: >
              python train.py
              --epochs 3
            outs:
              - checkpoint: {checkpoint: true, persist: true}
            always_changed: true
        """), y(f"""
        stages:
          train:
            cmd: "{RUN}python train.py --epochs 3\\n"
            outs:
              - checkpoint: {{checkpoint: true, persist: true}}
            always_changed: true
        """)),
]


def _schema_ok(text: str) -> None:
    import voluptuous
    from dvc.schema import MULTI_STAGE_SCHEMA
    from ruamel.yaml import YAML

    data = YAML(typ="safe").load(text)
    if data:
        voluptuous.Schema(MULTI_STAGE_SCHEMA)(data)


@pytest.mark.parametrize("before, after", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_rewrite(before, after):
    files = SCRIPTS.get
    result = rewrite(before, files)
    assert result == (before if after is None else after)
    assert rewrite(result, files) == result  # idempotent
    assert plan(result, files) == []
    assert bool(plan(before, files)) == (after is not None)
    _schema_ok(result)


def test_changes_name_stage_output_and_what_is_added():
    text = y("""
        stages:
          train:
            cmd: python train.py
            outs:
              - ck: {checkpoint: true}
        """)
    assert plan(text, SCRIPTS.get) == [
        Change("train", "ck", "persist: true", "DVC 3 deletes the output before every run, "
               "so training would never resume"),
        Change("train", "ck", "always_changed: true", "DVC 3 skips a stage whose dependencies "
               "did not change instead of resuming it"),
        Change("train", "ck", "cmd: dvc-dali run --checkpoint ck -- python train.py",
               "train.py trains only when DVC_CHECKPOINT is set, which DVC 3 never sets; "
               "`dvc-dali run` sets it and records each checkpoint"),
    ]
    # Without a reader nothing is read: the command is left alone.
    assert [c.adds for c in plan(text)] == ["persist: true", "always_changed: true"]


@pytest.mark.parametrize("line, want", [
    ("python train.py", RUN + "python train.py"),
    ("  python train.py --lr 0.1", "  " + RUN + "python train.py --lr 0.1"),
    ("A=1 B='x y' python t.py", "A=1 B='x y' " + RUN + "python t.py"),
    ("python t.py && echo done", RUN + "sh -c 'python t.py && echo done'"),
    ("python t.py 2>&1 | tee log", RUN + "sh -c 'python t.py 2>&1 | tee log'"),
    ("python t.py --seed $(cat seed)", RUN + "sh -c 'python t.py --seed $(cat seed)'"),
    ("python 'unbalanced", RUN + "sh -c 'python '\"'\"'unbalanced'"),
])
def test_wrap_command(line, want):
    assert wrap_command(line, "checkpoint") == want


def test_wrap_command_quotes_the_output():
    assert wrap_command("./t", "my ckpt") == "dvc-dali run --checkpoint 'my ckpt' -- ./t"


@pytest.mark.parametrize("line, want", [
    ("python train.py --cfg=c.yaml data", ["python", "train.py", "c.yaml", "data"]),
    ("python -m pkg.train", ["python", "pkg/train.py", "pkg/train/__main__.py"]),
    ("bash run.sh # comment", ["bash", "run.sh"]),
    ("python 'open", ["python", "'open"]),
])
def test_named_files(line, want):
    assert named_files(line) == want


@pytest.mark.parametrize("text, where", [
    ("stages:\n  train: [1\n", "line 3, column 1"),
    ("stages:\n  a: 1\n  a: 2\n", "line 3, column 3"),
    ("stages: {a: b\n", "line 2"),
])
def test_invalid_yaml_names_the_file_and_place(text, where):
    with pytest.raises(MigrateError) as err:
        plan(text, name="sub/dvc.yaml")
    assert str(err.value).startswith("sub/dvc.yaml: not valid YAML at " + where)


ANCHOR = "x-common: &ck\n  checkpoint: true\n  persist: false\nstages:\n  train:\n" \
         "    cmd: python train.py\n    outs:\n      - model.pt:\n"


@pytest.mark.parametrize("options", [
    "          <<: *ck\n",  # checkpoint and persist merged in from the anchor
    "          <<: {checkpoint: true}\n",
])
def test_options_merged_in_by_a_merge_key_are_refused_by_name(options):
    """A key merged in (``<<``) has no place in the output's own options to
    edit beside: one line saying so and what to do, not a traceback."""
    with pytest.raises(MigrateError) as err:
        plan(ANCHOR + options, name="dvc.yaml")
    assert str(err.value).startswith("dvc.yaml: '")
    assert "through a YAML merge key ('<<: *anchor')" in str(err.value)
    assert "run `dvc-dali migrate` again" in str(err.value)


def test_main_check_then_rewrite(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = "stages:\n  t:\n    cmd: python t.py\n    outs:\n      - c: {checkpoint: true}\n"
    (tmp_path / "dvc.yaml").write_text(before)
    assert main("dvc.yaml", check=True) == 1
    out = capsys.readouterr().out
    assert "dvc.yaml: needs stage 't', output 'c': persist: true" in out
    assert "run `dvc-dali migrate dvc.yaml`" in out
    assert (tmp_path / "dvc.yaml").read_text() == before  # --check writes nothing
    assert main(".", check=False) == 0  # a directory: its dvc.yaml
    out = capsys.readouterr().out
    assert "git diff dvc.yaml" in out and "always_changed: true" in out
    assert main("dvc.yaml", check=True) == 0
    assert "nothing to migrate; stage(s) t already resume" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["dvc.yaml"]  # no temporary file left


def test_main_quotes_the_file_in_the_commands_it_says(tmp_path, capsys, monkeypatch):
    """A path with a space or a quote: the commands said can be pasted into
    a shell as they are (they were not quoted)."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "my project's"
    folder.mkdir()
    (folder / "dvc.yaml").write_text(
        "stages:\n  t:\n    cmd: python t.py\n    outs:\n      - c: {checkpoint: true}\n")
    quoted = """'my project'"'"'s/dvc.yaml'"""
    assert main("my project's/dvc.yaml", check=True) == 1
    assert f"run `dvc-dali migrate {quoted}` to make them" in capsys.readouterr().out
    assert main("my project's", check=False) == 0
    out = capsys.readouterr().out
    assert f"review with `git diff {quoted}`" in out and f"`git commit {quoted} -m " in out


@pytest.mark.parametrize("content, message", [
    (None, "missing.yaml: no such file"),
    ("stages: [\n", "missing.yaml: not valid YAML at line 2"),
    (b"\xff\xfe", "missing.yaml: not UTF-8 text"),
    # /etc/passwd said "nothing to migrate" and exited 0
    ("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/bin/sh\n",
     "missing.yaml: not a dvc.yaml (YAML whose top level is a scalar"),
    ("- stages\n", "missing.yaml: not a dvc.yaml (YAML whose top level is a list"),
])
def test_main_bad_file_is_one_message(tmp_path, capsys, content, message):
    path = tmp_path / "missing.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert main(str(path), check=False) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"dvc-dali migrate: {tmp_path}/{message}")
    assert "Traceback" not in captured.err and captured.out == ""


def test_check_project_lists_each_stage_and_the_fix(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  t:\n    cmd: python t.py\n    outs:\n      - c: {checkpoint: true}\n")
    (tmp_path / "sub" / "dvc.yaml").write_text("stages:\n  u:\n    cmd: x\n    outs: [m]\n")
    (tmp_path / ".dvc" / "dvc.yaml").write_text("stages: [\n")  # DVC's own dir: skipped
    assert check_project(tmp_path) == [
        "dvc.yaml: stage 't' will not resume under DVC 3: it needs persist: true; "
        "always_changed: true. Fix: `dvc-dali migrate dvc.yaml`"]
    (tmp_path / "sub" / "dvc.yaml").write_text("stages: {\n")
    assert check_project(tmp_path)[1].startswith("sub/dvc.yaml: not valid YAML at line 2")


def test_layout_the_edits_cannot_keep_is_refused_with_the_fix_by_hand():
    """A `|+` command keeps its trailing blank lines: a line added below would
    change it, so rewrite() checks the result, refuses and lists the changes."""
    text = ("stages:\n  t:\n    outs:\n      - c: {checkpoint: true}\n"
            "    cmd: |+\n      python t.py\n\n")
    with pytest.raises(MigrateError) as err:
        rewrite(text, name="sub/dvc.yaml")
    assert str(err.value).splitlines() == [
        "sub/dvc.yaml: cannot make these changes keeping the file's layout; make them by hand:",
        "  stage 't', output 'c': persist: true  (DVC 3 deletes the output before every run, "
        "so training would never resume)",
        "  stage 't': always_changed: true  (DVC 3 skips a stage whose dependencies did not "
        "change instead of resuming it)"]
