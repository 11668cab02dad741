"""Which rows are one run, and which row a key names (dvc_dali.reading.row_queries):
what `rows(run=...)`, `load(rev=...)` and the example's evaluate stage use
to score a run's own rows, never another run's of the same name."""

from __future__ import annotations

import pytest

from dvc_dali.core.errors import ConfigError
from dvc_dali.reading.row_queries import matching_rows, run_rows, the_row

B1, B2 = "1" * 40, "2" * 40


def row(exp: str, step: int, baseline: str, parent: str | None = None) -> dict:
    name = f"{exp}-step{step}"
    sha = f"{exp}{step}{baseline[0]}".ljust(40, "0")
    return {"name": name, "exp": exp, "step": step, "baseline": baseline, "parent": parent,
            "sha": sha, "ref": f"refs/exps/{baseline[:2]}/{baseline[2:]}/{name}", "time": step}


def names(found: list[dict]) -> list[str]:
    return [f"{r['name']}@{r['baseline'][0]}" for r in found]


def test_a_name_used_again_on_another_commit_is_another_run():
    first = [row("same", 10, B1)]
    first.append(row("same", 20, B1, first[0]["sha"]))
    second = [row("same", 10, B2)]  # a new run: no parent
    second.append(row("same", 20, B2, second[0]["sha"]))
    found = first + second
    assert names(run_rows(found, second[1])) == ["same-step10@2", "same-step20@2"]
    assert names(run_rows(found, first[0])) == ["same-step10@1", "same-step20@1"]


def test_a_run_resumed_on_another_commit_stays_one_run_a_branch_does_not():
    a10 = row("a", 10, B1)
    a20 = row("a", 20, B1, a10["sha"])
    a30 = row("a", 30, B2, a20["sha"])  # resumed after a commit: its name kept
    b30 = row("b", 30, B2, a20["sha"])  # changed params: branched off under its own name
    found = [a10, a20, a30, b30]
    assert names(run_rows(found, a10)) == ["a-step10@1", "a-step20@1", "a-step30@2"]
    assert names(run_rows(found, b30)) == ["b-step30@2"]


def test_a_pruned_parent_keeps_the_run_on_its_commit():
    kept = [row("a", 10, B1), row("a", 50, B1, "f" * 40)]  # keep_best kept 10; 40 pruned
    assert names(run_rows(kept, kept[1])) == ["a-step10@1", "a-step50@1"]


def test_rows_are_named_by_row_ref_sha_or_unique_name():
    first, second = row("same", 10, B1), row("same", 10, B2)
    found = [first, second]
    assert matching_rows(found, "same-step10") == found
    assert matching_rows(found, second["ref"]) == [second]
    assert matching_rows(found, second["sha"][:10]) == [second]
    assert matching_rows(found, dict(second, metrics={})) == [second]
    assert matching_rows(found, "HEAD") == [] and matching_rows(found, None) == []
    with pytest.raises(ConfigError) as err:
        the_row(found, "same-step10", "rev='same-step10'", "/repo")
    said = str(err.value)
    assert first["ref"] in said and second["ref"] in said and "pass the row" in said
    with pytest.raises(ConfigError, match="no recorded row of /repo"):
        the_row(found, "other-step10", "run='other-step10'", "/repo")


@pytest.mark.parametrize("name,step,fits", [
    ("a", 10 ** 9, True),
    ("M" * 244, 2, True),  # 250 bytes with -step2
    ("M" * 245, 2, False),
    ("検" * 81, 99, True),  # 243 bytes, with -step99 250
    ("検" * 82, 99, False),
])
def test_a_run_name_must_leave_room_for_its_rows(name, step, fits):
    from dvc_dali.recording.rows import too_long

    assert (too_long(name, step) == "") == fits
