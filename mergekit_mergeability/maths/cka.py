"""Linear centred kernel alignment between two sets of representations.

Rows are examples (one pooled hidden state per probe instance), columns features.

    biased:     CKA(X, Y) = ‖YᵀX‖²_F / (‖XᵀX‖_F · ‖YᵀY‖_F)      on column-centred X, Y
    unbiased:   HSIC₁ of Song et al. (2012) on Gram matrices with zeroed diagonals
    minibatch:  mean HSIC₁(K, L) / sqrt(mean HSIC₁(K, K) · mean HSIC₁(L, L))   (Nguyen et al. 2021)

The biased form is what arXiv 2604.02881 reports; it is biased upwards when
examples are few relative to features, which the unbiased estimator corrects.
"""

from __future__ import annotations

import math
from typing import Iterable, List

import torch


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F) of the centred rows; with fewer rows than features, the same
    sums from the rows' Gram matrices (‖YᵀX‖²_F = Σ (XXᵀ ∘ YYᵀ), ‖XᵀX‖_F = ‖XXᵀ‖_F): n² features
    products instead of features² rows."""
    x, y = _centred(x), _centred(y)
    if x.shape[0] < x.shape[1]:
        k, l = x @ x.T, y @ y.T
        return float((k * l).sum() / (k.norm() * l.norm()))
    cross = (y.T @ x).square().sum()
    return float(cross / ((x.T @ x).norm() * (y.T @ y).norm()))


def unbiased_hsic(k: torch.Tensor, l: torch.Tensor) -> float:
    """HSIC₁ of two n×n Gram matrices (n ≥ 4); the diagonals are ignored."""
    n = k.shape[0]
    if n < 4:
        raise ValueError(f"unbiased HSIC needs at least 4 examples, got {n}")
    k, l = _zero_diagonal(k.double()), _zero_diagonal(l.double())
    ones = torch.ones(n, dtype=torch.float64)
    trace = (k * l.T).sum()
    product_of_sums = (ones @ k @ ones) * (ones @ l @ ones) / ((n - 1) * (n - 2))
    cross = 2 / (n - 2) * (ones @ k @ l @ ones)
    return float((trace + product_of_sums - cross) / (n * (n - 3)))


def minibatch_cka(x: torch.Tensor, y: torch.Tensor, batch_size: int = 0) -> float:
    """Unbiased (minibatch) CKA; ``batch_size`` 0 means one batch of all rows."""
    xy = xx = yy = 0.0
    for rows in _batches(x.shape[0], batch_size):
        k, l = _gram(x[rows]), _gram(y[rows])
        xy += unbiased_hsic(k, l)
        xx += unbiased_hsic(k, k)
        yy += unbiased_hsic(l, l)
    denominator = math.sqrt(max(xx, 0.0) * max(yy, 0.0))
    return xy / denominator if denominator > 0 else float("nan")


def layerwise(
    x_layers: torch.Tensor, y_layers: torch.Tensor, unbiased: bool = False, batch_size: int = 0
) -> List[float]:
    """CKA per layer for two stacks shaped (layers, examples, features)."""
    if unbiased:
        return [minibatch_cka(x, y, batch_size) for x, y in zip(x_layers, y_layers)]
    return [linear_cka(x, y) for x, y in zip(x_layers, y_layers)]


def shared_depth(curve: Iterable[float], threshold: float) -> int:
    """The first index from which the curve stays below ``threshold``, ignoring one-layer dips.

    A median over each index and its neighbours (mirrored at the ends) removes a
    single dip below, or a single spike above, the threshold: the last layer's
    output, after the final norm, often rises alone. Returns ``len(curve)`` when
    the curve never settles below it.
    """
    values = [float(v) for v in curve]
    padded = values[1:2] + values + values[-2:-1] if len(values) > 1 else values * 3
    smooth = [_median(padded[i : i + 3]) for i in range(len(values))]
    depth = len(values)
    for i in range(len(values) - 1, -1, -1):
        if smooth[i] >= threshold:
            break
        depth = i
    return depth


def _median(window: List[float]) -> float:
    ordered = sorted(window)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _centred(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x - x.mean(dim=0, keepdim=True)


def _gram(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x @ x.T


def _zero_diagonal(m: torch.Tensor) -> torch.Tensor:
    return m - torch.diag(torch.diagonal(m))


def _batches(n: int, batch_size: int):
    size = n if batch_size <= 0 else batch_size
    starts = range(0, n, size)
    # a short last batch would fail HSIC₁ (n ≥ 4): fold it into the one before
    bounds = [(s, min(s + size, n)) for s in starts]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < 4:
        bounds[-2:] = [(bounds[-2][0], n)]
    return [slice(a, b) for a, b in bounds]
