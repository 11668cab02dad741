"""`import dvc_dali` stays light: no DVC, DALI, torch or JAX until used."""

import subprocess
import sys

from tests.helpers import REPO


def test_import_dvc_dali_imports_no_heavy_module():
    code = ("import sys, dvc_dali; heavy = [m for m in ('dvc', 'nvidia.dali', 'torch', 'jax', "
            "'dvclive', 'cupy') if m in sys.modules]; print(heavy); assert not heavy")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
