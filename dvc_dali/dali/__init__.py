"""The doors to DALI and its framework plugins: only these modules touch
``nvidia.dali`` (tests/unit/test_dali_boundary.py).

The package's docstring only: importing it loads nothing."""
