"""Group-specific MLP neurons: LAPE (Tang et al. 2024, arXiv 2402.16438), as paper 3 uses it.

``p[g, l, j]``: the share of group g's span tokens on which neuron j of layer l is active
(its activation > 0). Per neuron, the probabilities over the G groups are normalised to a
distribution and its entropy taken, divided by log G (0: fires for one group only,
1: alike for all):

    p̃[g] = p[g] / Σ_g p[g]        H = −Σ_g p̃[g] log p̃[g] / log G

As in Tang et al.'s code, a neuron is a candidate only if some group's p is above the
activation bar, the ``activation_quantile`` of all the p values (every group, layer and
neuron; the bar is the k-th smallest value, k = round(n · quantile), and "above" is
strict), and the ``entropy_quantile`` share of all neurons (every layer together) with
the lowest entropy, candidates first, is group-specific. A specific neuron belongs to
every group whose p is above the bar.

Two departures, both so that models can be compared block by block:
- The bar and the entropy cut (the entropy of the last neuron the quota keeps) are taken
  once over all the compared models' values together (``thresholds``) and applied to each
  (``specific``). Per model, a change in the upper blocks moved the bar and the quota's
  edge, and so the selection in untouched lower blocks: measured on the demo's
  shared-target translators, Jaccard 0.45–0.72 between blocks with identical weights. The quota is a threshold, so neurons tied
  with the last one kept are kept too.
- A neuron above the bar for EVERY group is not a candidate: it serves all groups alike,
  and with few groups (two experts) the quota would otherwise fill up with such neurons.
"""

from __future__ import annotations

from typing import Sequence, Tuple

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


def _ranked_entropy(p: np.ndarray, bar: float) -> np.ndarray:
    """(L, N) normalised entropy of the candidates; inf for the others (never kept)."""
    above = p > bar
    candidate = above.any(axis=0) & ~above.all(axis=0)
    return np.where(candidate, normalised_entropy(p), np.inf)


def thresholds(
    probabilities: Sequence[np.ndarray],
    entropy_quantile: float = ENTROPY_QUANTILE,
    activation_quantile: float = ACTIVATION_QUANTILE,
) -> Tuple[float, float]:
    """(activation bar, entropy cut) over the models' (G, L, N) probabilities together."""
    bar = kth_smallest(np.stack(probabilities), activation_quantile)
    return bar, kth_smallest(np.stack([_ranked_entropy(p, bar) for p in probabilities]), entropy_quantile)


def specific(p: np.ndarray, bar: float, cut: float) -> np.ndarray:
    """(G, L, N) activation probabilities -> (G, L, N) bool: neuron j of layer l is specific to group g."""
    entropy = _ranked_entropy(p, bar)
    return (p > bar) & ((entropy <= cut) & np.isfinite(entropy))[None]


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
