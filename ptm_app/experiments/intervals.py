"""Confidence intervals for reported numbers: a percentile bootstrap over test examples (Efron & Tibshirani 1993,
ch. 13) for one seed, and Student's t over seeds when a number was measured with several."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def bootstrap_interval(values: Sequence[float], level: float = 0.95, resamples: int = 1000,
                       seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values`` (e.g. 0/1 correctness per test example)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def seed_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean ± Student's t half-width over seeds (needs 2 or more)."""
    from scipy import stats

    data = np.asarray(values, dtype=np.float64)
    if data.size < 2:
        return math.nan, math.nan
    half = float(stats.t.ppf(1 - (1 - level) / 2, data.size - 1) * data.std(ddof=1) / math.sqrt(data.size))
    return float(data.mean()) - half, float(data.mean()) + half
