"""The on-disk checkpoint: written, published, locked, read back and
checked. It knows no DALI object, no row, no DVC.

The package's docstring only: importing it loads nothing."""
