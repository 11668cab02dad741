"""The lowest layer: what every other layer uses and that uses nothing of
theirs (the errors, the logger, the environment read once, what the
training side asks the recorder, the per-process caches and pools).

The package's docstring only: importing it loads nothing."""
