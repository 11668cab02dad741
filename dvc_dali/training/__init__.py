"""The training loop: the Checkpointer, `make_checkpoint()`, what
`import dvc_dali` does in a checkpoint stage, the ranks.

The package's docstring only: importing it loads nothing."""
