"""DVC 3: one row of `dvc exp show` per checkpoint, recorded from inside the
stage command while `dvc exp run` runs (DVC 3 removed checkpoint experiments).

The entry points are in pipeline.py (``start_run``, ``record``,
``record_and_prune``); each step of a recording has its own module, and all
of DVC's internals are behind dvc_door.py. Importing this package imports
nothing else: the read side (row_queries, loading, `dvc-dali show`) never
loads the recorder.
"""
