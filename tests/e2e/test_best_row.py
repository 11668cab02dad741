"""One rule for "the best row by a metric" (issue 30): retention's
DVC_DALI_KEEP_BEST, `dvc-dali show --best` and dvc_dali.best_row pick the
same row, and where rows tie on the metric, the later step. Real `dvc exp
run` of the template over real images."""

from __future__ import annotations

import pytest

import dvc_dali

from tests.helpers.dvc_project import run, template_project


def test_keep_best_show_best_and_best_row_pick_the_later_of_tied_rows(tmp_path):
    project = template_project(tmp_path, steps=15)
    train = project / "train.py"
    # steps 5 and 10 tie on train/acc (nested in DVCLive's metrics file); 15 is worse
    train.write_text(train.read_text().replace(
        '        live.log_metric("train/loss", loss)\n',
        '        live.log_metric("train/loss", loss)\n'
        '        live.log_metric("train/acc", 0.1 if step == p["steps"] else 0.9)\n'))
    run(["git", "commit", "-qam", "a tied metric"], project)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project,
        env={"DVC_DALI_KEEP_LAST": "1", "DVC_DALI_KEEP_BEST": "train/acc:max"})

    rows = dvc_dali.rows("a", repo=project)
    assert sorted(r["name"] for r in rows) == ["a-step10", "a-step15"], rows  # kept: the later
    assert dvc_dali.best_row(rows, "train/acc:max")["name"] == "a-step10"
    shown = run(["dvc-dali", "show", "a", "--best", "train/acc:max"], project).stdout
    assert "best by train/acc:max: a-step10 (step 10, train/acc=0.9)" in shown, shown
    # a row's name where a run's is asked (found by a sweep: said only "no experiment")
    row = run(["dvc-dali", "show", "a-step10"], project, check=False)
    assert row.returncode == 1 and "'a-step10' is a row of run 'a' (`dvc-dali show a` shows " \
        "that run)" in row.stderr, row.stderr


def test_keep_best_by_a_metric_no_row_has_prunes_nothing_and_says_so(tmp_path):
    """A misspelt metric (or one not logged yet): the best row is unknown, so
    keeping only the last rows could delete it; nothing is pruned, said once."""
    project = template_project(tmp_path, steps=15)
    said = run(["dvc", "exp", "run", "-n", "b", "-S", "train.checkpoint_every=5"], project,
               env={"DVC_DALI_KEEP_LAST": "1", "DVC_DALI_KEEP_BEST": "train/accuracy:max"})
    rows = dvc_dali.rows("b", repo=project)
    assert sorted(r["name"] for r in rows) == ["b-step10", "b-step15", "b-step5"], rows
    text = said.stdout + said.stderr
    assert text.count("keep_best 'train/accuracy:max' (DVC_DALI_KEEP_BEST or keep_best=): "
                      "none of the") == 1, text
    assert "no row is pruned until one has it" in text, text


def test_a_row_git_will_not_delete_is_kept_and_said_and_training_goes_on(tmp_path):
    """A stale .git/packed-refs.lock (a killed `git gc`) or a hook refusing ref
    updates made retention's delete fail: the run died right after each
    recorded row, so it could never finish (found by a sweep)."""
    project = template_project(tmp_path, steps=10)
    (project / ".git" / "packed-refs.lock").write_text("")
    said = run(["dvc", "exp", "run", "-n", "c", "-S", "train.checkpoint_every=5"], project,
               env={"DVC_DALI_KEEP_LAST": "1"})
    rows = dvc_dali.rows("c", repo=project)
    assert sorted(r["name"] for r in rows) == ["c-step10", "c-step5"], rows
    text = said.stdout + said.stderr
    assert "dvc-dali: keep_last: git would not delete c-step5 (error: Unable to create " in text
    assert "packed-refs.lock': File exists.); kept, tried again at the next checkpoint" in text
    assert "Traceback" not in text


def test_keep_best_show_and_rows_read_the_stages_own_metrics_file(tmp_path):
    """DVCLive in another directory (ck.live("logs"), declared in dvc.yaml's
    metrics): keep_best looked only in dvclive/metrics.json, so it found no
    metric and pruned nothing (found by a sweep). The stage's metrics
    outputs are read first. `dvc-dali show` and `dvc_dali.rows` read there
    too, as `dvc exp show` does: they listed the rows without metrics
    unless told the file."""
    project = template_project(tmp_path, steps=15)
    train, yaml = project / "train.py", project / "dvc.yaml"
    train.write_text(train.read_text().replace("live = ck.live()", 'live = ck.live("logs")'))
    yaml.write_text(yaml.read_text().replace("dvclive/", "logs/"))
    run(["git", "commit", "-qam", "DVCLive in logs/"], project)
    said = run(["dvc", "exp", "run", "-n", "d", "-S", "train.checkpoint_every=5"], project,
               env={"DVC_DALI_KEEP_LAST": "1", "DVC_DALI_KEEP_BEST": "train/loss:min"})
    text = said.stdout + said.stderr
    assert "none of the" not in text, text
    rows = dvc_dali.rows("d", repo=project)  # no metrics_file: the one dvc.yaml declares
    best = dvc_dali.best_row(rows, "train/loss:min")
    assert best is not None and len(rows) <= 2, rows
    assert [r["metrics_file"] for r in rows] == ["logs/metrics.json"] * len(rows), rows
    assert {r["name"] for r in rows} == {"d-step15", best["name"]}
    assert rows == dvc_dali.rows("d", repo=project, metrics_file="logs/metrics.json")
    shown = run(["dvc-dali", "show", "d", "--best", "train/loss:min"], project).stdout
    assert f"train/loss={best['metrics']['train/loss']:.4g}" in shown, shown
    assert f"best by train/loss:min: {best['name']} (step {best['step']}," in shown, shown
    assert "metrics read from logs/metrics.json, as dvc.yaml declares them (--metrics-file " \
        "reads another)" in shown, shown


_STAGE_METRICS = """    metrics:
      - dvclive/metrics.json:
          cache: false
          persist: true      # the history survives a resume
"""


@pytest.mark.parametrize("layout", ["stage", "top-level", "default"])
def test_keep_best_keeps_the_row_show_best_names_wherever_dvc_yaml_declares_the_metrics(
        tmp_path, layout):
    """keep_best read only the stage's own ``metrics:`` (then
    dvclive/metrics.json), `show --best` and best_row the file dvc.yaml
    declares, its top-level ``metrics:`` too (what ``Live(dvcyaml=True)``
    writes): with another dvclive/metrics.json in the commit, retention
    deleted the row `show --best` named best (found by a sweep). Step 5 is
    the best; keep_last=1 keeps step 15 and it, whatever the layout."""
    project = template_project(tmp_path, steps=15)
    train, yaml = project / "train.py", project / "dvc.yaml"
    text = train.read_text().replace(
        '        live.log_metric("train/loss", loss)\n',
        '        live.log_metric("train/loss", loss)\n'
        '        live.log_metric("train/acc", 0.9 if step == 5 else 0.1)\n')
    if layout == "stage":  # DVCLive in logs/, the stage's metrics output
        text = text.replace("live = ck.live()", 'live = ck.live("logs")')
        yaml.write_text(yaml.read_text().replace("dvclive/", "logs/"))
    elif layout == "top-level":  # DVCLive writes dvc.yaml's top-level metrics: itself
        text = text.replace("live = ck.live()", 'live = ck.live("logs", dvcyaml=True)')
        yaml.write_text(yaml.read_text().replace(_STAGE_METRICS, "").replace("dvclive/", "logs/"))
    else:  # declared nowhere: DVCLive's default file
        yaml.write_text(yaml.read_text().replace(_STAGE_METRICS, ""))
    train.write_text(text)
    # undeclared, it is in a row where git tracks it; else a file of an earlier layout
    (project / "dvclive").mkdir()
    (project / "dvclive" / "metrics.json").write_text('{"train": {"acc": 5.0}}')
    run(["git", "add", "-f", "dvclive/metrics.json"], project)
    run(["git", "commit", "-qam", f"metrics: {layout}"], project)
    said = run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project,
               env={"DVC_DALI_KEEP_LAST": "1", "DVC_DALI_KEEP_BEST": "train/acc:max"})
    text = said.stdout + said.stderr
    assert "none of the" not in text, text
    rows = dvc_dali.rows("a", repo=project)
    want = "dvclive/metrics.json" if layout == "default" else "logs/metrics.json"
    assert {r["metrics_file"] for r in rows} == {want}, rows
    assert dvc_dali.best_row(rows, "train/acc:max")["name"] == "a-step5", rows
    assert sorted(r["name"] for r in rows) == ["a-step15", "a-step5"], rows
    shown = run(["dvc-dali", "show", "a", "--best", "train/acc:max"], project).stdout
    assert "best by train/acc:max: a-step5 (step 5, train/acc=0.9)" in shown, shown


def test_a_metrics_file_that_is_no_json_object_is_said_and_keep_best_keeps_its_row(tmp_path):
    """Step 5's dvclive/metrics.json is JSON, but a list: show and rows
    listed the row without metrics and said nothing, and keep_best, unable
    to score it, pruned it as if it had no metric (found by a sweep)."""
    project = template_project(tmp_path, steps=15)
    train = project / "train.py"
    train.write_text(train.read_text().replace(
        "        live.next_step()\n",
        "        live.next_step()\n"
        "        if step == 5:\n"
        "            open('dvclive/metrics.json', 'w').write('[0.5]')\n"))
    run(["git", "commit", "-qam", "a list at step 5"], project)
    said = run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project,
               env={"DVC_DALI_KEEP_LAST": "1", "DVC_DALI_KEEP_BEST": "train/loss:min"})
    line = ("dvc-dali: dvclive/metrics.json of row a-step5 is JSON, but a list, not a DVCLive "
            "metrics object: keep_best 'train/loss:min' cannot score it, so retention keeps it")
    assert (said.stdout + said.stderr).count(line) == 1, said.stdout + said.stderr
    rows = dvc_dali.rows("a", repo=project)
    best = dvc_dali.best_row(rows, "train/loss:min")["name"]  # of steps 10 and 15
    assert {r["name"] for r in rows} == {"a-step5", "a-step15", best}, rows
    shown = run(["dvc-dali", "show", "a"], project)
    assert shown.stderr.count("dvclive/metrics.json of row a-step5 is JSON, but a list, not a "
                              "DVCLive metrics object: the row is listed without metrics") == 1, \
        shown.stderr
    assert "a-step5" in shown.stdout


def test_keep_best_without_keep_last_says_once_that_it_does_nothing(tmp_path):
    """DVC_DALI_KEEP_BEST alone keeps every row (it only spares the best from
    KEEP_LAST's pruning): it did so without a word (found by a sweep)."""
    project = template_project(tmp_path, steps=10)
    said = run(["dvc", "exp", "run", "-n", "e", "-S", "train.checkpoint_every=5"], project,
               env={"DVC_DALI_KEEP_BEST": "train/loss:min"})
    rows = dvc_dali.rows("e", repo=project)
    assert sorted(r["name"] for r in rows) == ["e-step10", "e-step5"], rows
    text = said.stdout + said.stderr
    assert text.count("keep_best 'train/loss:min' (DVC_DALI_KEEP_BEST, keep_best= or "
                      "--keep-best) does nothing without keep_last (DVC_DALI_KEEP_LAST, "
                      "keep_last= or --keep-last): every row is kept.") == 1, text
