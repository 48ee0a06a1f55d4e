"""The arithmetic of merging that the method and the precheck's rehearsal share: knowledge_weighted's
shares and defaults, TIES's trim threshold and its disjoint mean of the updates that agree in sign."""

from __future__ import annotations

from typing import Callable, Iterator, Sequence, Tuple

import torch

# Chosen across pool families (docs/prediction.md, "Seventh candidate"; written down first in
# research/pools/prereg/kw_temperature.txt): τ 1 meets the three aims (weakest-known third
# ≥ +0.15 over mean merging, strongest within 0.03, overall ≥ TIES) on two of the measured
# families (heldout, lora), τ 0.3, the default chosen on the fit pool alone, on one (heldout).
DEFAULT_TEMPERATURE = 1.0
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


RADIX = 1 << 16  # a float32's bits are read as two digits of 16


def threshold(delta: torch.Tensor, density: float) -> float:
    """The magnitude at or above which ``delta``'s entries are the ``density`` share largest (at least one)."""
    return threshold_in_blocks(lambda: iter(delta.reshape(-1).split(1 << 20)), density)


def threshold_in_blocks(blocks: Callable[[], Iterator[torch.Tensor]], density: float) -> float:
    """``threshold`` of the tensor that ``blocks()`` yields piece by piece (it is called twice), never
    held whole: the k-th largest magnitude, selected on the bits of its float32 value (those of a
    value ≥ 0 sort as the values do), the high 16 first, then the low 16 among entries sharing them."""
    high, count = torch.zeros(RADIX, dtype=torch.int64), 0
    for block in blocks():
        bits = _bits(block)
        high += torch.bincount(bits >> 16, minlength=RADIX)
        count += bits.numel()
    top, rank = _digit(high, max(1, int(density * count)))
    low = torch.zeros(RADIX, dtype=torch.int64)
    for block in blocks():
        bits = _bits(block)
        low += torch.bincount(bits[(bits >> 16) == top] & (RADIX - 1), minlength=RADIX)
    bottom, _ = _digit(low, rank)
    return torch.tensor([top << 16 | bottom], dtype=torch.int32).view(torch.float32).item()


def _bits(block: torch.Tensor) -> torch.Tensor:
    return block.detach().float().abs().reshape(-1).view(torch.int32).long()


def _digit(counts: torch.Tensor, rank: int) -> Tuple[int, int]:
    """The digit whose entries hold the ``rank``-th largest (counts per digit value), and that
    entry's rank among them."""
    from_top = counts.flip(0).cumsum(0)
    index = int(torch.searchsorted(from_top, torch.tensor(rank)))
    return RADIX - 1 - index, rank - (int(from_top[index - 1]) if index else 0)


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
