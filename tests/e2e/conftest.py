from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.dvc_project import make_project


@pytest.fixture
def project(tmp_path) -> Path:
    """A fresh copy of this repository's example project (git + DVC) in
    tmp_path, its data prepared in the DVC cache (make_project's
    ``prepared``). Modules whose tests share one project, or need another
    kind, define their own ``project``, built on make_project too."""
    return make_project(tmp_path, example=True, prepared=True)
