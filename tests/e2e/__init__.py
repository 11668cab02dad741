"""Real `dvc exp run` in temporary git + DVC projects: the examples, the
template, remotes, the dvc-dali command, DVC 2."""
