"""keras_callback.first_difference: whether a checkpoint's saved variable
paths are this model's or optimizer's (the refusal names the first that
differs)."""

from __future__ import annotations

import pytest

pytest.importorskip("keras")

from dvc_dali.integrations.keras_callback import first_difference  # noqa: E402

LSO = ["loss_scale_optimizer/iteration", "loss_scale_optimizer/dynamic_scale",
       "loss_scale_optimizer/adam_w/dense_kernel_momentum"]


@pytest.mark.parametrize("saved, now, said", [
    (["a/x", "a/y"], ["a/x", "a/y"], ""),
    # found by a sweep: a LossScaleOptimizer (mixed_float16) names its inner
    # optimizer's variables under its scope when a train step builds them, not
    # when build() does before a restore: every resume of such a run was refused
    (LSO, LSO[:2] + ["adam_w/dense_kernel_momentum"], ""),
    (["a/x", "a/y"], ["a/x", "b/y"], "variable 1 is 'a/y' saved, 'b/y' now"),
    (["a/x"], ["a/x", "a/y"], "1 saved, 2 now"),
    (None, ["a/x"], "none saved"),
])
def test_saved_paths_against_the_models(saved, now, said):
    assert first_difference(saved, now) == said
