"""Group-specific MLP neurons: LAPE (Tang et al. 2024, arXiv 2402.16438), as paper 3 uses it.

``p[g, l, j]``: the share of group g's span tokens on which neuron j of layer l is active
(its activation > 0). Per neuron, the probabilities over the G groups are normalised to a
distribution and its entropy taken, divided by log G (0: fires for one group only,
1: alike for all):

    p̃[g] = p[g] / Σ_g p[g]        H = −Σ_g p̃[g] log p̃[g] / log G

As in Tang et al.'s code, a neuron is a candidate only if some group's p is above the
activation bar, the ``activation_quantile`` of ALL the p values (every group, layer and
neuron; the bar is the k-th smallest value, k = round(n · quantile), and "above" is
strict). Of all neurons (every layer together), the round(n · ``entropy_quantile``) with
the lowest entropy are group-specific, ties broken by position; candidates come first. A
specific neuron belongs to every group whose p is above the same bar.

One addition: a neuron above the bar for EVERY group is not a candidate. It serves all
groups alike; with few groups (two experts) the 10% quota would otherwise fill up with
such neurons, "specific" to everything.
"""

from __future__ import annotations

import numpy as np

ENTROPY_QUANTILE = 0.10  # paper 3 keeps the 10% lowest-entropy neurons (Tang et al.: 1%)
ACTIVATION_QUANTILE = 0.80  # paper 3's bar: the 80th percentile of all activation probabilities


def normalised_entropy(p: np.ndarray) -> np.ndarray:
    """(G, L, N) probabilities -> (L, N) entropy over groups / log G; 0 for a neuron that never fires."""
    groups = p.shape[0]
    if groups < 2:
        raise ValueError(f"LAPE needs at least 2 groups, got {groups}")
    total = p.sum(axis=0)
    shares = np.divide(p, total, out=np.zeros_like(p, dtype=float), where=total > 0)
    terms = np.where(shares > 0, -shares * np.log(np.where(shares > 0, shares, 1.0)), 0.0)
    return terms.sum(axis=0) / np.log(groups)


def kth_smallest(values: np.ndarray, quantile: float) -> float:
    """torch.kthvalue(values, round(n · quantile)), as Tang et al. take their bars."""
    flat = np.sort(values, axis=None)
    return float(flat[max(round(flat.size * quantile), 1) - 1])


def specific(p: np.ndarray, entropy_quantile: float = ENTROPY_QUANTILE, activation_quantile: float = ACTIVATION_QUANTILE) -> np.ndarray:
    """(G, L, N) activation probabilities -> (G, L, N) bool: neuron j of layer l is specific to group g."""
    p = np.asarray(p, dtype=float)
    bar = kth_smallest(p, activation_quantile)
    above = p > bar
    candidate = above.any(axis=0) & ~above.all(axis=0)
    entropy = np.where(candidate, normalised_entropy(p), np.inf)
    keep = round(entropy.size * entropy_quantile)
    chosen = np.zeros(entropy.size, dtype=bool)
    chosen[np.argsort(entropy, axis=None, kind="stable")[:keep]] = True
    return above & (candidate & chosen.reshape(entropy.shape))[None]


def counts(mask: np.ndarray) -> np.ndarray:
    """(G, L, N) specific-neuron mask -> (G, L) number of specific neurons per group and layer."""
    return mask.sum(axis=2)


def jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(G, L) |A ∩ B| / |A ∪ B| of two models' specific-neuron sets; NaN where both are empty."""
    union = (a | b).sum(axis=2)
    both = (a & b).sum(axis=2)
    return np.divide(both, union, out=np.full(union.shape, np.nan), where=union > 0)


def overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(L,) mean Jaccard over the groups where either model has specific neurons; NaN where none has."""
    per_group = jaccard(a, b)
    seen = ~np.isnan(per_group)
    total = np.where(seen, per_group, 0.0).sum(axis=0)
    return np.divide(total, seen.sum(axis=0), out=np.full(total.shape, np.nan), where=seen.any(axis=0))


def collisions(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(L,) neurons specific in both models but to different groups: what a merge would average
    across two groups' uses."""
    either_a, either_b = a.any(axis=0), b.any(axis=0)
    return (either_a & either_b & (a != b).any(axis=0)).sum(axis=1)


def specific_union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(L,) neurons specific (to any group) in either model."""
    return (a.any(axis=0) | b.any(axis=0)).sum(axis=1)
