"""`dvc-dali show` of one experiment name over two checkpoint stages (one
`dvc exp run` of a pipeline, or a `foreach`): a run per stage, and the
stage in a header only where another run of its name is of another stage."""

from __future__ import annotations

from dvc_dali.cli.main import group_runs, render

B = "a" * 40


def row(stage, step, time, sha, parent=None, exp="two"):
    return {"name": f"{exp}-step{step}", "ref": f"refs/exps/aa/{B[2:]}/{exp}-step{step}",
            "sha": sha.ljust(40, "0"), "exp": exp, "step": step, "parent": parent,
            "baseline": B, "time": time, "metrics": {}, "stage": stage}


def test_one_row_per_stage_is_a_run_per_stage_each_header_naming_it():
    rows = [row("dvc.yaml:train-a", 2, 10, "a1"), row("dvc.yaml:train-b", 2, 11, "b1")]
    groups = group_runs(rows)
    assert [[r["stage"] for r in g] for g in groups] == [["dvc.yaml:train-b"],
                                                         ["dvc.yaml:train-a"]]
    heads = [line for line in render(groups, {}) if line.startswith("two ")]
    assert heads[0].startswith("two  (stage dvc.yaml:train-b, baseline aaaaaaa")
    assert heads[1].startswith("two  (stage dvc.yaml:train-a, ")


def test_a_name_of_one_stage_only_says_no_stage():
    rows = [row("dvc.yaml:train", 2, 10, "a1"),
            row("dvc.yaml:train-b", 2, 11, "b1", exp="other")]
    assert all("stage" not in line for line in render(group_runs(rows), {})
               if not line.startswith(("├", "└")))
