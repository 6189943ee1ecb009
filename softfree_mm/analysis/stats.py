"""The statistics of every grid's report: means and spreads, paired differences and t-intervals, each interval with
its unit of analysis named (the thing its n counts: seeds, kernels, (kernel, seed) pairs).

One convention: a sample standard deviation (n - 1) and an interval need at least two values; with one value both
are None, never 0. Intervals are two-sided t-intervals of the mean, ``mean +- t(level, n - 1) * std / sqrt(n)``.
"""
import math
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Iterable, Mapping, Optional, Tuple


def mean_std(values: Iterable[Optional[float]]) -> Tuple[Optional[float], Optional[float], int]:
    """(mean, sample standard deviation, n) of the values that are not None; (None, None, 0) without any, std None
    with one."""
    vals = [float(v) for v in values if v is not None]
    n = len(vals)
    if not n:
        return None, None, 0
    m = math.fsum(vals) / n
    if n < 2:
        return m, None, 1
    return m, math.sqrt(math.fsum((v - m) ** 2 for v in vals) / (n - 1)), n


def t_quantile(dof: int, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of Student's t with ``dof`` degrees of freedom (dof >= 1)."""
    if dof < 1:
        raise ValueError(f't_quantile: degrees of freedom must be >= 1, got {dof}')
    from scipy.stats import t
    return float(t.ppf(0.5 + level / 2, dof))


@dataclass(frozen=True)
class Interval:
    """The mean of n values of one unit of analysis and the half-width of its t-interval (None with n < 2)."""
    mean: Optional[float]
    half: Optional[float]
    n: int
    unit: str
    level: float = 0.95

    @property
    def low(self) -> Optional[float]:
        return None if self.half is None else self.mean - self.half

    @property
    def high(self) -> Optional[float]:
        return None if self.half is None else self.mean + self.half

    @property
    def holds_zero(self) -> Optional[bool]:
        """Whether the interval holds 0 (None without an interval)."""
        return None if self.half is None else self.low <= 0 <= self.high

    def text(self, digits: int = 2) -> str:
        """'+0.97 [-0.01, +1.95] (95 %, n = 5 seeds)'; without an interval the mean and n alone."""
        if self.mean is None:
            return f'no value (n = 0 {self.unit})'
        head = f'{self.mean:+.{digits}f}'
        if self.half is None:
            return f'{head} (n = {self.n} {self.unit}: no interval)'
        return (f'{head} [{self.low:+.{digits}f}, {self.high:+.{digits}f}] ({self.level:.0%}, n = {self.n} '
                f'{self.unit})').replace('%', ' %', 1)


def interval(values: Iterable[Optional[float]], unit: str, level: float = 0.95) -> Interval:
    """The t-interval of the mean of ``values`` (one value per unit of analysis, ``unit`` names it)."""
    m, s, n = mean_std(values)
    half = None if s is None else t_quantile(n - 1, level) * s / math.sqrt(n)
    return Interval(m, half, n, unit, level)


def differences(values: Mapping[Hashable, Optional[float]],
                against: Mapping[Hashable, Optional[float]]) -> Dict[Hashable, float]:
    """``values[key] - against[key]`` for the keys both hold with a value."""
    return {k: values[k] - against[k] for k in values
            if k in against and values[k] is not None and against[k] is not None}


def unit_means(diffs: Mapping[Hashable, float], unit_of: Callable[[Hashable], Hashable]) -> Dict[Hashable, float]:
    """The mean of the values of each unit (``unit_of(key)``), in the order units first appear."""
    groups: Dict[Hashable, list] = {}
    for key, v in diffs.items():
        groups.setdefault(unit_of(key), []).append(v)
    return {u: math.fsum(vs) / len(vs) for u, vs in groups.items()}


def paired(values: Mapping[Hashable, Optional[float]], against: Mapping[Hashable, Optional[float]], unit: str,
           unit_of: Optional[Callable[[Hashable], Hashable]] = None, level: float = 0.95) -> Interval:
    """The paired difference ``values - against`` over the keys both hold, as a t-interval over units: each key its
    own unit (``unit_of`` None), or the keys' differences averaged within ``unit_of(key)`` first (runs that share a
    teacher or a seed are one unit, not several)."""
    d = differences(values, against)
    per_unit = d if unit_of is None else unit_means(d, unit_of)
    return interval(per_unit.values(), unit, level)
