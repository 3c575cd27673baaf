"""The statistics across seeds that `rlvr plot`, `rlvr report` and `rlvr summary` share (seed 004 §4.3: runs
vary a lot between seeds, so plot the mean with a 95% interval, here Student's t-interval
mean ± t(0.975, n-1)·s/√n, s the sample standard deviation, n the runs at that step; with 2-3 seeds the normal
quantile 1.96 would make it 2-6x too narrow), intervals of bounded metrics clipped to their range, differences
between groups, and how many runs or questions would resolve one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

Z95 = 1.96


# Student's t quantile t(0.975, df): the 95 % two-sided interval's factor for df = n - 1 degrees of freedom
_T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060, 9: 2.2622,
         10: 2.2281, 11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314, 16: 2.1199, 17: 2.1098,
         18: 2.1009, 19: 2.0930, 20: 2.0860, 21: 2.0796, 22: 2.0739, 23: 2.0687, 24: 2.0639, 25: 2.0595,
         26: 2.0555, 27: 2.0518, 28: 2.0484, 29: 2.0452, 30: 2.0423, 40: 2.0211, 60: 2.0003, 120: 1.9799}


Band = Literal["ci", "minmax"]


def t_quantile(df: int) -> float:
    """t(0.975, df), the factor of a 95 % t-interval: 12.706 for df = 1 (2 runs), 4.303 for df = 2 (3 runs),
    2.262 for df = 9 (10 runs); between the table's entries above 30, linear in 1/df (exact to 1e-3); 1.96 in
    the limit."""
    if df < 1:
        raise ValueError(f"a t-interval needs df >= 1 (2 or more values); got df={df}")
    if df in _T975:
        return _T975[df]
    known = sorted(_T975)
    upper = next((k for k in known if k > df), None)
    lower = max(k for k in known if k < df)
    t_hi, x_hi = (_T975[upper], 1 / upper) if upper is not None else (Z95, 0.0)
    x = 1 / df
    return t_hi + (_T975[lower] - t_hi) * (x - x_hi) / (1 / lower - x_hi)


@dataclass(frozen=True)
class Spread:
    """Mean and spread of n values: `half_width` = t(0.975, n-1)·s/√n, the 95 % t-interval, with s the sample
    std (NaN when n = 1)."""

    mean: float
    std: float
    half_width: float
    min: float
    max: float
    n: int

    def band(self, kind: Band = "ci", bounds: tuple[float, float] | None = None) -> tuple[float, float]:
        """The band to draw: min-max, or the t-interval, clipped to `bounds` (the metric's range: an accuracy
        band never leaves [0, 1], whatever 2 seeds' t(0.975, 1) = 12.7 makes of it)."""
        if kind == "minmax":
            return self.min, self.max
        if math.isnan(self.half_width):
            return self.mean, self.mean
        lo, hi = self.mean - self.half_width, self.mean + self.half_width
        if bounds is not None:
            lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
        return lo, hi

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def metric_bounds(key: str) -> tuple[float, float] | None:
    """The range of a bounded metric by its name: accuracies, rates, fractions and pass@k lie in [0, 1]."""
    name = key.rsplit("/", 1)[-1]
    if name.endswith(("accuracy", "_rate", "fraction", "zero_std")) or name.startswith("pass@") or name in (
            "answer_reward", "format_reward"):
        return (0.0, 1.0)
    return None


def spread(values: Sequence[float]) -> Spread:
    """spread([0.2, 0.4, 0.6]): mean 0.4, s = sqrt((0.04 + 0 + 0.04) / 2) = 0.2, half width 4.303·0.2/√3."""
    n = len(values)
    if n == 0:
        raise ValueError("spread of no values")
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    half = t_quantile(n - 1) * std / math.sqrt(n) if n > 1 else math.nan
    return Spread(mean, std, half, min(values), max(values), n)


@dataclass(frozen=True)
class Difference:
    """mean(a) - mean(b) with its 95 % two-sample t-interval (pooled variance, df = na + nb - 2), and how many
    runs per group the same variance would need for an interval that excludes 0 (`runs_to_resolve`, None when
    the means are equal or the variance is unknown)."""

    mean: float
    half_width: float
    df: int
    runs_to_resolve: int | None
    variance: float = math.nan  # the pooled per-run variance the interval rests on

    @property
    def resolved(self) -> bool:
        """The difference is larger than the spread: its 95 % interval excludes 0."""
        return not math.isnan(self.half_width) and abs(self.mean) > self.half_width

    def to_dict(self) -> dict:
        return {**{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()},
                "resolved": self.resolved}


def runs_to_resolve(delta: float, variance: float, most: int = 10_000) -> int | None:
    """The fewest runs n per group for which t(0.975, 2n-2)·sqrt(2·variance/n) < |delta|: the seeds a
    comparison of two groups needs, if each run varies as much as these did."""
    if delta == 0 or math.isnan(variance):
        return None
    for n in range(2, most + 1):
        if t_quantile(2 * n - 2) * math.sqrt(2 * variance / n) < abs(delta):
            return n
    return None


def difference(a: Sequence[float], b: Sequence[float]) -> Difference:
    """difference([0.6, 0.7, 0.8], [0.5, 0.6, 0.7]): 0.1 +- t(0.975, 4)·sqrt(0.01·(1/3 + 1/3)) = 0.1 +- 0.227,
    not resolved; 9 runs per group would resolve it (t(16) = 2.120: 2.120·sqrt(0.02/9) = 0.0999)."""
    na, nb = len(a), len(b)
    if na == 0 or nb == 0:
        raise ValueError("a difference needs values on both sides")
    mean_a, mean_b = sum(a) / na, sum(b) / nb
    delta, df = mean_a - mean_b, na + nb - 2
    if df < 1:  # one run a side: no run-to-run variance measured
        return Difference(delta, math.nan, 0, None)
    variance = (sum((x - mean_a) ** 2 for x in a) + sum((x - mean_b) ** 2 for x in b)) / df
    half = t_quantile(df) * math.sqrt(variance * (1 / na + 1 / nb))
    return Difference(delta, half, df, runs_to_resolve(delta, variance), variance)


def questions_to_resolve(delta: float, variance: float, accuracy: float, questions: int, runs: int) -> int | None:
    """How many validation questions would resolve `delta` with `runs` runs per group, if the runs' variance is a
    binomial part accuracy·(1 - accuracy)/questions (which questions a run is scored on) plus a training part
    that more questions cannot shrink: the smallest Q with t(0.975, 2·runs - 2)·sqrt(2·(training +
    accuracy·(1 - accuracy)/Q)/runs) < |delta|. None when even exact scoring would not resolve it (or nothing
    is measured). difference 0.1, variance 0.0025, accuracy 0.7, 300 questions, 3 runs: training = 0.0025 -
    0.0007 = 0.0018, and 0.21 / (0.01·3 / (2·2.7764²) - 0.0018) = 1439.3, so 1440."""
    if delta == 0 or math.isnan(variance) or runs < 2:
        return None
    binomial = accuracy * (1 - accuracy)
    training = max(variance - binomial / questions, 0.0)
    room = delta ** 2 * runs / (2 * t_quantile(2 * runs - 2) ** 2) - training  # what the binomial part may be
    if room <= 0:
        return None
    return math.floor(binomial / room) + 1
