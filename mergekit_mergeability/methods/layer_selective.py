"""Merge only where representations are shared (One Model to Translate Them All?,
arXiv 2604.02881; the layer ablation of arXiv 2510.10977).

    layer ℓ < cutoff        →  inner(θ_1..θ_n)          (task_arithmetic, linear or ties)
    layer ℓ ≥ cutoff, head  →  θ_upper                   (one source model, unchanged)
    embeddings              →  inner(...) or θ_upper     (``embeddings: merge | upper``)

cutoff = number of layers merges everything, head included (= the inner method).

θ_upper is the model marked ``upper: true``, else the base model. With the
target-language expert marked ``upper`` this is paper 3's layer patch; with
``inner: linear`` and per-model weights it interpolates only the lower layers.
"""

from __future__ import annotations

from typing import List, Literal

import torch
from mergekit import merge_methods
from mergekit.merge_methods import BasePolicy, InputContract, PerInput, TensorEntry, TensorGroup, merge_method
from mergekit.merge_methods.base import FunctionalGroupMergeMethod
from pydantic import Field
from typing_extensions import Annotated

from mergekit_mergeability.sources.architecture import num_layers as depth_of, tensor_position
from mergekit_mergeability.errors import UserError

INNER_NEEDS_BASE = {"task_arithmetic": True, "ties": True, "linear": False}
Inner = Literal["task_arithmetic", "linear", "ties"]


def _upper_source(entries, upper, has_base: bool, where: str):
    """The one model marked ``upper``, else the base; a UserError otherwise."""
    marked = [entry for entry in entries if upper(entry)]
    if len(marked) > 1:
        raise UserError(f"layer_selective ({where}): only one model may set upper: true; got {len(marked)}")
    if not marked and not has_base:
        raise UserError(f"layer_selective ({where}): mark one model with upper: true, or set base_model")
    return marked[0] if marked else None


@merge_method(
    name="layer_selective",
    pretty_name="Layer-selective",
    reference_url="https://arxiv.org/abs/2604.02881",
    contract=InputContract(base=BasePolicy.OPTIONAL),
)
def layer_selective(
    group: TensorGroup,
    cutoff: Annotated[int, Field(ge=0)],
    inner: Inner = "task_arithmetic",
    weight: PerInput[float] = 1.0,
    density: PerInput[Annotated[float, Field(gt=0, le=1)]] = 1.0,
    upper: PerInput[bool] = False,
    embeddings: Literal["merge", "upper"] = "merge",
    num_layers: Annotated[int, Field(ge=0)] = 0,
) -> torch.Tensor:
    """``num_layers`` (the model depth; 0 = unknown) is filled in from the config or the state dicts."""
    name = group.metadata.name
    if name is None:
        raise UserError("layer_selective needs tensor names (pass name= to merge_tensors)")
    source: TensorEntry = (
        _upper_source(group.entries, lambda e: upper[e.id], group.base is not None, name) or group.base
    )
    position = tensor_position(name)
    from_upper = (
        (position.part == "head" and not 0 < num_layers <= cutoff)
        or (position.part == "layer" and position.layer >= cutoff)
        or (position.part == "embedding" and embeddings == "upper")
    )
    if from_upper:
        return source.tensor
    if INNER_NEEDS_BASE[inner] and group.base is None:
        raise UserError(f"layer_selective: inner: {inner} needs base_model ({name})")
    method = merge_methods.get(inner)
    given = {"weight": dict(weight), "density": dict(density)}
    parameters = {p.name: given[p.name] for p in method.spec.parameters if p.name in given}
    (merged,) = method((group,), parameters=parameters)
    return merged


def check_config(views: List) -> None:
    for view in views:
        cutoff, inner = view.shared["cutoff"], view.shared["inner"]
        if cutoff > view.depth:
            raise UserError(
                f"layer_selective ({view.where}): cutoff {cutoff} is beyond the model's {view.depth} layers; "
                f"use 0..{view.depth} ({view.depth} merges every layer)"
            )
        _upper_source(view.per_model, lambda m: view.per_model[m]["upper"], view.base_model is not None, view.where)
        if INNER_NEEDS_BASE[inner] and view.base_model is None:
            raise UserError(f"layer_selective ({view.where}): inner: {inner} needs base_model")


class _LayerSelective(FunctionalGroupMergeMethod):
    """Knows the depth when whole state dicts are merged in memory (the head depends on it)."""

    def _bind_parameters(self, groups, parameters):
        if "num_layers" not in parameters:
            parameters = {**parameters, "num_layers": depth_of(g.metadata.name for g in groups if g.metadata.name)}
        return super()._bind_parameters(groups, parameters)

    check_config = staticmethod(check_config)


layer_selective = _LayerSelective(layer_selective.spec, layer_selective.implementation)
