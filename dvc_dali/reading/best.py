"""The best row by a metric: one rule for `DVC_DALI_KEEP_BEST` (retention),
`dvc-dali show --best` and ``dvc_dali.best_row``. A pure choice, no I/O.

The spec is ``<metric>:max`` or ``<metric>:min``. The metric is a DVCLive
metric name, as ``live.log_metric()`` takes it and `dvc-dali show` prints
it: ``loss``, ``train/acc`` (``/`` between the levels of the metrics file,
``{"train": {"acc": 0.9}}``). A row without that number (or with NaN) is
not a candidate. Rows that tie: the later step wins (then the later time):
the longer-trained state of equal merit.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Optional

from ..core.arguments import given
from ..core.errors import ConfigError

MODES = ("max", "min")


def parse_spec(spec: object, source: str = "best",
               error: type[ConfigError] = ConfigError) -> tuple[str, str]:
    """(metric, mode) of ``'<metric>:max'`` / ``'<metric>:min'``; ``error``
    naming ``source`` otherwise: a setting (``best``: ``best='x'``) or a
    call's argument (``best_row(spec``: ``best_row(spec='x')``)."""
    metric, sep, mode = str(spec).rpartition(":")
    if not isinstance(spec, str) or not sep or not metric.strip() or mode not in MODES:
        raise error(f"{given(source, spec)}: must be '<metric>:max' or '<metric>:min', a "
                    "DVCLive metric path such as 'train/acc:max' or 'loss:min'")
    return metric, mode


def metric_value(metrics: Optional[Mapping[str, Any]], metric: str) -> Optional[float]:
    """The number at ``metric`` ('train/acc') in a DVCLive metrics tree,
    nested ({"train": {"acc": 0.9}}) or flattened ({"train/acc": 0.9}, as
    ``dvc_dali.rows()`` gives it); None when absent, not a number or NaN."""
    node: Any = metrics
    if isinstance(node, Mapping) and metric in node:
        node = node[metric]
    else:
        for part in metric.split("/"):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
    if isinstance(node, bool) or not isinstance(node, (int, float)) or math.isnan(node):
        return None
    return float(node)


def best_row(rows: Iterable[dict], spec: str,
             metrics: Callable[[dict], Optional[Mapping[str, Any]]] = lambda r: r.get("metrics")
             ) -> Optional[dict]:
    """The row (a dict with ``step`` and ``time``) with the highest
    (``:max``) or lowest (``:min``) value of the metric, read from each row by
    ``metrics`` (default: its "metrics"); ties: the later step, then the later
    time. None when no row has the metric."""
    metric, mode = parse_spec(spec)
    sign = 1.0 if mode == "max" else -1.0
    scored = [(sign * v, r.get("step") or 0, r.get("time") or 0, i, r)
              for i, r in enumerate(rows) if (v := metric_value(metrics(r), metric)) is not None]
    return max(scored, key=lambda s: s[:4])[4] if scored else None
