from __future__ import annotations

from pathlib import Path

import pytest


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
