"""The `dvc-dali` command (main.py) and what only it does.

The package's docstring only: importing it loads nothing."""
