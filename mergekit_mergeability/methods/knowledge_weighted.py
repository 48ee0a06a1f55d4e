"""Knowledge-weighted merging (Will it Merge?, arXiv 2601.06672).

    θ = θ_base + scale · Σ_i w_i (θ_i − θ_base),
    w_i ∝ weight_i · exp((1 − k_i) / temperature),   Σ_i w_i = 1

k_i is the base model's knowledge of model i's task (its accuracy there, as
``precheck`` measures it). Updates on what the base knows least are the ones a
plain average loses, so they get the larger share. temperature → ∞ is the mean.
With ``ties: true`` each update is first trimmed to its top-``density`` entries
by magnitude and signs are elected, as in mergekit's ``ties``. With
``density_by_knowledge: true`` an update is trimmed the less the better its
task is known: its density becomes d_i + (1 − d_i) · k_i (all of it kept at
k_i = 1), so the small updates the base barely needed lose nothing to the trim.
"""

from __future__ import annotations


import torch
from mergekit.merge_methods import BasePolicy, InputContract, PerNonBase, TensorGroup, merge_method
from pydantic import Field
from typing_extensions import Annotated

from mergekit_mergeability.maths.merging import (  # noqa: F401 (knowledge_weights: the method's API)
    DEFAULT_DENSITY,
    DEFAULT_DENSITY_BY_KNOWLEDGE,
    DEFAULT_TEMPERATURE,
    DEFAULT_TIES,
    elected,
    knowledge_weights,
    largest,
)

Knowledge = Annotated[float, Field(ge=0, le=1)]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]


def known_density(density: float, knowledge: float) -> float:
    """The density of an update whose task the base knows at ``knowledge``: d + (1 − d) · k."""
    return density + (1 - density) * knowledge


def trim(delta: torch.Tensor, density: float) -> torch.Tensor:
    """Keep the ``density`` share of entries largest in magnitude (TIES's trim step)."""
    if density >= 1 or delta.numel() == 0:
        return delta
    return delta * largest(delta, density)


@merge_method(
    name="knowledge_weighted",
    pretty_name="Knowledge-weighted",
    reference_url="https://arxiv.org/abs/2601.06672",
    contract=InputContract(base=BasePolicy.REQUIRED),
)
def knowledge_weighted(
    group: TensorGroup,
    knowledge: PerNonBase[Knowledge],
    weight: PerNonBase[NonNegative] = 1.0,
    temperature: Positive = DEFAULT_TEMPERATURE,
    scale: float = 1.0,
    ties: bool = DEFAULT_TIES,
    density: PerNonBase[Fraction] = DEFAULT_DENSITY,
    density_by_knowledge: bool = DEFAULT_DENSITY_BY_KNOWLEDGE,
) -> torch.Tensor:
    base, experts = group.base.tensor, group.non_base
    if not experts:
        return base
    w = knowledge_weights(knowledge.values_for(experts), temperature, weight.values_for(experts)).to(base.dtype)
    if not ties:
        merged = base.clone()
        for w_i, expert in zip(w.tolist(), experts):
            merged.add_(expert.tensor - base, alpha=scale * w_i)
        return merged

    densities = density.values_for(experts)
    if density_by_knowledge:
        densities = [known_density(d, k) for d, k in zip(densities, knowledge.values_for(experts))]
    deltas = torch.stack([trim(e.tensor - base, d) for e, d in zip(experts, densities)])
    return base + scale * elected(deltas, w)
