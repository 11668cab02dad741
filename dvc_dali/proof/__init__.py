"""The proof at runtime: the checks a resume makes beyond the pipeline's
description (the data's contents, the batches' digests, a row replayed).
It reads rows and DALI, and records nothing.

The package's docstring only: importing it loads nothing."""
