"""fit_end.unfinished_line: what a fit that ends short of total_steps says."""

from __future__ import annotations

import pytest

from dvc_dali.integrations.fit_end import unfinished_line


@pytest.mark.parametrize("step,total,said", [
    (90, 100, True), (0, 1, True), (100, 100, False), (120, 100, False), (5, None, False),
])
def test_said_only_short_of_total_steps(step, total, said):
    line = unfinished_line("ck", step, total, "cb.fit", "more")
    assert (line is not None) is said
    if said:
        assert line.startswith(f"cb.fit ended at step {step} of total_steps={total} (ck)")
        assert "\n" not in line and line.endswith("to finish it, more.")
