"""Pure tests of single modules: no DVC run, no DALI pipeline, seconds in all."""
