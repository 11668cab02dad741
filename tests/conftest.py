from __future__ import annotations

import os
from pathlib import Path

import pytest

# DVC's analytics off for every process the tests start (`dvc`, stages, queue
# workers, the example's own `dvc` calls), as DVC's own suite does: each `dvc`
# command would otherwise start a second Python importing DVC to report to a
# network that is not there.
os.environ["DVC_NO_ANALYTICS"] = "1"

# The longest modules first (their tests' seconds added, in a parallel run on
# 2 cores: `tests/helpers/slowest.py` prints them after each CI run), so that
# no worker starts one of them when the others are nearly done: pytest-xdist
# hands out whole files (tests/ci.sh) in collection order. Only the order
# changes; a module missing here runs after these, as collected.
LONGEST_FIRST = (
    "tests/e2e/test_kill_fuzz.py",               # 600 s
    "tests/e2e/test_stage_batch_proof.py",       # 400
    "tests/integration/test_tf.py",              # 1000 before runners were forked (forked.py)
    "tests/integration/test_tf_proof.py",
    "tests/e2e/test_wrong_results.py",           # 550
    "tests/e2e/test_example_torch.py",           # 360
    "tests/e2e/test_example.py",                 # 380
    "tests/e2e/test_async_distributed.py",       # 250: one test 160
    "tests/e2e/test_readme_walkthrough.py",      # 180: one test
    "tests/e2e/test_example_lightning.py",       # 310
    "tests/e2e/test_cli.py",                     # 320
    "tests/integration/test_iterators.py",
    "tests/integration/test_hostile_checkpoints.py",
    "tests/e2e/test_remote_push.py",             # 280
    "tests/e2e/test_example_keras.py",           # 250
    "tests/e2e/test_distributed.py",             # 210
    "tests/e2e/test_concurrency.py",
    "tests/e2e/test_example_distributed.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = Path(str(config.rootpath))
    items.sort(key=lambda item: rank.get(
        Path(str(item.path)).relative_to(root).as_posix(), len(rank)))


@pytest.fixture(scope="session", autouse=True)
def _project_templates_once_per_run(tmp_path_factory):
    """make_project's bases and the example's prepared cache, made once per
    run (tests.helpers.dvc_project._once): in the run's temporary root, the
    one all pytest-xdist workers' roots are in, which pytest removes with
    the run. Asked for only when a test makes a project."""
    from tests.helpers import dvc_project

    def where() -> Path:
        root = tmp_path_factory.getbasetemp()
        return (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) \
            / "dvc-dali-templates"

    dvc_project.TEMPLATES = where


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    from tests.helpers import pipelines

    return pipelines.make_data(tmp_path_factory.mktemp("data"))


@pytest.fixture
def images(tmp_path, data_dir) -> Path:
    """A copy of data_dir's images, for a test that rewrites them."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(data_dir / "images", data / "images")
    return data
