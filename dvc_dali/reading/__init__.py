"""Reading what was recorded (experiment refs, lineage lines, a row's
checkpoint): `dvc_dali.load`, `rows`, `best_row`, `dvc-dali show`. The
readers need neither DALI nor the recorder.

The package's docstring only: importing it loads nothing."""
