"""A small, monotone, interpretable predictor of mergeability, fitted on measured pools.

Each feature x_f has a prior direction d_f (+1: higher means more mergeable, −1: lower
does) from the research it comes from. Features are standardised with the training
mean and standard deviation, and the prediction is

    ŷ = ȳ + Σ_f w_f · d_f · (x_f − mean_f) / std_f,        w_f ≥ 0

fitted by non-negative least squares with a ridge penalty α·n·‖w‖². The constraint
w ≥ 0 makes ŷ monotone in every feature in its prior direction, and drops a feature
whose effect in the data runs against it (w_f = 0) instead of fitting noise. A missing
feature counts as the training mean (z = 0). Fitted ``within`` pools, features and target
are centred on their pool's mean first, so that no weight goes to a pool's level alone.

Out-of-sample quality is what counts: leave one model out, leave one pool out, and a
permutation null of the whole procedure (targets shuffled within pools, refitted), so
that a fit that finds structure in noise is caught (RESEARCH.md: fitting alone reaches
r ≈ 0.5 on noise with ~200 pairs).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Sequence

import numpy as np
from scipy.optimize import nnls

from mergekit_mergeability.maths.stats import spearman

RIDGE = 0.1


@dataclass(frozen=True)
class Linear:
    names: Sequence[str]
    directions: np.ndarray  # (features,) of ±1
    means: np.ndarray
    stds: np.ndarray
    weights: np.ndarray  # (features,) ≥ 0
    intercept: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.intercept + _standardise(x, self.means, self.stds) * self.directions @ self.weights

    def as_dict(self) -> Dict[str, object]:
        return {
            "intercept": self.intercept,
            "features": [
                {"name": n, "direction": int(d), "mean": float(m), "std": float(s), "weight": float(w)}
                for n, d, m, s, w in zip(self.names, self.directions, self.means, self.stds, self.weights)
            ],
        }

    @classmethod
    def from_dict(cls, data: Dict) -> "Linear":
        features = data["features"]
        column = lambda key: np.array([float(f[key]) for f in features])  # noqa: E731
        return cls(
            [f["name"] for f in features],
            column("direction"),
            column("mean"),
            column("std"),
            column("weight"),
            float(data["intercept"]),
        )


def fit(
    x: np.ndarray,
    y: np.ndarray,
    names: Sequence[str],
    directions: Sequence[int],
    ridge: float = RIDGE,
    groups: Optional[Sequence[str]] = None,
) -> Linear:
    """The weights by NNLS with a ridge penalty. With ``groups`` (each row's pool) they are fitted
    within pools: features and target centred on their pool's mean (pool fixed effects), so no
    weight is spent on why one pool's level differs from another's; the prediction is still
    ȳ + Σ w·d·(x − mean)/std with the fitted pools' means, so a new pool's level follows its features."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    means = np.nanmean(x, axis=0)
    varying, target = (x, y - y.mean()) if groups is None else (_centred(x, groups), _centred(y, groups))
    stds = np.nanstd(varying, axis=0)
    stds[~(stds > 0)] = np.inf  # a constant feature standardises to 0 and gets no weight
    d = np.asarray(directions, dtype=float)
    z = _standardise(varying, np.nanmean(varying, axis=0), stds) * d
    n, k = z.shape
    design = np.vstack([z, np.sqrt(ridge * n) * np.eye(k)])
    weights, _ = nnls(design, np.concatenate([target, np.zeros(k)]))
    return Linear(list(names), d, means, stds, weights, float(y.mean()))


def _centred(values: np.ndarray, groups: Sequence[str]) -> np.ndarray:
    """Each row minus its group's mean (NaN-aware, column by column)."""
    values, groups = np.array(values, dtype=float), np.asarray(groups)
    for g in dict.fromkeys(groups):
        inside = groups == g
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a feature no model of the pool has
            values[inside] -= np.nanmean(values[inside], axis=0)
    return values


def _standardise(x: np.ndarray, means: np.ndarray, stds: np.ndarray) -> np.ndarray:
    z = (np.asarray(x, dtype=float) - means) / stds
    return np.nan_to_num(z, nan=0.0)


def held_out_predictions(
    x: np.ndarray,
    y: np.ndarray,
    groups: Sequence[str],
    names,
    directions,
    by_group: bool = False,
    within: bool = False,
) -> np.ndarray:
    """Each model predicted by a fit that never saw it: leave one model out, or
    (``by_group``) leave its whole pool out; ``within``: each fit within pools (``fit``)."""
    x, y, groups = np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(groups)
    predictions = np.empty(len(y))
    folds = (
        [groups == g for g in dict.fromkeys(groups)] if by_group else [np.arange(len(y)) == i for i in range(len(y))]
    )
    for held in folds:
        model = fit(x[~held], y[~held], names, directions, groups=groups[~held] if within else None)
        predictions[held] = model.predict(x[held])
    return predictions


def within_pools(predicted: np.ndarray, y: np.ndarray, groups: Sequence[str]) -> float:
    """Spearman inside each pool, averaged with the pools' sizes as weights (pools differ in
    overall level, which a ranking inside a pool must not be credited for)."""
    groups = np.asarray(groups)
    values, sizes = [], []
    for g in dict.fromkeys(groups):
        inside = groups == g
        values.append(spearman(predicted[inside], y[inside]))
        sizes.append(int(inside.sum()))
    return float(np.average(values, weights=sizes))


def permutation_null(
    x: np.ndarray,
    y: np.ndarray,
    groups: Sequence[str],
    names,
    directions,
    permutations: int = 200,
    seed: int = 0,
    by_group: bool = False,
    within: bool = False,
) -> np.ndarray:
    """Held-out Spearman of the whole fitting procedure on targets shuffled within pools."""
    groups = np.asarray(groups)
    return np.array(
        [
            within_pools(
                held_out_predictions(x, shuffled, groups, names, directions, by_group, within), shuffled, groups
            )
            for shuffled in shuffled_within(y, groups, permutations, seed)
        ]
    )


def shuffled_within(y, groups: Sequence[str], permutations: int, seed: int = 0) -> Iterator[np.ndarray]:
    """``permutations`` copies of ``y``, each shuffled within every pool of ``groups``."""
    rng = np.random.default_rng(seed)
    y, groups = np.asarray(y, dtype=float), np.asarray(groups)
    for _ in range(permutations):
        shuffled = y.copy()
        for g in dict.fromkeys(groups):
            inside = np.flatnonzero(groups == g)
            shuffled[inside] = y[rng.permutation(inside)]
        yield shuffled


def p_value(observed: float, null: np.ndarray) -> float:
    """One-sided: how often the procedure does at least as well on shuffled targets."""
    return float((1 + np.sum(null >= observed - 1e-12)) / (len(null) + 1))


def single_features(x: np.ndarray, y: np.ndarray, groups: Sequence[str], names, directions) -> Dict[str, float]:
    """Each feature alone in its prior direction: nothing is fitted, so this is out of sample."""
    x = np.asarray(x, dtype=float)
    scores: Dict[str, float] = {}
    for j, (name, d) in enumerate(zip(names, directions)):
        column = x[:, j]
        known = ~np.isnan(column)
        if known.sum() >= 3:
            scores[name] = within_pools(d * column[known], np.asarray(y, dtype=float)[known], np.asarray(groups)[known])
    return scores


def best(scores: Dict[str, float]) -> Optional[str]:
    return max(scores, key=scores.get) if scores else None
