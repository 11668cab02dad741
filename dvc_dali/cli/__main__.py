"""`python -m dvc_dali.cli`: the `dvc-dali` command."""

import sys

from .main import main

sys.exit(main())
