from __future__ import annotations

import os
from pathlib import Path

import pytest

# DVC's analytics off for every process the tests start (`dvc`, stages, queue
# workers, the example's own `dvc` calls), as DVC's own suite does: each `dvc`
# command would otherwise start a second Python importing DVC to report to a
# network that is not there.
os.environ["DVC_NO_ANALYTICS"] = "1"


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
