"""Small statistics shared by the report cards: a mean with its standard error."""

from __future__ import annotations

import math
from typing import Sequence


def mean_stderr(values: Sequence[float]) -> tuple[float | None, float | None]:
    """``(mean, std(ddof=1)/sqrt(n))``; ``(None, None)`` for no values, stderr ``None`` for one."""
    n = len(values)
    if n == 0:
        return None, None
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var) / math.sqrt(n)
