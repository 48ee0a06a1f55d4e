"""Merging and scoring many small merges in memory, without writing checkpoints.

Each model of a pool is kept as its update: only the tensors that differ from the
base (an adapter: its factors, each tensor formed when a merge reads it). A merge touches just the tensors some member changed (mergekit's
``merge_tensors``, any registered method); every other tensor of the result is the
base's, which is what any merge method returns when all its inputs are the base.
The merged tensors are patched into one loaded base module (``sources.patched``), scored, and restored.

mergekit's magnitude trimming (TIES's) keeps each tensor's top values by a selection instead of
its full sort (``selected_magnitudes``): the same mask, ~8× faster on a 1M-value tensor, where the
sort was most of a TIES trial's time (knowledge_weighted trims this way already).

After each patched pass the freed heap goes back to the system (``sources.heap.release_freed_memory``, called by
``Scorer.patch``): glibc keeps what a merge's tensors freed, and on a pool of LoRA experts that grew
to gigabytes.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

import torch

from mergekit_mergeability.rehearsal import planned
from mergekit_mergeability.errors import UserError
from mergekit_mergeability.sources import Source, TensorReader, tensors

Update = Mapping[str, torch.Tensor]  # tensor name -> the model's full tensor, for changed tensors only


def load_update(base: TensorReader, source: Source, name: str) -> Update:
    """A model's changed tensors; an adapter's are its targets, each formed (base + ΔW) when a merge reads it."""
    model = tensors(source)
    known = model.known_update()
    if known is not None:
        return known
    missing = set(base.index) - set(model.index)
    if missing:
        raise UserError(
            f"model {name}: tensor {sorted(missing)[0]} of the base is missing; pools share one architecture"
        )
    return {t: model[t] for t in base.index if not torch.equal(model[t], base[t])}


def merge_updates(
    base: TensorReader,
    updates: Mapping[str, Update],
    method: str,
    parameters: Mapping[str, Any],
    per_model: Mapping[str, Mapping[str, Any]],
) -> Dict[str, torch.Tensor]:
    """Merge the members' updates with ``method``; returns only the tensors that differ from the base."""
    from mergekit.merge_methods import merge_tensors

    members = list(updates)
    ids = ["__base__", *members]
    merged = {}
    with selected_magnitudes(), planned.shared_masks():  # plan's candidates prune the same updates again
        for name in sorted(set().union(*(u.keys() for u in updates.values()))):
            reference = base[name]
            tensors = [reference, *(updates[m].get(name, reference) for m in members)]
            merged[name] = merge_tensors(
                tensors,
                method,
                ids=ids,
                base_index=0,
                parameters=_parameters(parameters, per_model, members),
                name=name,
            )
    return merged


def top_magnitudes(tensor: torch.Tensor, density: float, rescale_norm: Optional[Any] = None) -> torch.Tensor:
    """mergekit's ``sparsify.magnitude`` (keep the ``density`` share of largest |values|, rescaled
    as mergekit rescales), the entries found by one selection (``maths.merging.largest``)
    rather than a full sort: the same mask but where values tie at the threshold."""
    from mergekit import sparsify

    from mergekit_mergeability.maths.merging import largest

    if density >= 1:
        return tensor
    if density <= 0 or tensor.numel() == 0:
        return torch.zeros_like(tensor)
    return sparsify.rescaled_masked_tensor(tensor, largest(tensor, density).to(tensor.dtype), rescale_norm)


@contextlib.contextmanager
def selected_magnitudes() -> Iterator[None]:
    """mergekit's magnitude trimming through ``top_magnitudes`` while the block runs (mergekit's
    ``sparsify`` looks the function up by name on each call); restored afterwards."""
    from mergekit import sparsify

    original, sparsify.magnitude = sparsify.magnitude, top_magnitudes
    try:
        yield
    finally:
        sparsify.magnitude = original


def _parameters(
    shared: Mapping[str, Any], per_model: Mapping[str, Mapping[str, Any]], members: Sequence[str]
) -> Dict[str, Any]:
    keys = {k for m in members for k in per_model.get(m, {})}
    values: Dict[str, Any] = {k: v for k, v in shared.items() if k not in keys}
    for key in keys:
        values[key] = {
            m: per_model.get(m, {}).get(key, shared.get(key))
            for m in members
            if key in per_model.get(m, {}) or key in shared
        }
    return values
