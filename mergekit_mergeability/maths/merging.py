"""The arithmetic of merging that the method and the precheck's rehearsal share: knowledge_weighted's
shares and defaults, TIES's trim threshold and its disjoint mean of the updates that agree in sign."""

from __future__ import annotations

from typing import Sequence

import torch

# Chosen by measurement on the project's fit pool of 86 single-fact experts of SmolLM2-135M
# (benchmarks/pools.py, `benchmarks/prediction.py methods fit`; README "knowledge_weighted's
# defaults"), never on the held-out pool: of τ ∈ {0.1, 0.3} with and without TIES (density 0.5),
# this one lifted the weakest-known third most (+0.35 over mean merging) and kept the most
# overall (0.801, TIES alone 0.799), for −0.06 on the strongest-known third.
DEFAULT_TEMPERATURE = 0.3
DEFAULT_TIES = True
DEFAULT_DENSITY = 0.5
DEFAULT_DENSITY_BY_KNOWLEDGE = False


def knowledge_weights(
    knowledge: Sequence[float], temperature: float = DEFAULT_TEMPERATURE, weight: Sequence[float] | None = None
) -> torch.Tensor:
    """w_i = softmax_i((1 − k_i) / temperature), times weight_i, renormalised to sum 1."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = (1 - torch.tensor(knowledge, dtype=torch.float64)) / temperature
    weights = torch.softmax(logits, dim=0)
    if weight is not None:
        weights = weights * torch.tensor(weight, dtype=torch.float64)
        if weights.sum() <= 0:
            raise ValueError("at least one model needs a positive weight")
        weights = weights / weights.sum()
    return weights


def threshold(delta: torch.Tensor, density: float) -> float:
    """The magnitude at or above which ``delta``'s entries are the ``density`` share largest (at least one)."""
    magnitude = delta.abs().reshape(-1).float()
    keep = max(1, int(density * magnitude.numel()))
    return float(torch.kthvalue(magnitude, magnitude.numel() - keep + 1).values)


def largest(delta: torch.Tensor, density: float) -> torch.Tensor:
    """Where ``delta``'s entries are among the ``density`` share largest in magnitude (at least one).

    The same entries as mergekit's magnitude sparsification, found with one selection
    (kthvalue) instead of a full sort: ~50× faster on a 1M-entry matrix. Entries tied
    with the threshold are kept too; for weights that happens only among zeros, which
    neither add nor vote."""
    return delta.abs() >= threshold(delta, density)


def elected(deltas: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """TIES's disjoint mean of stacked (trimmed) updates: per entry, the ``weights``-weighted mean
    of the updates whose sign agrees with the sign of their weighted sum (+ where it is 0), as
    mergekit's ``get_mask(method="sum")`` elects it."""
    weights = weights.reshape(-1, *([1] * (deltas.ndim - 1)))
    weighted = deltas * weights
    mask = weighted.sign() == torch.where(weighted.sum(dim=0) >= 0, 1.0, -1.0).to(weighted.dtype)
    divisor = (weights * mask).sum(dim=0)
    divisor[divisor == 0] = 1
    return (weighted * mask).sum(dim=0) / divisor


COMPARED = ("knowledge_weighted", "ties")  # the merges the precheck rehearses whole, to choose between them
