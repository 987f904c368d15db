"""Numbers over seeds, the one place reports get them: mean, sample standard deviation, a 95 % confidence interval
for the mean (Student's t with n - 1 degrees of freedom; a percentile bootstrap over seeds on request), and a paired
test between two rows measured on the same seeds (a paired t-test on the differences, and the exact sign-flip
permutation test, which assumes no normality).

A value of one seed has no interval: ``Summary.interval`` is None and the text says "1 seed (an observation)".
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence

from ptm_app.errors import PtmError


def _t_quantile(p: float, df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(p, df))


@dataclass(frozen=True)
class Summary:
    """``n`` values: their ``mean``, sample ``std`` (n - 1; 0 for one value) and 95 % ``interval`` (None for one)."""

    n: int
    mean: float
    std: float
    interval: Optional[tuple[float, float]]

    def text(self, digits: int = 4) -> str:
        """``mean ± std [low, high] (n seeds)``; one seed: ``value (1 seed: an observation)``."""
        if self.n == 1:
            return f"{self.mean:.{digits}f} (1 seed: an observation)"
        low, high = self.interval
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}] ({self.n} seeds)"


def check_seeds(seeds, where: str = "seeds") -> list[int]:
    """A list of distinct integer seeds, or one line naming the bad entry."""
    if not isinstance(seeds, (list, tuple)) or not seeds:
        raise PtmError(f"{where}: give a list of integer seeds, e.g. [1, 2, 3] (got {seeds!r})")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int):
            raise PtmError(f"{where}: {s!r} is not an integer seed; give integers, e.g. [1, 2, 3]")
    if len(set(seeds)) != len(seeds):
        raise PtmError(f"{where}: seed {next(s for s in seeds if list(seeds).count(s) > 1)} is given twice")
    return list(seeds)


def summarize(values: Sequence[float], level: float = 0.95, method: str = "t", resamples: int = 10_000,
              seed: int = 0) -> Summary:
    """Mean, std and the ``level`` interval of the mean: ``t`` (mean ± t·s/√n) or ``bootstrap`` (percentiles of the
    means of ``resamples`` resamples with replacement, seeded)."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        raise PtmError("no values to summarise (every seed's run is missing its metric)")
    mean = sum(values) / n
    if n == 1:
        return Summary(1, mean, 0.0, None)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    if method == "t":
        half = _t_quantile(0.5 + level / 2, n - 1) * std / math.sqrt(n)
        return Summary(n, mean, std, (mean - half, mean + half))
    if method != "bootstrap":
        raise PtmError(f"interval method {method!r}: use t or bootstrap")
    return Summary(n, mean, std, bootstrap_interval(values, level, resamples, seed))


def bootstrap_interval(values: Sequence[float], level: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean (Efron & Tibshirani 1993, ch. 13): the ``level`` percentiles of
    the means of ``resamples`` seeded resamples with replacement (e.g. over 0/1 correctness per test example)."""
    import numpy as np

    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return math.nan, math.nan
    means = data[np.random.default_rng(seed).integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def seed_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` Student-t interval of the mean over seeds (``nan, nan`` for fewer than 2 values)."""
    summary = summarize(values, level) if len(values) else None
    return summary.interval if summary is not None and summary.interval is not None else (math.nan, math.nan)


@dataclass(frozen=True)
class Paired:
    """A paired comparison of ``a`` against ``b`` on the same seeds: the mean difference ``a - b``, its 95 % t
    interval, the paired t-test's two-sided ``p_t`` and the exact sign-flip permutation ``p_perm``; ``significant``
    when the interval excludes 0."""

    n: int
    diff: Summary
    p_t: Optional[float]
    p_perm: Optional[float]

    @property
    def significant(self) -> bool:
        return self.diff.interval is not None and (self.diff.interval[0] > 0 or self.diff.interval[1] < 0)

    def text(self) -> str:
        """``+diff [low, high] p=<sign-flip p>`` with `` *`` when significant; one pair: the difference alone."""
        return diff_text(self.diff.mean, self.diff.interval, self.p_perm, self.significant)


def diff_text(diff: float, interval: Optional[Sequence[float]], p_perm: Optional[float], significant: bool) -> str:
    """A paired difference as the reports print it (``Paired.text``; also from a stored record of one)."""
    if interval is None:
        return f"{diff:+.4f} (1 pair: an observation)"
    low, high = interval
    return f"{diff:+.4f} [{low:+.4f}, {high:+.4f}] p={p_perm:.3g}{' *' if significant else ''}"


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
    """Compare two rows measured on the same seeds (``a[i]`` and ``b[i]`` share seed i)."""
    if len(a) != len(b):
        raise PtmError(f"a paired comparison needs the same seeds on both sides ({len(a)} against {len(b)} values)")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    summary = summarize(diffs)
    n = len(diffs)
    if n < 2:
        return Paired(n, summary, None, None)
    if summary.std == 0:
        p_t = 1.0 if summary.mean == 0 else 0.0
    else:
        from scipy.stats import t

        stat = summary.mean / (summary.std / math.sqrt(n))
        p_t = float(2 * t.sf(abs(stat), n - 1))
    observed = abs(sum(diffs))
    flips = list(itertools.product((1, -1), repeat=n)) if n <= 16 else None
    if flips is None:  # 2^n sign flips is too many: a seeded Monte Carlo sample of them
        rng = random.Random(0)
        flips = [tuple(rng.choice((1, -1)) for _ in range(n)) for _ in range(20_000)]
    extreme = sum(abs(sum(s * d for s, d in zip(signs, diffs))) >= observed - 1e-12 for signs in flips)
    return Paired(n, summary, p_t, extreme / len(flips))
