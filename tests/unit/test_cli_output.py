"""`dvc-dali show` and `remove` as pure functions: tables, order, selection."""

from __future__ import annotations

import os

import pytest

from dvc_dali.cli.main import _message, draw_tree, group_runs, parse_batch, render
from dvc_dali.core.errors import DvcDaliError, readable
from dvc_dali.recording.remove import Removed, continued, select_refs, summarize

B1, B2 = "a" * 40, "b" * 40


def row(exp, step, time, sha=None, parent=None, baseline=B1):
    sha = sha or f"{exp}{step}".ljust(40, "0")
    return {"name": f"{exp}-step{step}", "ref": f"refs/exps/{baseline[:2]}/{baseline[2:]}/"
            f"{exp}-step{step}", "sha": sha, "exp": exp, "step": step, "parent": parent,
            "baseline": baseline, "time": time, "metrics": {}}


def chain(exp, steps, times, baseline=B1):
    rows, parent = [], None
    for step, time in zip(steps, times):
        rows.append(row(exp, step, time, parent=parent, baseline=baseline))
        parent = rows[-1]["sha"]
    return rows


def test_runs_newest_first_steps_in_order_latest_marked():
    rows = chain("a", [1, 2], [10, 11]) + chain("z", [1], [30]) + chain("m", [3, 1, 2], [20] * 3)
    groups = group_runs(rows)
    assert [g[0]["exp"] for g in groups] == ["z", "m", "a"]
    assert [r["step"] for r in groups[1]] == [1, 2, 3]
    # times tie: the end of the chain (step 2, recorded last) is the latest
    assert [r["name"] for g in groups for r in g if r["latest"]] == ["z-step1", "m-step2",
                                                                     "a-step2"]


def test_same_name_on_two_baselines_is_two_runs():
    groups = group_runs(chain("a", [1], [5]) + chain("a", [1, 2], [9, 9], baseline=B2))
    assert [(g[0]["baseline"], len(g)) for g in groups] == [(B2, 2), (B1, 1)]


def test_tree_draws_steps_in_order_and_a_branch():
    rows = chain("a", [10, 20, 30], [1, 2, 3])
    rows.append(row("a", 40, 3, sha="f" * 40, parent=rows[1]["sha"]))  # resumed from step 20
    lines = draw_tree(group_runs(rows)[0])
    steps = [line.split("step")[1].split()[0] for line in lines]
    assert steps == ["10", "20", "40", "30"]  # the branch, then the chain goes on
    # the branch's only row is its last (└─); the run's last row too
    assert lines[2].startswith("│ └─ step") and lines[2].endswith("← latest")
    assert [line[:2] for line in lines] == ["├─", "├─", "│ ", "└─"]


def test_a_run_started_again_from_step_0_under_its_name_is_a_run_of_its_own():
    """`dvc exp run -f -n n` after n's rows: the new rows (no parent) were drawn
    in n's list after its last row, as if they went on from it (found by a
    sweep). A row whose parent was removed stays with its run."""
    first = chain("n", [2, 4, 6], [1, 2, 3])
    again = [dict(r, sha=r["sha"].replace("0", "9"), time=r["time"] + 10,
                  parent=r["parent"] and r["parent"].replace("0", "9")) for r in first]
    groups = group_runs(first + again)
    assert [[r["time"] for r in g] for g in groups] == [[11, 12, 13], [1, 2, 3]]
    cut = [r for r in first if r["step"] != 2]  # n-step2 removed: n-step4's parent is gone
    assert [[r["step"] for r in g] for g in group_runs(cut + again)] == [[2, 4, 6], [4, 6]]
    middle = [r for r in first if r["step"] != 4]  # n-step4 removed: n-step6 stays in n
    assert [[r["step"] for r in g] for g in group_runs(middle + again)] == [[2, 4, 6], [2, 6]]
    # rows without lineage (no parents), or one row beside a lineage: one run, as before
    loose = [row("d", s, 5, sha=f"{s}".ljust(40, "d")) for s in (2, 10, 9, 1)]
    assert [[r["step"] for r in g] for g in group_runs(loose)] == [[1, 2, 9, 10]]
    assert [len(g) for g in group_runs(first + [row("n", 8, 5, sha="e" * 40)])] == [4]


def test_tree_ends_each_level_with_a_corner():
    rows = chain("a", [10, 20, 30, 40], [1, 2, 3, 4])
    b1 = row("a", 30, 5, sha="f" * 40, parent=rows[1]["sha"])  # resumed from 20, twice
    b2 = row("a", 40, 6, sha="e" * 40, parent=b1["sha"])
    lines = draw_tree(group_runs(rows + [b1, b2])[0])
    assert [line.split(" step")[0] for line in lines] == ["├─", "├─", "│ ├─", "│ └─", "├─",
                                                          "└─"]
    assert draw_tree(group_runs(chain("a", [1], [1]))[0])[0].startswith("└─ step")


# words a help text does not end on unless it was cut off ("to start from" is English)
DANGLING = {"a", "an", "and", "each", "every", "of", "or", "the"}


def test_every_command_help_is_a_whole_phrase():
    from dvc_dali.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "cmd")
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert set(helps) >= {"init", "show", "run", "remove", "push", "pull", "reset", "migrate",
                          "doctor"}
    for name, text in helps.items():
        assert text.split()[-1].lower().strip(".,:)") not in DANGLING, (name, text)
    assert "DVC's own experiment" in helps["remove"]
    shown = " ".join(parser.format_help().split())
    assert " ".join(helps["remove"].split()) in shown


def test_render_says_one_checkpoint_and_where_a_run_resumed_from():
    a = chain("a", [1, 2], [1, 2])
    b = [row("b", 3, 5, parent=a[0]["sha"])]
    text = render(group_runs(a + b), {r["sha"]: r["name"] for r in a + b})
    assert text[0] == "b  (baseline aaaaaaa, 1 checkpoint, resumed from a-step1)"
    assert "a  (baseline aaaaaaa, 2 checkpoints)" in text


def test_parse_batch():
    out = (b"1111 blob 5\nhello\n"
           b"x:dvclive/metrics.json missing\n"
           b"2222 tree 3\nabc\n"
           b"3333 blob 0\n\n"
           b"4444 blob 7\n\xff\nline\n\n")
    assert parse_batch(out, 5) == [b"hello", None, None, b"", b"\xff\nline\n"]


@pytest.mark.parametrize("text", ["dvc_dali: no stage 'x'", "dvc-dali: no stage 'x'",
                                  "no stage 'x'"])
def test_message_has_no_prefix_of_its_own(text):
    assert _message(DvcDaliError(text)) == "no stage 'x'"


def test_select_refs_takes_every_row_of_a_run_and_dvcs_own_ref():
    rows = chain("a", [1, 2], [1, 2]) + chain("a", [3], [3], baseline=B2) + chain("b", [1], [1])
    own = [(f"refs/exps/{B1[:2]}/{B1[2:]}/a", "c" * 40),
           (f"refs/exps/{B1[:2]}/{B1[2:]}/b-step1", rows[3]["sha"]),  # a row: not DVC's own
           (f"refs/exps/{B2[:2]}/{B2[2:]}/c", "d" * 40)]
    targets = select_refs(rows, ["a"], own)
    assert [t.ref.rsplit("/", 1)[1] for t in targets] == ["a-step1", "a-step2", "a-step3", "a"]
    assert [t.row for t in targets] == [True, True, True, False]
    assert summarize(targets) == [Removed("a", B1, 2, True), Removed("a", B2, 1, False)]
    assert select_refs(rows, ["b-step1"], own) == []  # a row's name is not a run's
    assert [t.exp for t in select_refs(rows, ["c"], own)] == ["c"]  # a run without rows


def test_removing_a_run_another_continues_names_it():
    """Found by a sweep: `dvc-dali remove a`, where b was resumed from a-step2,
    said nothing; b then showed as a run that started at step 3."""
    a = chain("a", [1, 2], [1, 2])
    b = [row("b", 3, 3, parent=a[1]["sha"])]
    rows = a + b + chain("c", [1], [4])
    assert continued(rows, select_refs(rows, ["a"])) == [("b", "a-step2")]
    assert continued(rows, select_refs(rows, ["a", "b"])) == []  # removed too
    assert continued(rows, select_refs(rows, ["c"])) == []


@pytest.mark.parametrize("made, said", [
    ((), "git init && dvc init && "),
    ((".git",), "dvc init --subdir && "),  # the git top is above the stage's directory
    (("project/stage/.git",), "dvc init && "),
    ((".git", ".dvc"), ""),
])
def test_init_says_the_setup_a_directory_still_needs(tmp_path, made, said):
    """`dvc-dali init` in a new directory: its "next:" line starts with the
    `git init` and `dvc init` that `dvc exp run` needs there."""
    from dvc_dali.cli.main import setup_commands

    for name in made:  # at the top, or in the stage's directory
        (tmp_path / name).mkdir(parents=True)
    assert setup_commands(tmp_path / "project" / "stage") == said


@pytest.mark.parametrize("now, committed, cut", [
    ("", "train:\n  steps: 6\n", True),
    ("train:\n  steps: [", "train:\n  steps: 6\n", True),   # not YAML
    ("other: 1\n", "train:\n  steps: 6\n", False),            # rewritten: an edit
    ("# a comment\n", "train:\n  steps: 6\n", True),           # cut after its first line
    ("train:\n  steps: 7\n", "train:\n  steps: 6\n", False),  # an edit
    ("train: {}\n", "train:\n  steps: 6\n", False),
    ("", "", False),                                          # empty when committed too
    ("", "not: [yaml", False),
])
def test_params_cut_short_rule(now, committed, cut):
    from dvc_dali.cli.main import params_cut_short

    assert params_cut_short(now, committed) is cut


def test_params_files_are_params_yaml_and_those_the_stages_name(tmp_path):
    from dvc_dali.cli.main import params_files

    (tmp_path / "dvc.yaml").write_text(
        "stages:\n"
        "  train:\n    cmd: x\n    params: [lr, {config.yaml: [train]}, {params.yaml: []}]\n"
        "  sub:\n    cmd: y\n    wdir: sub\n    params: [{../other.json: [a]}, {own.yaml: [b]}]\n")
    assert params_files(tmp_path) == ["params.yaml", "config.yaml", "other.json",
                                      os.path.join("sub", "own.yaml")]
    (tmp_path / "dvc.yaml").write_text("stages: [not a mapping")
    assert params_files(tmp_path) == ["params.yaml"]
    (tmp_path / "dvc.yaml").write_text(
        "vars: [shared.yaml, {x: 1}, more.json:part]\n"
        "stages:\n"
        "  each:\n    foreach: [a, b]\n    do:\n      cmd: z ${item}\n      wdir: w\n"
        "      params:\n        - cfg.yaml: [lr]\n        - ${item}.yaml: [k]\n"
        "  grid:\n    matrix: {lr: [1, 2]}\n    cmd: g\n"
        "    params: [{grid.yaml: [lr]}]\n")
    assert params_files(tmp_path) == ["params.yaml", "shared.yaml", "more.json",
                                      os.path.join("w", "cfg.yaml"), "grid.yaml"]
    (tmp_path / "dvc.yaml").write_text("- a list\n")
    assert params_files(tmp_path) == ["params.yaml"]


def test_a_rejected_push_names_the_rows_the_remote_holds_otherwise():
    from dvc_dali.recording.share import rejected_rows

    out = ("To ../r.git\n"
           "!\t62ea:refs/exps/ab/cd/x-step6\t[rejected] (non-fast-forward)\n"
           "!\t62ea:refs/exps/ab/cd/x-step10\t[rejected] (atomic push failed)\n"
           "*\t62ea:refs/exps/ab/cd/x-step12\t[new reference]\n"
           "Done\n")
    assert rejected_rows(out) == ["x-step6"]
    assert rejected_rows("") == []


def test_a_push_the_remote_refused_names_no_row_as_held_otherwise():
    """A pre-receive hook's refusal was said to be rows recorded elsewhere,
    with the advice to delete the remote's refs (found by a sweep)."""
    from dvc_dali.recording.share import rejected_rows, remote_refusal

    out = ("To ../r.git\n"
           "!\t62ea:refs/exps/ab/cd/x-step6\t[remote rejected] (pre-receive hook declined)\n"
           "!\t62ea:refs/exps/ab/cd/x-step10\t[rejected] (fetch first)\n"
           "Done\n")
    assert rejected_rows(out) == ["x-step10"]
    assert remote_refusal(out) == "pre-receive hook declined"
    assert remote_refusal("!\t62ea:refs/exps/ab/cd/x-step6\t[rejected] (non-fast-forward)\n") \
        == ""


def _row(name: str, sha: str, parent: str | None, exp: str = "a", baseline: str = "b0") -> dict:
    return {"name": name, "sha": sha, "parent": parent, "exp": exp, "baseline": baseline,
            "ref": f"refs/exps/b0/{name}"}


@pytest.mark.parametrize("theirs,foreign", [
    ([_row("a-step3", "t3", None), _row("a-step6", "t6", "t3")], ["a-step3", "a-step6"]),
    ([_row("a-step15", "s15", "s10")], []),  # resumed from our row elsewhere: one run
    ([_row("a-step10", "s10", "s5")], []),  # ours
    ([_row("a-step7", "t7", "gone")], []),  # its lineage cut: unknown, not foreign
    ([_row("b-step3", "u3", None, exp="b")], []),  # a run we have none of
    ([_row("a-step3", "t3", None, baseline="b1")], []),  # the name on another commit
])
def test_rows_of_another_recording_of_a_run_are_told_apart(theirs, foreign):
    """Two clones' `dvc exp run -n a` on one commit: moved together, they
    read as one run and the next run's retention pruned the other's rows."""
    from dvc_dali.recording.share import foreign_rows

    ours = [_row("a-step5", "s5", None), _row("a-step10", "s10", "s5")]
    assert [r["name"] for r in foreign_rows(ours, theirs)] == foreign
    # our own lineage cut (a row pruned above): where it starts is unknown
    assert foreign_rows([_row("a-step10", "s10", "s5")], theirs) == []


@pytest.mark.parametrize("text, shown", [
    (os.fsdecode(b"ck\xff") + "/LATEST", "ck\\xff/LATEST"),  # as str() and stderr had it
    (repr(os.fsdecode(b"ck\xfe\x80")), "'ck\\xfe\\x80'"),  # as repr() had it
    ("caf\u00e9 \\u00e9 \\udcxx", "caf\u00e9 \\u00e9 \\udcxx"),  # nothing else changes
])
def test_a_name_that_is_not_utf8_reads_as_its_bytes(text, shown):
    assert readable(text) == shown
    assert str(DvcDaliError(f"{text}: bad")) == f"{shown}: bad"


def test_an_os_error_reads_as_its_path_and_reason():
    exc = FileNotFoundError(2, "No such file or directory", os.fsdecode(b"w\xff/dvc.yaml"))
    assert _message(exc) == "w\\xff/dvc.yaml: No such file or directory"
    assert _message(OSError(5, "Input/output error")) == "Input/output error"


def test_init_force_replaces_links_and_never_writes_through_them(tmp_path, capsys):
    """Found by a sweep: `init --force` over dvc.yaml -> missing wrote a file
    named `missing` and left the link; one whose target's directory is gone
    stopped midway with the templates half written."""
    from dvc_dali.cli.main import main

    (tmp_path / "dvc.yaml").symlink_to("missing")
    (tmp_path / "train.py").symlink_to(tmp_path / "gone" / "train.py")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "params.yaml").symlink_to("elsewhere")  # a link to a directory
    assert main(["init", str(tmp_path)]) == 1  # links are files there: refused without --force
    assert main(["init", "--force", str(tmp_path)]) == 0
    for name in ("dvc.yaml", "train.py", "params.yaml"):
        assert not (tmp_path / name).is_symlink() and (tmp_path / name).is_file()
    assert not (tmp_path / "missing").exists() and not list((tmp_path / "elsewhere").iterdir())
    assert "wrote " + str(tmp_path / "dvc.yaml") + " (replacing the link to missing)" in (
        capsys.readouterr().out)
