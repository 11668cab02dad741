"""The test suite: unit/ (pure, fast), integration/ (real DALI and files, no
`dvc exp run`), e2e/ (real `dvc exp run`, git, remotes, the examples) and
helpers/ (what they share, and the runner scripts they start)."""
