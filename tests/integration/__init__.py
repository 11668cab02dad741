"""Real DALI pipelines and real files, in-process or in one child process;
no `dvc exp run`, no git repository."""
