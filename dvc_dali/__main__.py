"""`python -m dvc_dali`: the `dvc-dali` command, as `python -m dvc_dali.cli`."""

import sys

from .cli.main import main

sys.exit(main())
