"""The framework integrations (Keras, PyTorch Lightning, DVCLive): each is
given a Checkpointer and uses its public API only.

The package's docstring only: importing it loads nothing."""
