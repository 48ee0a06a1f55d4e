"""Rank correlation with the two checks every mergeability claim needs.

A correlation over a handful of models is easy to get by luck, so it is always
reported with a permutation p-value (how often shuffled labels do as well) and a
percentile bootstrap 95% interval (how much it moves when the models are resampled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
from scipy.stats import rankdata, spearmanr


@dataclass(frozen=True)
class Correlation:
    spearman: float
    p_permutation: float  # two-sided
    interval: Tuple[float, float]  # bootstrap 95%
    n: int
    permutations: int
    resamples: int


def mean_interval(values: Sequence[float], seed: int = 0, resamples: int = 2_000) -> Tuple[float, Tuple[float, float]]:
    """The mean, with a percentile bootstrap 95% interval (values resampled with replacement)."""
    values = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    boot = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(values.mean()), (float(low), float(high))


def ratio_interval(
    a: Sequence[float], b: Sequence[float], seed: int = 0, resamples: int = 2_000
) -> Tuple[float, Tuple[float, float]]:
    """Σa / Σb over paired items (the tasks one plan keeps against another's), with a percentile
    bootstrap 95% interval: the pairs resampled with replacement."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    boot = a[picks].sum(axis=1) / np.maximum(b[picks].sum(axis=1), 1e-12)
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(a.sum() / b.sum()), (float(low), float(high))


def standard_error(values: Sequence[float]) -> Optional[float]:
    """The mean's standard error over ``values`` (sample standard deviation / √n, as lm-eval reports
    ``*_stderr``); None under two values."""
    values = np.asarray(values, dtype=float)
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) >= 2 else None


Z95 = 1.959963984540054  # the standard normal's 97.5th percentile: two-sided 95%


def wilson_interval(successes: float, n: int, z: float = Z95) -> Optional[Tuple[float, float]]:
    """Wilson's score interval for a proportion of ``successes`` in ``n`` (95% by default): unlike
    p ± z·SE it is never zero-width, so 16 items all right give [0.806, 1], not [1, 1]. None for n = 0."""
    if n <= 0:
        return None
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def mean_score_interval(values: Sequence[float], z: float = Z95) -> Optional[Tuple[float, float]]:
    """A 95% interval for the mean of per-item scores in [0, 1] (p(gold)): Wilson's interval at the
    mean, as wide as for as many items each right or wrong. A score in [0, 1] varies at most as a
    right-or-wrong item of the same mean does (variance ≤ m(1 − m)), so the interval is never
    narrower than the items allow, and scores all at 1 (or 0) still leave it the width that many
    items right (or wrong) have. For 0/1 scores it is ``wilson_interval`` itself. None for no values."""
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return None
    return wilson_interval(float(np.clip(values.mean(), 0.0, 1.0)) * len(values), len(values), z)


def grouped_difference(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], resamples: int = 2_000, seed: int = 0
) -> Tuple[float, Tuple[float, float]]:
    """The mean over groups of each group's mean of a − b (paired item by item), with a percentile
    bootstrap 95% interval that resamples the items within each group (the same items for a and b,
    so the noise they share cancels)."""
    rng = np.random.default_rng(seed)
    pairs = [np.asarray(x, dtype=float) - np.asarray(y, dtype=float) for x, y in zip(a, b)]
    boot = np.mean([d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1) for d in pairs], axis=0)
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(np.mean([d.mean() for d in pairs])), (float(low), float(high))


def paired_margin(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> Tuple[float, float]:
    """The mean over groups of each group's mean of a − b (paired item by item), and its standard
    error: √(Σ_g s_g² / n_g) / G, s_g the sample standard deviation of group g's differences (0
    where it has one item), n_g its items, G the groups."""
    pairs = [np.asarray(x, dtype=float) - np.asarray(y, dtype=float) for x, y in zip(a, b)]
    spread = sum(d.var(ddof=1) / len(d) for d in pairs if len(d) > 1)
    return float(np.mean([d.mean() for d in pairs])), float(np.sqrt(spread) / len(pairs))


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's ρ; 0 when either side is constant (a resample can draw one value only)."""
    if np.ptp(np.asarray(x, dtype=float)) == 0 or np.ptp(np.asarray(y, dtype=float)) == 0:
        return 0.0
    value = spearmanr(x, y).statistic
    return float(value) if np.isfinite(value) else 0.0


def correlate(
    x: Sequence[float], y: Sequence[float], permutations: int = 10_000, resamples: int = 2_000, seed: int = 0
) -> Correlation:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) != len(y) or len(x) < 3:
        raise ValueError(f"need at least 3 paired values, got {len(x)} and {len(y)}")
    rng = np.random.default_rng(seed)
    observed = spearman(x, y)
    null = _permuted_spearman(x, y, permutations, rng)
    # +1 in numerator and denominator: the observed labelling is one of the permutations
    p = (1 + np.sum(np.abs(null) >= abs(observed) - 1e-12)) / (permutations + 1)
    draws = rng.integers(0, len(x), size=(resamples, len(x)))
    boot = np.array([spearman(x[d], y[d]) for d in draws])
    low, high = np.percentile(boot, [2.5, 97.5])
    return Correlation(observed, float(p), (float(low), float(high)), len(x), permutations, resamples)


def _permuted_spearman(x: np.ndarray, y: np.ndarray, permutations: int, rng) -> np.ndarray:
    """Spearman for many shufflings of y at once: Pearson of ranks, ranks computed once."""
    rx, ry = (rankdata(v) for v in (x, y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    scale = np.sqrt((rx**2).sum() * (ry**2).sum())
    if scale == 0:
        return np.zeros(permutations)
    shuffled = ry[rng.permuted(np.tile(np.arange(len(ry)), (permutations, 1)), axis=1)]
    return shuffled @ rx / scale


def difference(
    a: Sequence[float], b: Sequence[float], y: Sequence[float], resamples: int = 2_000, seed: int = 0
) -> Tuple[float, Tuple[float, float]]:
    """Spearman(a, y) − Spearman(b, y), with a paired percentile bootstrap 95% interval
    (the same resampled models for both, so their shared noise cancels)."""
    a, b, y = (np.asarray(v, dtype=float) for v in (a, b, y))
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(y), size=(resamples, len(y)))
    boot = np.array([spearman(a[d], y[d]) - spearman(b[d], y[d]) for d in draws])
    low, high = np.percentile(boot, [2.5, 97.5])
    return spearman(a, y) - spearman(b, y), (float(low), float(high))
