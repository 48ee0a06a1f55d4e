"""Candidates built from the updates themselves, not from a config's plan: a weighted sum of
updates (a model alone, a share of it, a mixture) and a TIES merge of them, each tensor in float32
from whole tensors as one block of the walk reads them (``stream.Read``), equal to the same merge
written a row block at a time.

    θ_base + Σ_j share_j·τ_j                          (``summed``)
    θ_base + scale·elect(trim_density(w_j·τ_j))      (``ties``: ``maths.merging.elected``)
"""

from __future__ import annotations

from typing import Sequence, Set, Tuple

import torch

from mergekit_mergeability.maths.merging import elected, threshold
from mergekit_mergeability.rehearsal.stream import Candidate, Read

Share = Tuple[
    str, float, Set[str]
]  # a model (as the walk's reads name it), its share or weight, the tensors it changes


def summed(name: str, base: str, shares: Sequence[Share]) -> Candidate:
    """θ_base + Σ share_j·(θ_j − θ_base), each model's update where it changes the tensor."""

    def build(tensor: str, read: Read) -> torch.Tensor:
        mine = read(base, tensor).float()
        moved = mine.clone()
        for model, share, touched in shares:
            if tensor in touched:
                moved += share * (read(model, tensor).float() - mine)
        return moved

    return Candidate(name, build)


def ties(name: str, base: str, members: Sequence[Share], density: float, scale: float = 1.0) -> Candidate:
    """TIES over ``members`` (model, weight, tensors it changes): each update trimmed to its
    ``density`` share of largest entries, signs elected, the disjoint weighted mean added times
    ``scale`` (mergekit's ``lambda``)."""

    def build(tensor: str, read: Read) -> torch.Tensor:
        mine = read(base, tensor).float()
        present = [(model, weight) for model, weight, touched in members if tensor in touched]
        if not present:
            return mine
        deltas = torch.stack([read(model, tensor).float() - mine for model, _ in present])
        cuts = torch.tensor([threshold(delta, density) for delta in deltas]).reshape(-1, *([1] * mine.dim()))
        weights = torch.tensor([weight for _, weight in present])
        return mine + scale * elected(deltas * (deltas.abs() >= cuts), weights)

    return Candidate(name, build)
