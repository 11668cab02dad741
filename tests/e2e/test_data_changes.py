"""New data under a finished run's data directory is refused naming the
first files added, removed or changed, whether the data is tracked by git
or by DVC (`dvc add`). Real `dvc exp run`, the `dvc-dali init` template."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.helpers.dvc_project import run, template_project


def change_images(project):
    images = project / "data/images"
    Image.fromarray(np.full((20, 20), 7, np.uint8)).save(images / "c0" / "new.png")
    Image.fromarray(np.full((20, 20), 9, np.uint8)).save(images / "c1" / "0.png")
    (images / "c2" / "1.png").unlink()


@pytest.mark.parametrize("tracked_by", ["git", "dvc"])
def test_new_data_after_a_finished_run_names_the_files(tmp_path, tracked_by):
    project = template_project(tmp_path)
    if tracked_by == "dvc":
        run(["git", "rm", "-rq", "--cached", "data/images"], project)
        run(["dvc", "add", "-q", "data/images"], project)
        run(["git", "add", "-A"], project)
        run(["git", "commit", "-qm", "data in dvc"], project)
    run(["dvc", "exp", "run", "-n", "a"], project)
    change_images(project)
    if tracked_by == "dvc":
        run(["dvc", "add", "-q", "data/images"], project)
    out = run(["dvc", "exp", "run", "-n", "b", "-S", "train.steps=30"], project, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "PipelineMismatchError" in text and "Traceback" not in text, text
    assert "(data/images): added c0/new.png, changed c1/0.png, removed c2/1.png" in text, text
    # the data is a dep too: a branch was announced, then the run refused (found by a
    # sweep); a branch is said at its first row, which a refused run never records
    assert "changed since row" not in text, text
    assert "Restore the data as it was (`git checkout` or `dvc checkout` of it) to resume, " \
           "or start over on the new data with `dvc-dali reset`" in text, text
