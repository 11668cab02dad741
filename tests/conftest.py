from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    from tests.helpers import pipelines

    return pipelines.make_data(tmp_path_factory.mktemp("data"))
