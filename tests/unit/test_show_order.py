"""`dvc-dali show`'s order as pure functions: a run's rows by step, rows of
one step in recording order, also where a run's steps went back; and which
row DVC's own experiment is."""

from __future__ import annotations

from dvc_dali.cli.main import draw_tree, group_runs

B1, B2 = "a" * 40, "b" * 40


def row(exp, step, time, sha, parent=None, baseline=B1, outs=None, name=None):
    return {"name": name or f"{exp}-step{step}", "sha": sha.ljust(40, "0"), "exp": exp,
            "step": step, "parent": parent and parent.ljust(40, "0"), "baseline": baseline,
            "time": time, "metrics": {}, "outs": outs,
            "ref": f"refs/exps/{baseline[:2]}/{baseline[2:]}/{name or f'{exp}-step{step}'}"}


def steps_drawn(lines):
    return [line.split("step")[1].split()[0] for line in lines]


def names_drawn(lines):
    return [line.split()[3] for line in lines]


def test_a_run_whose_steps_went_back_is_drawn_by_step_ties_in_recording_order():
    # make_checkpoint(5), (5), (3), (10) in one run, one chain, within one second:
    # the second step-5 row's name sorts before the first's
    rows = [row("r", 5, 7, "1", name="r-step5-zz"), row("r", 5, 7, "2", parent="1",
                                                        name="r-step5"),
            row("r", 3, 7, "3", parent="2"), row("r", 10, 7, "4", parent="3")]
    group = group_runs(rows)[0]
    assert [r["name"] for r in group] == ["r-step3", "r-step5-zz", "r-step5", "r-step10"]
    lines = draw_tree(group)
    assert names_drawn(lines) == ["r-step3", "r-step5-zz", "r-step5", "r-step10"], lines
    assert [line[:2] for line in lines] == ["├─", "├─", "├─", "└─"]
    assert lines[-1].endswith("← latest")


def test_a_run_going_forward_keeps_its_branches():
    rows = [row("a", 10, 1, "1"), row("a", 20, 2, "2", parent="1"),
            row("a", 30, 3, "3", parent="2"), row("a", 30, 4, "4", parent="2")]
    lines = draw_tree(group_runs(rows)[0])
    assert steps_drawn(lines) == ["10", "20", "30", "30"]
    assert [line.split(" step")[0] for line in lines] == ["├─", "├─", "│ └─", "└─"], lines


def test_dvc_s_experiment_is_one_row_of_its_baseline():
    from dvc_dali.reading.row_queries import dvc_matches

    every = [row("a", 1, 1, "a1", outs="x"), row("a", 2, 2, "a2", parent="a1", outs="y"),
             row("b", 1, 3, "b1", baseline=B2, outs="x"),
             row("b", 2, 4, "b2", parent="b1", baseline=B2, outs="y"),
             row("b", 2, 4, "b3", parent="b2", baseline=B2, outs="y", name="b-step2-again")]
    theirs = [(f"refs/exps/{B1[:2]}/{B1[2:]}/a", {"y"}),
              (f"refs/exps/{B2[:2]}/{B2[2:]}/b", {"y"}),
              (f"refs/exps/{B2[:2]}/{B2[2:]}/other", {"x"})]  # no rows of its own: b's
    found = dvc_matches(every, theirs)
    assert found == {"a2".ljust(40, "0"): ["a"], "b3".ljust(40, "0"): ["b"],
                     "b1".ljust(40, "0"): ["other"]}
